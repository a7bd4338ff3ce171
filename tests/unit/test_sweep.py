"""An experiment's `sweep:` section expanded into its jobs, and every bad axis refused
before any job exists, naming it (jobconfig/sweep.py)."""

import math

import pytest

from common.config import ConfigError
from jobconfig import load_config_file
from jobconfig.sweep import MAX_EXPERIMENT_JOBS, plan_sweep
from tests.helpers import EXAMPLE

#: Four integer keys of every job's `policy.learn` section (grid axes in the tests).
KEYS_4 = ("batch_size", "num_batches", "publish_every_iters", "checkpoint_every_iters")

BASE = load_config_file(EXAMPLE)  # examples/cartpole_dqn.yaml


def with_sweep(sweep):
    return {**BASE, "sweep": sweep}


def test_list_axes_make_a_grid_and_each_point_runs_once_a_seed():
    lrs, decays = [0.001, 0.0023], [1000, 2000, 3000]
    sweep, jobs = plan_sweep(
        with_sweep(
            {
                "seeds": 5,
                "axes": {"policy.learn.learning_rate": lrs, "policy.other.eps.decay": decays},
            }
        )
    )
    assert len(jobs) == 2 * 3 * 5 and sweep.seeds == (0, 1, 2, 3, 4)
    seen = {
        (p.values["policy.learn.learning_rate"], p.values["policy.other.eps.decay"], p.seed)
        for p, _ in jobs
    }
    assert seen == {(lr, d, s) for lr in lrs for d in decays for s in range(5)}
    point, config = jobs[7]
    assert config["policy"]["learn"]["learning_rate"] == point.values["policy.learn.learning_rate"]
    assert config["system"]["seed"] == point.seed
    assert config["policy"]["learn"]["batch_size"] == 64  # the rest as the base has it
    assert "sweep" not in config


def test_ranges_are_drawn_samples_times_crossed_with_the_grid_reproducibly():
    sweep_section = {
        "seeds": [3, 7],
        "samples": 4,
        "draw_seed": 11,
        "axes": {
            "policy.learn.learning_rate": {"log_uniform": [1e-4, 1e-2]},
            "policy.learn.batch_size": {"uniform": [32, 256]},  # an integer key: integers
            "policy.nstep": [1, 3],
        },
    }
    _, jobs = plan_sweep(with_sweep(sweep_section))
    assert len(jobs) == 2 * 4 * 2
    values = [p.values for p, _ in jobs]
    assert all(1e-4 <= v["policy.learn.learning_rate"] <= 1e-2 for v in values)
    assert all(isinstance(v["policy.learn.batch_size"], int) for v in values)
    assert all(32 <= v["policy.learn.batch_size"] <= 256 for v in values)
    draws = {(v["policy.learn.learning_rate"], v["policy.learn.batch_size"]) for v in values}
    assert len(draws) == 4  # the same 4 draws for each nstep and each seed
    logs = sorted(math.log10(lr) for lr, _ in draws)
    assert logs[-1] - logs[0] > 0.2  # spread on the log scale
    _, again = plan_sweep(with_sweep(sweep_section))
    assert [p.values for p, _ in again] == values  # the same draws from the same draw_seed


@pytest.mark.parametrize(
    ("sweep", "field", "says"),
    [
        (
            {"axes": {"policy.learn.learning_rat": [0.1]}},
            "sweep.axes.policy.learn.learning_rat",
            "did you mean 'learning_rate'",
        ),
        ({"axes": {"policy.nope.x": [1]}}, "sweep.axes.policy.nope.x", "no such key"),
        ({"axes": {"policy.type": {"uniform": [0, 1]}}}, "sweep.axes.policy.type", "not a number"),
        (
            {"axes": {"policy.learn.learning_rate": {"uniform": ["a", 1]}}},
            "sweep.axes.policy.learn.learning_rate",
            "two finite numbers",
        ),
        (
            {"axes": {"policy.learn.learning_rate": {"log_uniform": [0, 1]}}},
            "sweep.axes.policy.learn.learning_rate",
            "above 0",
        ),
        (
            {"axes": {"policy.learn.learning_rate": {"uniform": [1, 0.5]}}},
            "sweep.axes.policy.learn.learning_rate",
            "below high",
        ),
        (
            {"axes": {"policy.learn.learning_rate": {"gaussian": [0, 1]}}},
            "sweep.axes.policy.learn.learning_rate",
            "a list of values, or a range",
        ),
        (
            {"axes": {"policy.learn.learning_rate": []}},
            "sweep.axes.policy.learn.learning_rate",
            "at least one value",
        ),
        ({"axes": {"system.seed": [1, 2]}}, "sweep.axes.system.seed", "sweep.seeds"),
        ({"seeds": 0}, "sweep.seeds", "between 1"),
        ({"seeds": [1, 1]}, "sweep.seeds", "twice"),
        ({"seeds": "5"}, "sweep.seeds", "a count of seeds"),
        ({"parallel": 0}, "sweep.parallel", "at least 1"),
        ({"sample": 3}, "sweep.sample", "unknown key"),
        ({"seeds": MAX_EXPERIMENT_JOBS, "axes": {"policy.nstep": [1, 2]}}, "sweep", "at most"),
        # A value its config class refuses, in one point: named with the point.
        (
            {"axes": {"policy.learn.learning_rate": [0.001, -1.0]}},
            "policy.learn.learning_rate",
            "learning_rate=-1",
        ),
    ],
)
def test_a_bad_sweep_is_refused_naming_what_is_wrong(sweep, field, says):
    with pytest.raises(ConfigError) as refused:
        plan_sweep(with_sweep(sweep))
    assert refused.value.field == field
    assert says in refused.value.message, refused.value.message


def test_a_config_without_a_sweep_is_no_experiment():
    with pytest.raises(ConfigError, match="sweep section"):
        plan_sweep(BASE)


def test_drover_sweep_refuses_a_bad_axis_before_it_starts_anything(tmp_path, capsys):
    from drover.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"base: {EXAMPLE}\n"
        "sweep: {seeds: 2, axes: {policy.learn.learning_rat: [0.001, 0.01]}}\n"
    )
    runs = tmp_path / "runs"
    assert main(["sweep", str(bad), "--runs-dir", str(runs)]) == 2
    said = capsys.readouterr().err
    assert "sweep.axes.policy.learn.learning_rat" in said and "learning_rate" in said
    assert not runs.exists()  # no run folder: nothing started


@pytest.mark.parametrize(
    "sweep",
    [
        {"samples": 10_000_000, "axes": {"policy.learn.learning_rate": {"uniform": [0.1, 1]}}},
        # Four 40-value axes: a grid of 2.56 million points; and one of 10^9.
        {"axes": {f"policy.learn.{k}": list(range(1, 41)) for k in KEYS_4}},
        {"axes": {f"policy.learn.{k}": list(range(1, 1001)) for k in KEYS_4[:3]}},
    ],
)
def test_a_sweep_over_the_job_limit_is_refused_without_expanding_it(sweep, monkeypatch):
    def expanded(*_):
        raise AssertionError("the sweep was expanded before it was counted")

    monkeypatch.setattr("jobconfig.sweep.expand_points", expanded)
    with pytest.raises(ConfigError) as refused:
        plan_sweep(with_sweep(sweep))
    assert refused.value.field == "sweep" and "at most 1,000" in refused.value.message
