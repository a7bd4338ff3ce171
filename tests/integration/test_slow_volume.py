"""A slow shared volume slows a job; it does not break it: with every fsync and every
read call on the shared root waiting 50 ms (a FUSE pass-through, tests/slow_volume.py),
a DQN job succeeds with every insert counted, no task fails, and no worker loses its
lease (3 s leases: heartbeats never wait on the disk). Run with `-s` to see its env
steps per second; `python bench/slow_volume.py` compares several latencies. Mounting
needs root and FUSE; the test is skipped without them."""

import pytest

from tests.slow_volume import run_job, short_job, slow_volume

pytestmark = [pytest.mark.processes, pytest.mark.chaos, pytest.mark.timeout(300)]

LATENCY_S = 0.05


def test_a_job_on_a_slow_volume_succeeds_and_no_lease_expires(tmp_path):
    with slow_volume(tmp_path / "volume", tmp_path / "backing", LATENCY_S) as root:
        run = run_job(root / "run", short_job(), timeout_s=240)
    status = run.status
    print(f"\n{LATENCY_S * 1000:.0f} ms a call: {run.env_steps_per_s:.0f} env steps/s")
    assert status.phase == "succeeded", status
    assert run.buffer["inserts"] == status.env_steps, (run.buffer, status)
    assert (status.task_failures, status.tasks_reassigned) == (0, 0), status
    assert run.lease_expiries == 0
