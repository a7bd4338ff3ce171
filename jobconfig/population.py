"""An experiment's `pbt:` section: population-based training over the jobs of its
sweep (Jaderberg et al., 2017); services/coordinator/population.py runs it.

    sweep:
      samples: 4                          # the population: every job of the sweep
      axes:
        policy.learn.learning_rate: {log_uniform: [0.0001, 0.01]}
    pbt:
      ready: 2                  # a member's evaluations between two of its steps
      quantile: 0.25            # the bottom quarter copies from the top quarter
      perturb: [0.8, 1.25]      # each listed hyperparameter times one of these
      params: [policy.learn.learning_rate]
      seed: 0                   # the seed of the donors and factors chosen

Each time a member has had `ready` evaluations since its last step, the running
members are ranked by their last evaluation's mean return; one in the bottom
`quantile` takes a top member's newest checkpoint and its values of `params` (exploit),
each multiplied by a factor drawn from `perturb` (explore; rounded for an integer key).

The parameters are what a learner reads when its task starts (`policy.learn.*`:
learning rates, loss weights, clip ratios); collectors keep the config they were
given. The size of what a learner samples (`batch_size`, `num_batches`) is not one:
the job's buffer bounds its inserts by it, from the job's start. Every job of the
population runs at once (`sweep.parallel` unset or at least the population), on a
training workflow, whose evaluations say who is better.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from common.config import ConfigError
from jobconfig.resolve import unknown_key
from jobconfig.sections import check_keys, value_at, whole_number

#: The workflows whose evaluations rank a population (a mean return, more is better).
WORKFLOWS = ("async", "sync")
#: What a perturbed parameter's key starts with: the learner reads it at task start.
LEARNER_KEYS = "policy.learn."
#: Learner keys fixed for a job's life: its buffer's rate limiter is sized by them.
SAMPLE_SIZE_KEYS = ("policy.learn.batch_size", "policy.learn.num_batches")


@dataclass(frozen=True)
class Population:
    params: tuple[str, ...]
    ready: int = 2
    quantile: float = 0.25
    perturb: tuple[float, ...] = (0.8, 1.25)
    seed: int = 0

    def record(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "params": list(self.params),
            "perturb": list(self.perturb),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Population:
        return cls(
            params=tuple(str(p) for p in record["params"]),
            ready=int(record["ready"]),
            quantile=float(record["quantile"]),
            perturb=tuple(float(f) for f in record["perturb"]),
            seed=int(record["seed"]),
        )


def parse_population(section: Any, resolved: dict[str, Any], members: int) -> Population:
    """The `pbt:` section, checked against the base config (resolved) and the number
    of jobs the sweep makes.

    Raises:
        ConfigError: naming the key at fault (`pbt.<key>`).
    """
    if not isinstance(section, dict):
        raise ConfigError("pbt", "must be a mapping (params, ready, quantile, perturb)")
    check_keys(section, {f.name for f in dataclasses.fields(Population)}, "pbt")
    workflow = resolved["system"]["workflow"]
    if workflow not in WORKFLOWS:
        raise ConfigError(
            "pbt", f"ranks members by their evaluations: system.workflow {' or '.join(WORKFLOWS)}"
        )
    if members < 2:
        raise ConfigError("pbt", f"a population needs at least 2 jobs, the sweep makes {members}")
    params = section.get("params")
    if not isinstance(params, list) or not params:
        raise ConfigError("pbt.params", "a list of dotted keys under policy.learn")
    for key in params:
        check_param(str(key), resolved)
    quantile = section.get("quantile", 0.25)
    if (
        isinstance(quantile, bool)
        or not isinstance(quantile, int | float)
        or not 0 < quantile <= 0.5
    ):
        raise ConfigError("pbt.quantile", "a fraction above 0 and at most 0.5")
    perturb = section.get("perturb", [0.8, 1.25])
    if (
        not isinstance(perturb, list)
        or not perturb
        or not all(isinstance(f, int | float) and not isinstance(f, bool) for f in perturb)
        or not all(math.isfinite(f) and f > 0 for f in perturb)
    ):
        raise ConfigError("pbt.perturb", "a list of factors above 0, such as [0.8, 1.25]")
    return Population(
        params=tuple(str(p) for p in params),
        ready=whole_number(section, "pbt", "ready", 2),
        quantile=float(quantile),
        perturb=tuple(float(f) for f in perturb),
        seed=whole_number(section, "pbt", "seed", 0, low=0),
    )


def check_param(key: str, resolved: dict[str, Any]) -> None:
    where = f"pbt.params.{key}"
    if not key.startswith(LEARNER_KEYS):
        raise ConfigError(where, f"only the learner's keys ({LEARNER_KEYS}*) change mid-job")
    if key in SAMPLE_SIZE_KEYS:
        raise ConfigError(where, "a job's buffer is sized by it when the job starts: it stays")
    why = unknown_key(key, resolved["policy"]["type"])
    if why is not None:
        raise ConfigError(where, why)
    value = value_at(resolved, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(where, "a perturbed key must hold a number")


def perturbed(value: int | float, factor: float) -> int | float:
    """`value` times `factor`; an integer stays a whole number, at least 1."""
    if isinstance(value, int):
        return max(1, round(value * factor))
    return value * factor
