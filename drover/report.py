"""`drover report`: how each config of an experiment did over its seeds, with 95%
confidence intervals (drover/stats.py), as Markdown and PNG.

    drover report runs/cartpole_dqn_lr-20261129-171500     # -> <run folder>/report/
    drover report RUN --experiment exp-... --out DIR
    drover report RUN_A RUN_B --out DIR       # configs of several run folders side by side

The runs are the jobs in a run folder (what `drover run` or `drover sweep` makes, or a
cluster's shared root). Jobs of an experiment (its record, `experiments/<id>.json`) are
grouped by their point of the sweep, every seed of a point one config; other jobs by
their name. Per config:

- runs, and how many succeeded (the job ended `succeeded`);
- the final evaluation return (the last evaluation's mean): median and IQM;
- the return's area under the curve (its mean over the env steps the run's evaluations
  span, each interval weighted by its env steps): median and IQM, which rewards
  learning early as the final return does not;
- env steps, and wall seconds, to the stop value (the first evaluation at or above
  it; over the runs that reached it): median and IQM.

`report.md` holds the table; `curves.png` each config's mean evaluation return over
env steps with its 95% band (a run that ended held at its last evaluation);
`profile.png` the performance profile of the final returns (the fraction of runs above
each return) with its band. An experiment with population-based training adds its
lineage: a table of its steps (who took whose checkpoint, at which env steps, the
hyperparameters before and after) and `lineage.png` (each member's curve with its
steps, and its hyperparameters over env steps).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.storage import SharedStore
from drover import stats
from drover.plot import PlotError, curve_of, job_dirs, read_record
from drover.say import console, error
from jobconfig.sweep import Point, short
from services.coordinator.experiments import read_experiments
from services.coordinator.state import Experiment

#: Points of the curves' common env-step grid, and of the profile's thresholds.
GRID_POINTS = 100


class ReportError(Exception):
    """What makes the report impossible, said in one line."""


@dataclass
class Run:
    job_id: str
    phase: str
    #: The last evaluation's mean return (None: never evaluated).
    final_return: float | None
    #: The mean return over the env steps its evaluations span (None: never evaluated).
    auc: float | None
    #: Env steps and wall seconds at its first evaluation at or above the stop value.
    steps_to_goal: float | None
    wall_s_to_goal: float | None
    #: Its evaluations: env steps, mean returns.
    x: np.ndarray
    y: np.ndarray


@dataclass
class Config:
    """The runs of one config: an experiment's point over its seeds, or one name."""

    label: str
    stop_value: float | None
    runs: list[Run] = field(default_factory=list)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="each config's results over its seeds, with confidence intervals (Markdown, PNG)",
    )
    parser.add_argument(
        "runs", type=Path, nargs="+", metavar="RUN", help="run folders (drover run, drover sweep)"
    )
    parser.add_argument(
        "--experiment", help="only this experiment's jobs (exp-...; default: every job)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the report's folder (default: the first RUN's report/)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        # Each folder's experiment records read once: for its labels and its lineages.
        found = {run: experiments_of(run, args.experiment) for run in args.runs}
        configs = merged([read_configs(run, args.experiment, found[run]) for run in args.runs])
        populations = [e for experiments in found.values() for e in experiments if e.population]
        out = args.out or args.runs[0] / "report"
        title = ", ".join(run.resolve().name for run in args.runs)
        written = write_report(configs, out, title=title, populations=populations)
    except (ReportError, PlotError) as exc:
        return error(str(exc))
    print(written.read_text(), end="")
    console.print(f"drover: report in {out} (report.md, curves.png, profile.png)")
    return 0


# --- reading the runs ------------------------------------------------------------------


def read_configs(
    folder: Path, experiment_id: str | None = None, experiments: list[Experiment] | None = None
) -> list[Config]:
    """The runs under `folder`, grouped into configs (the module's docstring);
    `experiments`: its experiments (`experiments_of`), when already read."""
    if experiments is None:
        experiments = experiments_of(folder, experiment_id)
    labels = experiment_labels(experiments)
    configs: dict[str, Config] = {}
    for job_dir in job_dirs(folder):
        if experiment_id is not None and job_dir.name not in labels:
            continue
        record = read_record(job_dir)
        label = labels.get(job_dir.name) or str(record.get("name") or job_dir.name)
        stop_value = record["config"]["env"].get("stop_value")
        config = configs.setdefault(label, Config(label, stop_value))
        config.runs.append(run_of(record, job_dir))
    if not configs:
        raise ReportError(f"{folder}: no jobs of experiment {experiment_id}")
    return list(configs.values())


def merged(groups: list[list[Config]]) -> list[Config]:
    """Several folders' configs as one list; a label in two folders is one config."""
    configs: dict[str, Config] = {}
    for group in groups:
        for config in group:
            if config.label in configs:
                configs[config.label].runs.extend(config.runs)
            else:
                configs[config.label] = config
    return list(configs.values())


def experiments_of(folder: Path, experiment_id: str | None) -> list[Experiment]:
    """The experiments under `folder` (only `experiment_id`, when given)."""
    experiments, unreadable = read_experiments(SharedStore(folder))
    if unreadable:
        raise ReportError(f"{folder}: an experiment's record is unreadable ({unreadable[0]})")
    chosen = [e for e in experiments if experiment_id in (None, e.experiment_id)]
    if experiment_id is not None and not chosen:
        raise ReportError(f"{folder}: no experiment {experiment_id} in it")
    return chosen


def experiment_labels(experiments: list[Experiment]) -> dict[str, str]:
    """Each experiment job's config label (its point of the sweep), by job id."""
    return {
        member.job_id: Point(member.values, member.seed).label() or experiment.name
        for experiment in experiments
        for member in experiment.jobs
    }


def run_of(record: dict[str, Any], job_dir: Path) -> Run:
    phase = str(record["phase"])
    try:
        curve = curve_of(record, job_dir, "", "env_steps")
    except PlotError:  # never evaluated
        return Run(job_dir.name, phase, None, None, None, None, np.zeros(0), np.zeros(0))
    stop_value = record["config"]["env"].get("stop_value")
    steps_to_goal = wall_to_goal = None
    if stop_value is not None:
        reached = np.nonzero(curve.y >= stop_value)[0]
        if reached.size:
            steps_to_goal = float(curve.x[reached[0]])
            # The same evaluations against wall time (which only grows with env steps).
            wall = curve_of(record, job_dir, "", "wall_s")
            wall_to_goal = float(wall.x[np.nonzero(wall.y >= stop_value)[0][0]])
    final, auc = float(curve.y[-1]), area_per_step(curve.x, curve.y)
    return Run(job_dir.name, phase, final, auc, steps_to_goal, wall_to_goal, curve.x, curve.y)


def area_per_step(x: np.ndarray, y: np.ndarray) -> float:
    """The curve's area over the env steps it spans, per env step (trapezoids between
    evaluations): its mean return over training; one evaluation's return alone."""
    span = float(x[-1] - x[0]) if x.size else 0.0
    if span <= 0:
        return float(y[-1])
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / span)


# --- writing it ------------------------------------------------------------------------


def rows(configs: list[Config]) -> list[dict[str, str]]:
    """The report's table: one row a config."""
    table = []
    for config in configs:
        finals = [r.final_return for r in config.runs if r.final_return is not None]
        areas = [r.auc for r in config.runs if r.auc is not None]
        steps = [r.steps_to_goal for r in config.runs if r.steps_to_goal is not None]
        walls = [r.wall_s_to_goal for r in config.runs if r.wall_s_to_goal is not None]
        n = len(config.runs)
        row = {
            "config": config.label,
            "runs": str(n),
            "succeeded": f"{sum(r.phase == 'succeeded' for r in config.runs)}/{n}",
            "final return, median": _est(finals, stats.median),
            "final return, IQM": _est(finals, stats.iqm),
            "return AUC, median": _est(areas, stats.median),
            "return AUC, IQM": _est(areas, stats.iqm),
        }
        if config.stop_value is not None:
            row |= {
                "reached the stop value": f"{len(steps)}/{n}",
                "env steps to it, median": _est(steps, stats.median, 0),
                "env steps to it, IQM": _est(steps, stats.iqm, 0),
                "wall s to it, IQM": _est(walls, stats.iqm, 1),
            }
        table.append(row)
    return table


def _est(values: list[float], statistic: Any, digits: int = 1) -> str:
    return stats.estimate(values, statistic).text(digits) if values else "-"


def write_report(
    configs: list[Config],
    out: Path,
    *,
    title: str,
    populations: list[Experiment] | None = None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    table = rows(configs)
    columns = list(dict.fromkeys(key for row in table for key in row))
    stop_values = {c.stop_value for c in configs}
    lines = [
        f"# {title}",
        "",
        f"{sum(len(c.runs) for c in configs)} runs of {len(configs)} configs. Each figure: "
        f"the statistic over the config's runs [its {stats.CONFIDENCE:.0%} bootstrap "
        f"confidence interval, {stats.RESAMPLES} resamples]; IQM: the mean of the middle "
        "50% of runs. Intervals that do not overlap say a difference is real; overlapping "
        "ones say these runs cannot tell.",
        "",
    ]
    if stop_values != {None}:
        lines += [f"Stop value: {', '.join(str(v) for v in sorted(stop_values, key=str))}.", ""]
    lines += [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(row.get(c, "-") for c in columns) + " |" for row in table),
        "",
        "![curves](curves.png)",
        "",
        "![profile](profile.png)",
        "",
    ]
    runs = {run.job_id: run for config in configs for run in config.runs}
    populations = populations or []
    for experiment in populations:
        image = lineage_image(experiment, populations)
        lines += lineage_lines(experiment, image)
        draw_lineage(experiment, runs, out / image)
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    draw(configs, out)
    return report


# --- population-based training -----------------------------------------------------------


def lineage_image(experiment: Experiment, populations: list[Experiment]) -> str:
    only = len(populations) == 1
    return "lineage.png" if only else f"lineage-{experiment.experiment_id}.png"


def lineage_lines(experiment: Experiment, image: str) -> list[str]:
    """The Markdown of an experiment's population steps."""
    lines = [
        f"## Population-based training: {experiment.name} ({experiment.experiment_id})",
        "",
        f"{len(experiment.lineage)} steps: each, a member behind took a better member's "
        "newest checkpoint and perturbed its hyperparameters.",
        "",
    ]
    if experiment.lineage:
        lines += [
            "| env steps | member (return) | took from (return) | checkpoint | hyperparameters |",
            "|---|---|---|---|---|",
        ]
        for step in experiment.lineage:
            changes = ", ".join(
                f"{key.rsplit('.', 1)[-1]} {short(step.before[key])} -> {short(value)}"
                for key, value in step.after.items()
            )
            lines.append(
                f"| {step.env_steps:,} | {step.job_id} ({step.eval_return:.1f}) | "
                f"{step.donor_id} ({step.donor_return:.1f}) | {step.checkpoint or '-'} | "
                f"{changes} |"
            )
        lines.append("")
    return [*lines, f"![lineage]({image})", ""]


def draw_lineage(experiment: Experiment, runs: dict[str, Run], path: Path) -> None:
    """Each member's curve with the steps it took (a dashed line from the donor's
    point, where it took its checkpoint), and each perturbed hyperparameter over env
    steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert experiment.population is not None
    params = experiment.population.params
    colors = plt.get_cmap("tab10")
    color = {m.job_id: colors(i % 10) for i, m in enumerate(experiment.jobs)}
    fig, axes = plt.subplots(
        1 + len(params), 1, figsize=(8, 4 + 2.5 * len(params)), dpi=100, sharex=True
    )
    curves = axes[0]
    for member in experiment.jobs:
        run = runs.get(member.job_id)
        if run is not None and run.x.size:
            curves.plot(run.x, run.y, color=color[member.job_id], label=member.job_id)
    for step in experiment.lineage:
        # From where the donor was, to where the member goes on from.
        curves.plot(
            [step.donor_env_steps, step.env_steps],
            [step.donor_return, step.donor_return],
            color=color.get(step.donor_id, "grey"),
            linestyle="--",
            linewidth=1,
        )
        member = color.get(step.job_id, "grey")
        curves.plot(step.env_steps, step.eval_return, "v", color=member)
        curves.vlines(step.env_steps, step.eval_return, step.donor_return, colors=member, lw=0.5)
    curves.set_ylabel("evaluation return")
    curves.set_title(f"{experiment.name}: members, and the checkpoints they took (dashed)")
    curves.legend(fontsize="small")
    for ax, key in zip(axes[1:], params, strict=True):
        for member in experiment.jobs:
            # Its value at the start: its point's, or (not an axis of the sweep) what
            # its first step found it at.
            first = next(
                (s.before[key] for s in experiment.lineage if s.job_id == member.job_id), None
            )
            xs, ys = [0.0], [member.values.get(key, first)]
            for step in experiment.lineage:
                if step.job_id == member.job_id:
                    xs.append(step.env_steps)
                    ys.append(step.after[key])
            run = runs.get(member.job_id)
            xs.append(float(run.x[-1]) if run is not None and run.x.size else xs[-1])
            ys.append(ys[-1])
            if ys[0] is not None:
                ax.step(xs, ys, where="post", color=color[member.job_id])
        ax.set_ylabel(key.rsplit(".", 1)[-1])
        if key.endswith("learning_rate"):
            ax.set_yscale("log")
    axes[-1].set_xlabel("env steps")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw(configs: list[Config], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, config in enumerate(configs):
        # Over every run's span, a run that ended held at its last evaluation (and each
        # before its first at its first): a run that reached its goal early still counts.
        runs = [r for r in config.runs if r.x.size]
        if not runs:
            continue
        start, stop = min(r.x[0] for r in runs), max(r.x[-1] for r in runs)
        if stop <= start:
            continue
        grid = np.linspace(start, stop, GRID_POINTS)
        curves = np.stack([np.interp(grid, r.x, r.y) for r in runs])
        mean, low, high = stats.mean_band(curves)
        ax.plot(grid, mean, color=colors(i % 10), label=f"{config.label} ({len(runs)} runs)")
        ax.fill_between(grid, low, high, color=colors(i % 10), alpha=0.2)
    stop_values = {c.stop_value for c in configs if c.stop_value is not None}
    for value in stop_values:
        ax.axhline(value, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return (mean over episodes)")
    ax.set_title("mean evaluation return, 95% bootstrap band over runs")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "curves.png")
    plt.close(fig)

    finals = {
        c.label: [r.final_return for r in c.runs if r.final_return is not None] for c in configs
    }
    every = [v for values in finals.values() for v in values]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    if every:
        thresholds = np.linspace(min(every), max(every), GRID_POINTS)
        for i, (label, values) in enumerate(finals.items()):
            if not values:
                continue
            fraction, low, high = stats.profile(values, thresholds)
            ax.step(thresholds, fraction, where="post", color=colors(i % 10), label=label)
            ax.fill_between(thresholds, low, high, step="post", color=colors(i % 10), alpha=0.2)
    ax.set_xlabel("final evaluation return (tau)")
    ax.set_ylabel("fraction of runs above tau")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("performance profile, 95% bootstrap band over runs")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out / "profile.png")
    plt.close(fig)
