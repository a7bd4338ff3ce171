"""An experiment's config: one parser for its three sections. A `sweep:` section makes
it the jobs of a grid or draws (jobconfig/sweep.py), with a `pbt:` section beside it
one population training together (jobconfig/population.py); a `tune:` section makes it
an Optuna study whose trials are its jobs (jobconfig/tuning.py). The coordinator runs
either (`POST /api/v1/experiments`); `drover sweep` and `drover tune` submit them.

    plan = plan_experiment(raw)
    plan.kind        # "sweep" or "tune"
    plan.points      # a sweep's jobs: (point, config) each
    plan.tuning      # a tuning's study, its trials' base config `plan.base`
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from common.config import ConfigError
from jobconfig.sections import split_section
from jobconfig.sweep import MAX_EXPERIMENT_JOBS, Point, Sweep, plan_sweep
from jobconfig.tuning import Tuning, plan_tuning

#: The sections that make a config an experiment.
SECTIONS = ("sweep", "pbt", "tune")


@dataclass(frozen=True)
class ExperimentPlan:
    kind: Literal["sweep", "tune"]
    #: The config without its experiment sections.
    base: dict[str, Any]
    #: A sweep's: the sweep, and each of its jobs' point and config.
    sweep: Sweep | None = None
    points: list[tuple[Point, dict[str, Any]]] = field(default_factory=list)
    #: A tuning's study (its jobs are made as its trials come).
    tuning: Tuning | None = None


def plan_experiment(raw: dict[str, Any], max_jobs: int = MAX_EXPERIMENT_JOBS) -> ExperimentPlan:
    """The experiment a config's sections ask for, everything checked.

    Raises:
        ConfigError: no experiment section, sections that do not go together, or
            what the section's own parser refuses (named by its field).
    """
    if "tune" in raw:
        for other in ("sweep", "pbt"):
            if other in raw:
                raise ConfigError(
                    other, "a tuning's trials are its jobs: a config has tune: or sweep:, not both"
                )
        tuning, base = plan_tuning(raw)
        if tuning.n_trials > max_jobs:
            raise ConfigError(
                "tune.n_trials", f"{tuning.n_trials} trials exceed the limit of {max_jobs} jobs"
            )
        return ExperimentPlan(kind="tune", base=base, tuning=tuning)
    if "sweep" not in raw:
        raise ConfigError(
            "sweep", "an experiment's config needs a sweep: section (axes, seeds) or a tune: one"
        )
    sweep, points = plan_sweep(raw, max_jobs)
    base = raw
    for name in SECTIONS:
        base, _ = split_section(base, name)
    return ExperimentPlan(kind="sweep", base=base, sweep=sweep, points=points)
