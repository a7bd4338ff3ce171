"""`drover plot`: evaluation return against env steps (or wall time, or train
iterations) of the jobs in run folders, as a PNG; for self-play jobs, the win rate
against a baseline or the policy's rating (`--y win_rate --vs heuristic`, `--y rating`).

    drover plot runs/cartpole_dqn-20261122-122710                # -> <run folder>/returns.png
    drover plot runs/cartpole_dqn-* runs/cartpole_ppo-* --out cartpole.png
    drover plot runs/connect_four_selfplay-* --y win_rate --vs heuristic

Where the evaluations are: a job's durable record, `<job_id>/coordinator/record.json`
(services/coordinator/snapshot.py), which the coordinator writes at submission and on
every phase change, so a finished job's record holds every evaluation (`evals`, each an
`EvalSummary`). A running job's newest snapshot (`coordinator/state.json`, every few
seconds) is read instead of its record. Only JSON is read.

Jobs with the same label (the job's name, `exp_name` for `drover run`, unless `--label`
says otherwise) are one experiment, e.g. several seeds: their curves are thin lines,
and their mean is drawn with a band from the lowest to the highest, over the x range
that every one of them covers (each interpolated linearly between its evaluations).
"""

from __future__ import annotations

import argparse
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.messages import EvalSummary, MetricsPoint, parse, win_rate
from common.storage import CorruptFileError, SharedStore
from drover.say import error
from services.coordinator.snapshot import read_job_record, record_path, state_path

#: The x axes, by `--x` value.
X_AXES = {
    "env_steps": "env steps",
    "wall_s": "wall time since the job started (s)",
    "train_iter": "train iterations",
}
#: The y axes, by `--y` value: evaluation return, or a self-play job's battle
#: evaluations (the win rate against `--vs`, draws counting half; the learning
#: policy's rating when each came in).
Y_AXES = {
    "return": "evaluation return (mean over episodes)",
    "win_rate": "win rate against {vs} (draws count half)",
    "rating": "rating of the learning policy (openskill mu - 3 sigma)",
}
#: The figure's size: 8 x 5 inches at 100 dots an inch, 800 x 500 pixels.
FIGURE_SIZE_IN = (8.0, 5.0)
FIGURE_DPI = 100
#: Where an experiment's mean and band are computed.
GRID_POINTS = 200
#: Title lines wrap at this many characters.
TITLE_WIDTH = 90
#: The output when the jobs are not all in one run folder (in the working directory).
DEFAULT_NAME = "returns.png"


class PlotError(Exception):
    """What makes the plot impossible, said in one line."""


@dataclass(frozen=True)
class Curve:
    """One job's evaluations, sorted by x."""

    label: str
    job_dir: Path
    env_id: str
    algo: str
    stop_value: float | None
    x: np.ndarray
    y: np.ndarray


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `drover plot` on the CLI's subparsers."""
    parser = sub.add_parser(
        "plot",
        help="plot evaluation return vs env steps of run or job folders, as a PNG",
        description="Plot evaluation return of finished (or running) jobs and print the "
        "PNG's path. Jobs with the same name (e.g. seeds of one experiment) are drawn "
        "as their mean with a min-max band.",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="RUN_OR_JOB",
        help="a run folder (what `drover run` makes) or a job folder in one",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"the image to write (.png, or .pdf/.svg); default: returns.png in the run "
        f"folder when every job is in one run folder, else {DEFAULT_NAME} here",
    )
    parser.add_argument(
        "--x", choices=list(X_AXES), default="env_steps", help="the x axis (env_steps)"
    )
    parser.add_argument(
        "--y",
        choices=list(Y_AXES),
        default="return",
        help="the y axis: evaluation return, or a self-play job's win rate (against "
        "--vs) or rating",
    )
    parser.add_argument(
        "--vs",
        default="heuristic",
        metavar="BASELINE",
        help="--y win_rate: the baseline (default: heuristic)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=None,
        help="a legend label for each RUN_OR_JOB, in their order (default: the job's "
        "name); inputs with the same label are one experiment",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """`drover plot`: 0 with the image's path on stdout, or 2 with an error line."""
    try:
        out = plot(
            [Path(p) for p in args.paths],
            out=args.out,
            x_axis=args.x,
            labels=args.label,
            y_axis=args.y,
            vs=args.vs,
        )
    except PlotError as exc:
        return error(str(exc))
    print(out, flush=True)
    return 0


def plot(
    paths: list[Path],
    *,
    out: Path | None = None,
    x_axis: str = "env_steps",
    labels: list[str] | None = None,
    y_axis: str = "return",
    vs: str = "heuristic",
) -> Path:
    """Draw the evaluations of the jobs in `paths` (run or job folders) into `out`.

    Returns:
        the path written.

    Raises:
        PlotError: a path that is no run or job folder, a job without evaluations, an
            unreadable record, labels that do not match the paths, an unwritable `out`.
    """
    curves = read_curves(paths, x_axis=x_axis, labels=labels, y_axis=y_axis, vs=vs)
    if out is None:
        runs = {curve.job_dir.parent for curve in curves}
        name = DEFAULT_NAME if y_axis == "return" else f"{y_axis}.png"
        out = runs.pop() / name if len(runs) == 1 else Path(name)
    draw(curves, x_axis, out, y_label=Y_AXES[y_axis].format(vs=vs))
    return out


# --- reading -------------------------------------------------------------------------


def read_curves(
    paths: list[Path],
    *,
    x_axis: str = "env_steps",
    labels: list[str] | None = None,
    y_axis: str = "return",
    vs: str = "heuristic",
) -> list[Curve]:
    """Each job's curve, labelled by `labels` (one a path) or else by the job's name."""
    if labels is not None and len(labels) != len(paths):
        raise PlotError(
            f"--label given {len(labels)} times for {len(paths)} RUN_OR_JOB paths: "
            "give one for each, in their order"
        )
    curves = []
    for i, path in enumerate(paths):
        for job_dir in job_dirs(path):
            record = read_record(job_dir)
            label = labels[i] if labels is not None else str(record.get("name") or job_dir.name)
            if y_axis == "return":
                curves.append(curve_of(record, job_dir, label, x_axis))
            else:
                curves.append(battle_curve_of(record, job_dir, label, x_axis, y_axis, vs))
    return curves


def is_job_dir(path: Path) -> bool:
    return bool(path.name) and (path.parent / record_path(path.name)).is_file()


def job_dirs(path: Path) -> list[Path]:
    """The job folders `path` names: itself, or those directly inside a run folder."""
    if not path.exists():
        raise PlotError(f"{path}: no such file or folder")
    path = path.resolve()
    if is_job_dir(path):
        return [path]
    children = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
    found = [p for p in children if is_job_dir(p)]
    if not found:
        runs = any(is_job_dir(job) for run in children for job in run.iterdir() if job.is_dir())
        hint = f"; it holds run folders: name them, e.g. {path}/*" if runs else ""
        raise PlotError(
            f"{path}: not a run folder or a job folder "
            f"(no {record_path('<job_id>')} in it or under it){hint}"
        )
    return found


def read_record(job_dir: Path) -> dict[str, Any]:
    """The job's newest record: its durable one, or its newest snapshot while it runs."""
    store = SharedStore(job_dir.parent)
    job_id = job_dir.name
    try:
        record = read_job_record(store, job_id)
        if record is None:
            raise FileNotFoundError(record_path(job_id))  # gone since it was found
        if record["phase"] == "running" and store.exists(state_path(job_id)):
            record = store.read_json(state_path(job_id))["job"]
        return record
    except (OSError, ValueError, KeyError, TypeError, CorruptFileError) as exc:
        raise PlotError(f"{job_dir}: cannot read the job's record: {exc}") from None


def curve_of(record: dict[str, Any], job_dir: Path, label: str, x_axis: str) -> Curve:
    try:
        evals = [parse(EvalSummary, e) for e in record["evals"]]
        env, policy = record["config"]["env"], record["config"]["policy"]
        x = wall_seconds(record, evals) if x_axis == "wall_s" else x_values(evals, x_axis)
    except (KeyError, TypeError, ValueError) as exc:
        raise PlotError(f"{job_dir}: the job's record is not as expected: {exc}") from None
    if not evals:
        raise PlotError(
            f"{job_dir}: job {record.get('job_id')} ({record.get('phase')}) has no "
            "evaluations to plot"
        )
    return sorted_curve(label, job_dir, env, policy, env.get("stop_value"), x, evals)


def sorted_curve(
    label: str,
    job_dir: Path,
    env: dict[str, Any],
    policy: dict[str, Any],
    stop_value: float | None,
    x: np.ndarray,
    evals: list[EvalSummary],
) -> Curve:
    """The job's curve: its evaluations' `return_mean` against `x`, sorted by x."""
    order = np.argsort(x, kind="stable")
    return Curve(
        label=label,
        job_dir=job_dir,
        env_id=str(env.get("env_id")),
        algo=str(policy.get("type")),
        stop_value=stop_value,
        x=np.asarray(x, dtype=float)[order],
        y=np.array([e.return_mean for e in evals], dtype=float)[order],
    )


def battle_curve_of(
    record: dict[str, Any], job_dir: Path, label: str, x_axis: str, y_axis: str, vs: str
) -> Curve:
    """A self-play job's battle evaluations: the win rate against `vs`, or the
    learning policy's rating, at each."""
    try:
        battles = (record.get("workflow") or {}).get("battles") or []
        env, policy = record["config"]["env"], record["config"]["policy"]
        points = []
        for battle in battles:
            if y_axis == "rating":
                y = battle.get("rating")
            else:
                tally = battle["tallies"].get(vs)
                y = win_rate(tally["wins"], tally["draws"], tally["losses"]) if tally else None
            if y is not None:
                points.append((battle, float(y)))
        evals = [
            EvalSummary(
                return_mean=y,
                return_std=0.0,
                episodes=1,
                policy_version=int(b["policy_version"]),
                train_iter=int(b["train_iter"]),
                env_steps=int(b["env_steps"]),
            )
            for b, y in points
        ]
        x = wall_seconds(record, evals) if x_axis == "wall_s" else x_values(evals, x_axis)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlotError(f"{job_dir}: the job's record is not as expected: {exc}") from None
    if not evals:
        what = "a rating" if y_axis == "rating" else f"games against {vs}"
        raise PlotError(
            f"{job_dir}: job {record.get('job_id')} has no battle evaluations with {what} "
            "(--y win_rate and rating plot self-play jobs)"
        )
    stop = ((policy.get("other") or {}).get("league") or {}).get("stop") or {}
    goal = stop.get("win_rate") if y_axis == "win_rate" and stop.get("vs") == vs else None
    return sorted_curve(label, job_dir, env, policy, goal, x, evals)


def x_values(evals: list[EvalSummary], x_axis: str) -> np.ndarray:
    return np.array([getattr(e, x_axis) for e in evals], dtype=float)


def wall_seconds(record: dict[str, Any], evals: list[EvalSummary]) -> np.ndarray:
    """When each evaluation was counted, in seconds since the job started to run (past
    any wait in the queue; records of before it was kept: since its submission).

    Evaluations carry env steps, not times: each is placed at the time the job's
    metrics points (one a second) first show its env steps. A record keeps the newest
    600 points, so in a longer job an evaluation before the first kept point is placed
    on the straight line from the job's start to that point.
    """
    started = float(record.get("running_since") or record["started_at"])
    points = [parse(MetricsPoint, p) for p in record["metrics"]]
    steps = [0, *(p.env_steps for p in points)]
    times = [0.0, *(p.t - started for p in points)]
    if record.get("finished_at") is not None:
        steps.append(int(record["env_steps"]))
        times.append(float(record["finished_at"]) - started)
    # np.interp needs increasing x: the first time each count was reached.
    known_steps: list[int] = []
    known_times: list[float] = []
    for count, t in zip(steps, times, strict=True):
        if not known_steps or count > known_steps[-1]:
            known_steps.append(count)
            known_times.append(t)
    return np.interp([e.env_steps for e in evals], known_steps, known_times)


# --- drawing -------------------------------------------------------------------------


def spread(curves: list[Curve]) -> tuple[np.ndarray, ...] | None:
    """(x grid, mean, min, max) of the curves where every one has data (from the
    largest first x to the smallest last x), each interpolated linearly between its
    evaluations; None when they do not overlap."""
    start, stop = max(c.x[0] for c in curves), min(c.x[-1] for c in curves)
    if stop <= start:
        return None
    grid = np.linspace(start, stop, GRID_POINTS)
    ys = np.stack([np.interp(grid, c.x, c.y) for c in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def title_of(curves: list[Curve]) -> str:
    """The algorithms on each env: "dqn, ppo on CartPole-v1; dqn on Pong-v5"."""
    algos: dict[str, dict[str, None]] = {}
    for c in curves:
        algos.setdefault(c.env_id, {})[c.algo] = None
    title = "; ".join(f"{', '.join(a)} on {env_id}" for env_id, a in algos.items())
    return textwrap.fill(title, TITLE_WIDTH)


def draw(curves: list[Curve], x_axis: str, out: Path, *, y_label: str = Y_AXES["return"]) -> None:
    """One figure, one colour an experiment; written atomically to `out`."""
    # Imported here: only `drover plot` needs matplotlib. A bare Figure renders with
    # Agg and sets no global backend (no display, no pyplot state).
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    fmt = (out.suffix[1:] or "png").lower()
    if fmt not in fig.canvas.get_supported_filetypes():
        raise PlotError(f"--out {out}: cannot write .{fmt} files (use .png, .pdf or .svg)")
    ax = fig.add_subplot()
    experiments: dict[str, list[Curve]] = {}
    for curve in curves:
        experiments.setdefault(curve.label, []).append(curve)
    colors = matplotlib.color_sequences["tab10"]
    color_of = {label: colors[i % len(colors)] for i, label in enumerate(experiments)}
    for label, members in experiments.items():
        draw_experiment(ax, label, members, color_of[label])
    # Each goal once: grey, or its experiment's colour when only that one has it.
    goals: dict[float, list[str]] = {}
    for label, members in experiments.items():
        if members[0].stop_value is not None:
            goals.setdefault(members[0].stop_value, []).append(label)
    for stop_value, labels in goals.items():
        own = len(goals) > 1 and len(labels) == 1
        ax.axhline(
            stop_value,
            color=color_of[labels[0]] if own else "0.3",
            linestyle="--",
            linewidth=1,
            label=f"stop_value {stop_value:g}" + (f" ({labels[0]})" if own else ""),
        )
    ax.set_title(title_of(curves))
    ax.set_xlabel(X_AXES[x_axis])
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    # Written whole, then renamed: a viewer never shows half an image.
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(tmp, "wb") as f:
                fig.savefig(f, format=fmt)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise PlotError(f"--out {out}: cannot write it: {exc}") from None


def draw_experiment(ax: Any, label: str, members: list[Curve], color: Any) -> None:
    """One job: its line, a marker at each evaluation. Several: each a thin line, and
    their mean with a min-max band where they overlap."""
    band = spread(members) if len(members) > 1 else None
    if band is None:
        for i, c in enumerate(members):
            ax.plot(c.x, c.y, color=color, marker="o", markersize=3, label=None if i else label)
        return
    for c in members:
        ax.plot(c.x, c.y, color=color, alpha=0.35, linewidth=0.8)
    grid, mean, low, high = band
    ax.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
    ax.plot(
        grid, mean, color=color, linewidth=2, label=f"{label} (mean of {len(members)}, min-max)"
    )
