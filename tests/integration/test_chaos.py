"""A seeded randomized fault run (tests/chaos.py) in the suite: every role is killed,
stopped or terminated while a job trains, the coordinator right after the submission
and right after the end. `bench/chaos.py` runs the same round over many seeds."""

import pytest

from tests.chaos import chaos_round

pytestmark = [pytest.mark.processes, pytest.mark.chaos, pytest.mark.learning]


@pytest.mark.timeout(400)
def test_random_faults_lose_nothing_acknowledged_and_succeed_once(tmp_path):
    result = chaos_round(tmp_path / "run", seed=1, max_faults=6)
    print(result)
    assert result.phase == "succeeded", result
    assert result.successes == 1, result
    assert result.inserts_lost == 0 and result.env_steps_lost == 0, result
    assert result.server_errors == 0, result
    assert result.summary_unchanged, result
