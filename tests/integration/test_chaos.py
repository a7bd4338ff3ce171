"""A seeded randomized fault run (tests/chaos.py) in the suite: every role is killed,
stopped or terminated while a job trains, the coordinator right after the submission
and right after the end, and the shared volume is filled or slowed for a while (a
tmpfs served through a FUSE pass-through: root). `bench/chaos.py` runs the same round
over many seeds."""

import pytest

from tests.chaos import chaos_round, fault_volume

pytestmark = [pytest.mark.processes, pytest.mark.chaos, pytest.mark.learning]


@pytest.mark.timeout(400)
def test_random_faults_lose_nothing_acknowledged_and_succeed_once(tmp_path):
    with fault_volume(tmp_path / "volume") as volume:
        result = chaos_round(tmp_path / "run", seed=1, max_faults=7, volume=volume)
    print(result)
    assert any(fault.startswith("volume") for fault in result.faults), result
    assert result.phase == "succeeded", result
    assert result.successes == 1, result
    assert result.inserts_lost == 0 and result.env_steps_lost == 0, result
    assert result.server_errors == 0 and result.stale_accepted == 0, result
    assert result.summary_unchanged, result
