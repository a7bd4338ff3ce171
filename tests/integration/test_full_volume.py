"""A shared volume that fills in the middle of a job and has room again later pauses
the job; it does not end it: collectors and the learner try their writes again, the
coordinator and the buffer process keep their last good snapshots, and the job
succeeds with every acknowledged insert counted (a real tmpfs as the shared root;
mounting one needs root)."""

import json
import time

import pytest
import yaml

from bench.full_volume import stays_full
from common.config import deep_merge
from drover.local import LocalCluster
from tests.helpers import EXAMPLES, fill, tmpfs, wait_for_end, wait_until

pytestmark = [pytest.mark.processes, pytest.mark.chaos]

#: The example's DQN without a goal (its learner sets the pace: samples_per_insert),
#: 1-step transitions, so a segment's rows are its env steps.
JOB = deep_merge(
    yaml.safe_load((EXAMPLES / "cartpole_dqn.yaml").read_text()),
    {
        "env": {"stop_value": None, "n_evaluator_episode": 2},
        "policy": {"nstep": 1},
        "system": {"max_env_step": 8000},
    },
)
FULL_FOR_S = 20


@pytest.fixture
def volume(tmp_path):
    with tmpfs(tmp_path / "volume", "300m") as root:
        yield root


def test_a_volume_full_for_a_while_pauses_the_job_and_it_succeeds(volume):
    with LocalCluster(volume / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(JOB).job_id
        wait_until(lambda: cluster.client.job(job_id).train_iters > 0, 90, "training")
        filler = volume / "filler"
        fill(filler)
        full_at = time.monotonic()
        # The coordinator shows the condition: its tasks' heartbeats say they wait.
        wait_until(
            lambda: cluster.client.job(job_id).storage_full_s is not None,
            FULL_FOR_S,
            "the job's status to say it waits for room",
        )
        time.sleep(max(0.0, FULL_FOR_S - (time.monotonic() - full_at)))
        assert cluster.client.job(job_id).phase == "running"
        filler.unlink()  # room again
        status = wait_for_end(cluster, job_id, 240)
        assert status.phase == "succeeded", status
        assert status.storage_full_s is None
        # The pointer writes that found no room were kept and landed: it names the
        # newest version.
        (pointer,) = (volume / "run").rglob(f"{job_id}/policies/latest.json")
        assert json.loads(pointer.read_text())["version"] == status.policy_version
        buffer = cluster.client.buffer_stats(job_id)
        assert buffer["inserts"] == status.env_steps, (buffer, status)
        logs = "".join(p.read_text(errors="replace") for p in cluster.log_dir.glob("*.log"))
        assert "has no room for segment" in logs  # the collectors did wait for room


# --- a volume that stays full ---------------------------------------------------------

#: The same job, failing after 5 s of a full volume without progress.
SHORT_GRACE = deep_merge(JOB, {"system": {"storage_grace_s": 5, "max_env_step": 10**7}})


def test_a_volume_that_stays_full_fails_the_job_and_its_end_is_recorded_in_the_reserve(volume):
    """The coordinator's reserve of room (services/coordinator/reserve.py) is given
    back for the end's record: the job ends, durably, and a waiting client returns."""
    with LocalCluster(volume / "run", num_collectors=2) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(SHORT_GRACE).job_id
        wait_until(lambda: cluster.client.job(job_id).env_steps > 0, 90, "collection")
        fill(volume / "filler")
        full_at = time.monotonic()
        status = cluster.client.job(job_id, wait_s=0)
        while status.phase == "running" and time.monotonic() - full_at < 60:
            status = cluster.client.job(job_id, wait_s=5)
        assert status.phase == "failed", status
        assert "shared volume" in status.reason and "not yet recorded" not in status.reason
        (record,) = (volume / "run").rglob(f"{job_id}/coordinator/record.json")
        assert json.loads(record.read_text())["job"]["phase"] == "failed"
        assert not (volume / "run" / ".drover-record-reserve").exists()  # spent on it


def test_drover_run_returns_naming_the_volume_when_even_the_reserve_is_spent(tmp_path):
    """No room at all for the end's record (no reserve kept): the job's end is shown
    as not yet recorded, and `drover run` exits non-zero naming the volume instead of
    waiting for a record that cannot be written (bench/full_volume.py --stays-full)."""
    ran = stays_full(tmp_path, grace_s=5, reserve=False)
    assert ran["code"] != 0, ran
    assert "shared volume" in ran["said"] and "not yet recorded" in ran["said"], ran
    assert ran["exited_s"] < 60, ran
