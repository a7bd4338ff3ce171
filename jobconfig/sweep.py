"""An experiment's `sweep:` section: axes over config keys, expanded into its jobs.

    sweep:
      seeds: 5                  # each point run with system.seed 0..4 (or a list of seeds)
      samples: 4                # draws of the range axes (1 by default)
      draw_seed: 0              # the seed of those draws
      parallel: 2               # at most this many of its jobs run at once (None: no limit)
      axes:
        policy.learn.learning_rate: [0.001, 0.0023]        # a list: a grid axis
        policy.other.eps.decay: {uniform: [1000, 5000]}    # a range, drawn `samples` times
        policy.learn.batch_size: {log_uniform: [32, 256]}

The points are every combination of the list axes, crossed with `samples` draws of the
range axes (one value of each range axis a draw), and each point runs once a seed: the
example is 2 x 4 points x 5 seeds = 40 jobs. A range over an integer key draws integers.

Everything is checked before any job exists (`plan_sweep`): an axis over a key the
job's config does not have, a range over a key that is not a number, bounds that are
not numbers, and every expanded config resolved as a job's would be; the first fault
is a `ConfigError` naming it (`sweep.axes.<key>`, or the point and its key).

A `pbt:` section beside it makes the jobs one population that trains together
(jobconfig/population.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

from common.config import ConfigError, deep_merge, to_dict
from jobconfig.population import Population, parse_population
from jobconfig.resolve import resolve_job_config, unknown_key
from jobconfig.sections import check_keys, split_section, value_at, whole_number

#: Jobs one experiment may hold (a coordinator's `DROVER_MAX_EXPERIMENT_JOBS`).
MAX_EXPERIMENT_JOBS = 1000
#: The range kinds an axis may be.
RANGES = ("uniform", "log_uniform")


@dataclass(frozen=True)
class Axis:
    key: str
    #: A grid axis's values (None: a range).
    values: tuple[Any, ...] | None = None
    #: A range's kind (`RANGES`) and bounds.
    kind: str | None = None
    low: float = 0.0
    high: float = 0.0
    #: Draws are rounded to integers (the key's value is an integer).
    integer: bool = False


@dataclass(frozen=True)
class Sweep:
    axes: tuple[Axis, ...]
    seeds: tuple[int, ...]
    samples: int = 1
    draw_seed: int = 0
    parallel: int | None = None
    #: Population-based training over its jobs (its `pbt:` section; None: none).
    population: Population | None = None


@dataclass(frozen=True)
class Point:
    """One job of the experiment: its axes' values (by dotted key) and its seed."""

    values: dict[str, Any]
    seed: int

    def label(self) -> str:
        """The point's axis values, short: what a report's row is named by."""
        return ", ".join(f"{key.rsplit('.', 1)[-1]}={short(v)}" for key, v in self.values.items())


def short(value: Any) -> str:
    """A value as a label shows it: a float in 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plan_sweep(
    raw: dict[str, Any], max_jobs: int = MAX_EXPERIMENT_JOBS
) -> tuple[Sweep, list[tuple[Point, dict[str, Any]]]]:
    """The experiment a config with a `sweep:` section asks for: the sweep, and each
    job's point and config (the base config with the point's values and seed). Its
    job count is checked against `max_jobs` before anything is expanded or resolved.

    Raises:
        ConfigError: the section, an axis or an expanded config is invalid.
    """
    base, section = split_section(raw, "sweep")
    if section is None:
        raise ConfigError("sweep", "an experiment's config needs a sweep section (axes, seeds)")
    base, pbt = split_section(base, "pbt")
    sweep = parse_sweep(section, max_jobs)
    resolved, _ = resolve_job_config(base)  # the base alone first: its faults are its own
    sweep = dataclasses.replace(sweep, axes=checked_axes(sweep.axes, to_dict(resolved)))
    points = expand(sweep)
    if pbt is not None:
        population = parse_population(pbt, to_dict(resolved), len(points))
        if sweep.parallel is not None and sweep.parallel < len(points):
            raise ConfigError(
                "sweep.parallel",
                f"population-based training runs its {len(points)} jobs at once: "
                "leave parallel unset or make it at least that",
            )
        shaped = [a.key for a in sweep.axes if a.key.startswith("policy.model.")]
        if shaped:
            raise ConfigError(
                f"sweep.axes.{shaped[0]}",
                "a population's members take each other's checkpoints: one model for all",
            )
        sweep = dataclasses.replace(sweep, population=population)
    jobs = []
    for point in points:
        config = member_config(base, point)
        try:
            resolve_job_config(config)
        except ConfigError as exc:
            raise ConfigError(
                exc.field, f"{exc.message} (in the sweep's point {point.label() or 'base'})"
            ) from None
        jobs.append((point, config))
    return sweep, jobs


def parse_sweep(section: Any, max_jobs: int = MAX_EXPERIMENT_JOBS) -> Sweep:
    if not isinstance(section, dict):
        raise ConfigError("sweep", "must be a mapping (axes, seeds, samples, parallel)")
    check_keys(section, {"axes", "seeds", "samples", "draw_seed", "parallel"}, "sweep")
    seeds = section.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int | list):
        raise ConfigError("sweep.seeds", "a count of seeds (0..N-1) or a list of seeds")
    if isinstance(seeds, int):
        if not 1 <= seeds <= max_jobs:
            raise ConfigError("sweep.seeds", f"between 1 and {max_jobs:,}")
        seed_list = tuple(range(seeds))
    else:
        whole = [isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds]
        if not seeds or not all(whole):
            raise ConfigError("sweep.seeds", "a list of seeds must hold integers >= 0")
        if len(set(seeds)) != len(seeds):
            raise ConfigError("sweep.seeds", "a seed is listed twice")
        seed_list = tuple(seeds)
    samples = whole_number(section, "sweep", "samples", 1)
    draw_seed = whole_number(section, "sweep", "draw_seed", 0, low=0)
    parallel = section.get("parallel")
    if parallel is not None:
        parallel = whole_number(section, "sweep", "parallel", 1)
    axes_raw = section.get("axes", {})
    if not isinstance(axes_raw, dict):
        raise ConfigError("sweep.axes", "a mapping of dotted config keys to values or ranges")
    axes = tuple(parse_axis(str(key), value) for key, value in axes_raw.items())
    sweep = Sweep(axes, seed_list, samples, draw_seed, parallel)
    count = job_count(sweep)
    if count > max_jobs:
        raise ConfigError("sweep", f"{count:,} jobs: at most {max_jobs:,} an experiment")
    return sweep


def job_count(sweep: Sweep) -> int:
    """How many jobs the sweep expands to, counted without expanding it: a sweep far
    over the limit (10^7 samples, a grid of 10^9 points) costs nothing to refuse."""
    grid = math.prod(len(axis.values) for axis in sweep.axes if axis.values is not None)
    draws = sweep.samples if any(axis.kind is not None for axis in sweep.axes) else 1
    return grid * draws * len(sweep.seeds)


def parse_axis(key: str, value: Any, section: str = "sweep.axes") -> Axis:
    """An axis (or a tuning's parameter) over `key`: a list, or a range."""
    where = f"{section}.{key}"
    if isinstance(value, list):
        if not value:
            raise ConfigError(where, "a list axis needs at least one value")
        return Axis(key, values=tuple(value))
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in RANGES:
        kind, bounds = next(iter(value.items()))
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
            or not all(math.isfinite(b) for b in bounds)
        ):
            raise ConfigError(where, f"{kind}: two finite numbers, [low, high]")
        low, high = float(bounds[0]), float(bounds[1])
        if low >= high:
            raise ConfigError(where, f"{kind}: low {low:g} must be below high {high:g}")
        if kind == "log_uniform" and low <= 0:
            raise ConfigError(where, f"log_uniform: the bounds must be above 0, not {low:g}")
        return Axis(key, kind=kind, low=low, high=high)
    raise ConfigError(
        where, "a list of values, or a range: {uniform: [low, high]} or {log_uniform: [low, high]}"
    )


def checked_axes(
    axes: tuple[Axis, ...], resolved: dict[str, Any], section: str = "sweep.axes"
) -> tuple[Axis, ...]:
    """The axes, each checked against the job's resolved config: it names one of its
    keys, and a range names a number (drawn as an integer for an integer)."""
    algo = resolved["policy"]["type"]
    checked = []
    for axis in axes:
        where = f"{section}.{axis.key}"
        if axis.key == "system.seed":
            raise ConfigError(where, "the seeds are the sweep's own: sweep.seeds")
        why = unknown_key(axis.key, algo)
        if why is not None:
            raise ConfigError(where, why)
        if axis.kind is not None:
            current = value_at(resolved, axis.key)
            if isinstance(current, bool) or (
                current is not None and not isinstance(current, int | float)
            ):
                raise ConfigError(where, f"a {axis.kind} range over a key that is not a number")
            axis = dataclasses.replace(axis, integer=isinstance(current, int))
        checked.append(axis)
    return tuple(checked)


def expand_points(sweep: Sweep) -> list[dict[str, Any]]:
    """Each point's axis values: the list axes' combinations, crossed with `samples`
    draws of the range axes."""
    grid = [axis for axis in sweep.axes if axis.values is not None]
    ranges = [axis for axis in sweep.axes if axis.kind is not None]
    combos = list(itertools.product(*(axis.values or () for axis in grid)))
    rng = random.Random(sweep.draw_seed)
    draws = [{a.key: _draw(a, rng) for a in ranges} for _ in range(sweep.samples if ranges else 1)]
    return [
        {**{axis.key: value for axis, value in zip(grid, combo, strict=True)}, **draw}
        for combo in combos
        for draw in draws
    ]


def expand(sweep: Sweep) -> list[Point]:
    """Every job's point: each point's values, once a seed."""
    return [Point(values, seed) for values in expand_points(sweep) for seed in sweep.seeds]


def _draw(axis: Axis, rng: random.Random) -> float | int:
    if axis.kind == "log_uniform":
        value = math.exp(rng.uniform(math.log(axis.low), math.log(axis.high)))
    else:
        value = rng.uniform(axis.low, axis.high)
    return int(round(value)) if axis.integer else value


def member_config(base: dict[str, Any], point: Point) -> dict[str, Any]:
    """The base config with the point's values and seed."""
    override: dict[str, Any] = {"system": {"seed": point.seed}}
    for key, value in point.values.items():
        *parents, name = key.split(".")
        node = override
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return deep_merge(base, override)
