"""A tuning's `tune:` section: which keys an Optuna study searches, what it optimizes,
and how (the coordinator runs it: services/coordinator/tuning.py; `drover tune`
submits it).

    tune:
      n_trials: 24              # trials, each a drover job
      n_parallel: 2             # jobs running at once
      objective: env_steps_to_stop   # or final_return, best_return
      sampler: tpe              # or random
      pruner: median            # or successive_halving, none
      seed: 0                   # the sampler's seed; every trial's job runs system.seed
      params:
        policy.learn.learning_rate: {log_uniform: [0.0001, 0.01]}
        policy.learn.entropy_weight: {uniform: [0.0, 0.05]}
        policy.collect.n_sample: [256, 512, 1024]          # a choice

The parameters are checked as a sweep's axes are (jobconfig/sweep.py): keys of the
job's config, ranges over numbers (an integer key draws integers); the objective
`env_steps_to_stop` needs the config's `env.stop_value`. The study's storage is the
coordinator's (a SQLite file in the experiment's folder), not the section's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from common.config import ConfigError, to_dict
from jobconfig.resolve import resolve_job_config
from jobconfig.sections import check_keys, split_section, whole_number
from jobconfig.sweep import MAX_EXPERIMENT_JOBS, Axis, checked_axes, parse_axis

#: What a trial's job is scored by, and whether more is better.
OBJECTIVES = {
    "env_steps_to_stop": "minimize",
    "final_return": "maximize",
    "best_return": "maximize",
}
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "successive_halving", "none")


@dataclass(frozen=True)
class Tuning:
    params: tuple[Axis, ...]
    n_trials: int = 20
    n_parallel: int = 1
    objective: str = "env_steps_to_stop"
    sampler: str = "tpe"
    pruner: str = "median"
    seed: int = 0

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.objective]


def plan_tuning(raw: dict[str, Any]) -> tuple[Tuning, dict[str, Any]]:
    """The tuning a config with a `tune:` section asks for, and its base config.

    Raises:
        ConfigError: the section or a parameter is invalid, or the base config is.
    """
    base, section = split_section(raw, "tune")
    if not isinstance(section, dict):
        raise ConfigError("tune", "a tuning's config needs a tune section (params, n_trials)")
    check_keys(section, {f.name for f in dataclasses.fields(Tuning)}, "tune")
    params_raw = section.get("params")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ConfigError("tune.params", "a mapping of dotted config keys to ranges or choices")
    resolved, _ = resolve_job_config(base)
    params = tuple(parse_axis(str(k), v, "tune.params") for k, v in params_raw.items())
    tuning = Tuning(
        params=checked_axes(params, to_dict(resolved), "tune.params"),
        n_trials=whole_number(section, "tune", "n_trials", 20, high=MAX_EXPERIMENT_JOBS),
        n_parallel=whole_number(section, "tune", "n_parallel", 1, high=64),
        objective=_choice(section, "objective", "env_steps_to_stop", tuple(OBJECTIVES)),
        sampler=_choice(section, "sampler", "tpe", SAMPLERS),
        pruner=_choice(section, "pruner", "median", PRUNERS),
        seed=whole_number(section, "tune", "seed", 0, low=0, high=2**31 - 1),
    )
    if tuning.objective == "env_steps_to_stop" and resolved.env.stop_value is None:
        raise ConfigError(
            "tune.objective", "env_steps_to_stop needs env.stop_value (or final_return)"
        )
    return tuning, base


def _choice(section: dict[str, Any], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise ConfigError(f"tune.{key}", f"one of {', '.join(choices)}")
    return value
