"""A collector that takes every task and runs none (tests/black_hole.py), beside two
good ones, with real processes: the job keeps evaluating at its eval_freq and the bad
collector is shown held back (bench/lost_tasks.py measures it over a minute)."""

import pytest

from bench.lost_tasks import run

pytestmark = [pytest.mark.processes, pytest.mark.chaos]


def test_a_collector_that_runs_no_task_is_held_back_and_evaluations_go_on(tmp_path):
    result = run(tmp_path / "run", seconds=25.0, eval_freq=1000)
    assert result.train_iters > 500, result
    assert result.evaluations >= result.expected - 2, result
    assert result.lost_by_bad >= 1 and result.held_back_seen_s > 0, result
