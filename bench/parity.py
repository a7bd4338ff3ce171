"""drover against stable-baselines3 on MuJoCo, side by side: the same example, the same
seeds, the same evaluation, one machine, one run.

    python bench/parity.py [--rows sac-hopper,sac-halfcheetah] [--seeds 3]
        [--budget ENV_STEPS] [--collectors 2] [--out DIR] [--json PATH]

Each row is an example under `examples/mujoco/` (RL Zoo's tuned hyperparameters for
its env) run to a budget of env steps, seed by seed, on both sides in turn (drover
first on even seeds, stable-baselines3 first on odd ones, so that a drift of the
machine's speed falls on both):

- drover: `drover run EXAMPLE --collectors N` (the services: a coordinator, its buffer
  process, N collectors, a learner with its feeder), the example with `system.seed` and
  `system.max_env_step` set. Its processes' CPU is read by role while it runs.
- stable-baselines3: `python -m bench.sb3_mujoco EXAMPLE` (one process), the example's
  keys under SB3's names, evaluated as drover evaluates, written as a drover job record.

Then one `drover report` of both sides (IQM and median of the final return and of the
return's area under the curve, 95% bootstrap intervals, curves with bands) in
`<out>/<row>/report/`, and this bench's own table: env steps/s, wall seconds to the
budget and to the return stable-baselines3 reached (its median final return), the
learner's busy fraction (time in updates over wall time, bench/job_figures.py) and the
data plane's CPU (coordinator, buffer process and feeder, in cores). The whole run's
tables go to `<out>/parity.md`; `--json` keeps the figures for bench/headline.py.

Budgets: RL Zoo trains these for 1M env steps (hours a seed on a CPU); the defaults fit
a 2-core machine (SAC updates about 60-90 times a second there on either side, so
50,000 env steps are about 10-15 minutes a seed a side). `--budget` and `--seeds` run
the full ones on a bigger box.

Needs the optional extras `sb3` and `mujoco` (`make bench-parity` installs them).
Timings vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.job_figures import DATA_PLANE, CpuSampler, learner_busy_fraction  # noqa: E402
from bench.learner_scaling import cpu_line  # noqa: E402
from bench.results import checkout_commit, write_figures  # noqa: E402
from common.config import deep_merge  # noqa: E402
from jobconfig import load_config_file, resolve_job_config  # noqa: E402

EXAMPLES = ROOT / "examples" / "mujoco"


@dataclass(frozen=True)
class Row:
    """One table: an example, its budget and its evaluation cadence."""

    name: str
    example: Path
    budget: int
    eval_every_steps: int


ROWS = {
    "sac-hopper": Row("sac-hopper", EXAMPLES / "hopper_sac.yaml", 50_000, 5_000),
    "sac-halfcheetah": Row("sac-halfcheetah", EXAMPLES / "halfcheetah_sac.yaml", 50_000, 5_000),
    # A PPO evaluation every 5,000 env steps would be 100 of them: SB3 runs them in line.
    "ppo-hopper": Row("ppo-hopper", EXAMPLES / "hopper_ppo.yaml", 500_000, 25_000),
}
SIDES = ("drover", "stable-baselines3")


@dataclass
class SideRun:
    """One seed of one side, as this bench measured it."""

    seed: int
    job_dir: Path | None
    wall_s: float
    env_steps: int
    note: str = ""
    busy: float | None = None
    data_plane_cores: float | None = None

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class RowResult:
    row: Row
    runs: dict[str, list[SideRun]] = field(default_factory=lambda: {s: [] for s in SIDES})


# --- one run of each side -----------------------------------------------------------------


def seeded_example(
    row: Row, seed: int, budget: int, work: Path, learning_starts: int | None = None
) -> Path:
    """The example both sides run: the seed and the budget set, evaluations every
    `eval_every_steps` env steps' worth of train iterations, and `learning_starts`
    (random steps, and the items before the first sample) when given (the smoke test)."""
    raw = load_config_file(row.example)
    updates_per_step = updates_per_env_step(raw)
    eval_freq = max(1, round(row.eval_every_steps * updates_per_step))
    changes: dict = {
        "system": {"seed": seed, "max_env_step": budget},
        "policy": {"eval": {"evaluator": {"eval_freq": eval_freq}}},
    }
    if learning_starts is not None and raw["policy"]["type"] == "sac":
        changes["policy"] |= {
            "collect": {"random_collect_size": learning_starts},
            "other": {"replay_buffer": {"min_size_to_sample": learning_starts}},
        }
    config = deep_merge(raw, changes)
    path = work / f"{row.name}-seed{seed}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def updates_per_env_step(raw: dict) -> float:
    """Train iterations per env step: what the example's replay ratio asks for (SAC),
    or its epochs of minibatches over each round (PPO)."""
    policy = resolve_job_config(raw)[0].policy
    learn = policy.learn
    if policy.type == "ppo":
        rows, epochs = policy.collect.n_sample, learn.epoch_per_collect  # type: ignore[attr-defined]
        return epochs * -(-rows // learn.batch_size) / rows
    ratio = policy.other.replay_buffer.samples_per_insert
    assert ratio is not None, "SAC's examples set a replay ratio"
    return float(ratio) / float(learn.batch_size)


def run_drover(seed: int, config: Path, collectors: int, out: Path, timeout_s: float) -> SideRun:
    runs_dir = out / "drover"
    before = set(runs_dir.glob("*/job-*"))
    started = time.monotonic()
    command = [sys.executable, "-m", "drover", "run", str(config), "--collectors", str(collectors)]
    with (out / f"drover-seed{seed}.log").open("w") as log:
        proc = subprocess.Popen(
            [*command, "--runs-dir", str(runs_dir)], cwd=ROOT, stdout=log, stderr=log
        )
        with CpuSampler(proc.pid) as cpu:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(timeout=60)
    job_dirs = sorted(set(runs_dir.glob("*/job-*")) - before)
    if not job_dirs:
        return SideRun(seed, None, time.monotonic() - started, 0, f"exit {proc.returncode}")
    job_dir = job_dirs[-1]
    summary = json.loads((job_dir / "summary.json").read_text())
    record = read_record(job_dir)
    wall_s = float(record["finished_at"]) - float(record["running_since"])
    note = "" if summary["phase"] == "succeeded" else f"{summary['phase']}: {summary['reason']}"
    return SideRun(
        seed,
        job_dir,
        wall_s,
        int(summary["env_steps"]),
        note,
        busy=learner_busy_fraction(job_dir),
        data_plane_cores=cpu.seconds(DATA_PLANE) / wall_s,
    )


def run_sb3(row: Row, seed: int, config: Path, budget: int, out: Path, timeout_s: float) -> SideRun:
    folder = out / "stable-baselines3"
    command = [sys.executable, "-m", "bench.sb3_mujoco", str(config), "--seed", str(seed)]
    command += ["--budget", str(budget), "--eval-every-steps", str(row.eval_every_steps)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [*command, "--out", str(folder)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return SideRun(seed, None, time.monotonic() - started, 0, f"timed out ({timeout_s:.0f} s)")
    if proc.returncode != 0:
        note = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
        return SideRun(seed, None, time.monotonic() - started, 0, note)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return SideRun(seed, folder / result["job_id"], result["wall_s"], result["env_steps"])


def read_record(job_dir: Path) -> dict:
    from drover.plot import read_record as read

    return read(job_dir)


# --- what a row ran, kept for --table-only -----------------------------------------------

#: Each row's runs as this bench measured them, in the row's folder.
RUNS = "runs.json"


COMMIT = "commit.txt"


def record_commit(folder: Path, commit: str | None) -> str:
    """The commit a row's runs ran: kept beside them when they run (`commit`), read
    back when they are tabled again."""
    kept = folder / COMMIT
    if commit is not None:
        kept.write_text(commit + "\n")
        return commit
    return kept.read_text().strip() if kept.exists() else "unknown"


def runs_record(result: RowResult) -> dict[str, list[dict]]:
    return {
        side: [
            dataclasses.asdict(r) | {"job_dir": None if r.job_dir is None else str(r.job_dir)}
            for r in runs
        ]
        for side, runs in result.runs.items()
    }


def runs_in(folder: Path) -> dict[str, list[SideRun]]:
    """A row's runs: as it kept them, or, from a run before it kept them, from their job
    records and the learner's scalars (the data plane's CPU, read live, is then unknown)."""
    kept = folder / RUNS
    if kept.exists():
        record = json.loads(kept.read_text())
        return {
            side: [
                SideRun(**(r | {"job_dir": None if r["job_dir"] is None else Path(r["job_dir"])}))
                for r in record[side]
            ]
            for side in SIDES
        }
    found = {
        "drover": sorted(folder.glob("drover/*/job-*")),
        "stable-baselines3": sorted(folder.glob("stable-baselines3/sb3-*")),
    }
    runs: dict[str, list[SideRun]] = {}
    for side, job_dirs in found.items():
        side_runs = []
        for job_dir in job_dirs:
            record = read_record(job_dir)
            started = record.get("running_since") or record["started_at"]
            side_runs.append(
                SideRun(
                    int(record["config"]["system"]["seed"]),
                    job_dir,
                    float(record["finished_at"]) - float(started),
                    int(record["env_steps"]),
                    busy=learner_busy_fraction(job_dir) if side == "drover" else None,
                )
            )
        runs[side] = sorted(side_runs, key=lambda r: r.seed)
    return runs


# --- the tables ---------------------------------------------------------------------------


def wall_s_to(job_dir: Path, score: float) -> float | None:
    """Seconds from the job's start to its first evaluation at or above `score`."""
    import numpy as np

    from drover.plot import PlotError, curve_of

    try:
        curve = curve_of(read_record(job_dir), job_dir, "", "wall_s")
    except PlotError:
        return None
    reached = np.nonzero(curve.y >= score)[0]
    return float(curve.x[reached[0]]) if reached.size else None


def spread(values: list[float], digits: int = 0) -> str:
    """median (min-max) of `values`, or '-'."""
    if not values:
        return "-"
    med, low, high = statistics.median(values), min(values), max(values)
    return f"{med:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def report_of(result: RowResult, out: Path) -> dict[str, dict[str, str]]:
    """One `drover report` of both sides: its rows by side."""
    from drover.report import merged, read_configs, rows, write_report

    folders = sorted((out / "drover").glob("*/")) + [out / "stable-baselines3"]
    configs = merged([read_configs(folder) for folder in folders if folder.is_dir()])
    write_report(configs, out / "report", title=f"{result.row.name}: drover and stable-baselines3")
    by_label = {row["config"]: row for row in rows(configs)}
    return {
        side: next((r for label, r in by_label.items() if side_of(label) == side), {})
        for side in SIDES
    }


def side_of(label: str) -> str:
    return "stable-baselines3" if label.endswith("(stable-baselines3)") else "drover"


def final_returns(runs: list[SideRun]) -> list[float]:
    finals = []
    for run in runs:
        if run.job_dir is not None:
            evals = read_record(run.job_dir)["evals"]
            if evals:
                finals.append(float(evals[-1]["return_mean"]))
    return finals


def evaluations(run: SideRun) -> list[tuple[int, float]]:
    """(env steps, mean return) of the run's evaluations."""
    if run.job_dir is None:
        return []
    return [
        (int(e["env_steps"]), float(e["return_mean"])) for e in read_record(run.job_dir)["evals"]
    ]


def common_steps(result: RowResult) -> int | None:
    """The env steps of the last evaluation every run of both sides reached (within
    1% of the row's interval): where both sides' returns are compared at equal env steps."""
    lasts = [
        max(s for s, _ in evals)
        for side in SIDES
        for r in result.runs[side]
        if (evals := evaluations(r))
    ]
    return min(lasts) if lasts else None


def returns_at(runs: list[SideRun], steps: int, slack: int) -> list[float]:
    """Each run's return at its last evaluation by `steps` (+ `slack`) env steps."""
    found = []
    for run in runs:
        before = [(s, r) for s, r in evaluations(run) if s <= steps + slack]
        if before:
            found.append(before[-1][1])
    return found


def row_table(result: RowResult, reported: dict[str, dict[str, str]]) -> tuple[list, dict]:
    """The bench's table of one row (Markdown cells) and its figures for --json."""
    sb3_finals = final_returns(result.runs["stable-baselines3"])
    score = statistics.median(sb3_finals) if sb3_finals else None
    common = common_steps(result)
    slack = result.row.eval_every_steps // 100
    lines, figures = [], {}
    for side in SIDES:
        runs = [r for r in result.runs[side] if r.job_dir is not None and not r.note]
        rep = reported.get(side, {})
        to_score = [
            t for r in runs if score is not None and (t := wall_s_to(r.job_dir, score)) is not None
        ]
        busy = [r.busy for r in runs if r.busy is not None]
        plane = [r.data_plane_cores for r in runs if r.data_plane_cores is not None]
        at_common = returns_at(runs, common, slack) if common is not None else []
        lines.append(
            [
                side,
                f"{len(runs)}/{len(result.runs[side])}",
                rep.get("final return, IQM", "-"),
                rep.get("final return, median", "-"),
                _estimate(at_common),
                rep.get("return AUC, IQM", "-"),
                rep.get("return AUC, median", "-"),
                spread([r.steps_per_s for r in runs], 1),
                spread([r.wall_s for r in runs]),
                f"{spread(to_score)} ({len(to_score)}/{len(runs)})",
                spread(busy, 2) if side == "drover" else "-",
                spread(plane, 2) if side == "drover" else "-",
            ]
        )
        finals = final_returns(runs)
        figures[side] = {
            "final_iqm": _iqm(finals),
            "common_iqm": _iqm(at_common),
            "wall_s_median": statistics.median([r.wall_s for r in runs]) if runs else None,
            "steps_per_s_median": statistics.median([r.steps_per_s for r in runs])
            if runs
            else None,
            "busy_median": statistics.median(busy) if busy else None,
        }
    drover, sb3 = figures["drover"], figures["stable-baselines3"]
    figures["final_iqm_ratio"] = _ratio(drover["final_iqm"], sb3["final_iqm"])
    figures["common_steps"] = common
    figures["common_iqm_ratio"] = _ratio(drover["common_iqm"], sb3["common_iqm"])
    figures["wall_ratio"] = _ratio(drover["wall_s_median"], sb3["wall_s_median"])
    figures["score"] = score
    return lines, figures


def _estimate(values: list[float]) -> str:
    """IQM [95% CI] of `values`, or '-'."""
    from drover import stats

    return stats.estimate(values, stats.iqm).text(1) if values else "-"


def _iqm(values: list[float]) -> float | None:
    from drover import stats

    return float(stats.iqm(values)) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


COLUMNS = [
    "side",
    "seeds",
    "final return, IQM [95% CI]",
    "final return, median [95% CI]",
    "return at the last common env steps, IQM [95% CI]",
    "return AUC, IQM [95% CI]",
    "return AUC, median [95% CI]",
    "env steps/s",
    "wall s to the budget",
    "wall s to SB3's median final return (runs)",
    "learner busy",
    "data plane, cores",
]


def markdown(result: RowResult, lines: list, figures: dict, budget: int) -> list[str]:
    row = result.row
    score = figures["score"]
    text = [
        f"### {row.name}: `{row.example.relative_to(ROOT)}`, {budget:,} env steps",
        "",
        f"Evaluations: the example's `n_evaluator_episode` greedy episodes every "
        f"{row.eval_every_steps:,} env steps once training began. The score "
        f"stable-baselines3 reached (its median final return): "
        f"{'-' if score is None else f'{score:,.1f}'}. Each cell: median (min-max) over "
        "seeds unless it says otherwise.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(cells) + " |" for cells in lines),
        "",
        f"The last env steps both sides evaluated at: {_fmt(figures['common_steps'], 0)}. "
        f"drover / stable-baselines3: IQM final return "
        f"{_fmt(figures['final_iqm_ratio'])}x, IQM return at those env steps "
        f"{_fmt(figures['common_iqm_ratio'])}x, median wall time to the budget "
        f"{_fmt(figures['wall_ratio'])}x. The report (curves, profile): "
        f"`{row.name}/report/report.md`.",
        "",
    ]
    notes = [
        f"{side} seed {r.seed}: {r.note}" for side in SIDES for r in result.runs[side] if r.note
    ]
    return text + ([*(f"- {n}" for n in notes), ""] if notes else [])


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=None, help="env steps (the row's)")
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument(
        "--learning-starts",
        type=int,
        default=None,
        help="random env steps before training, on both sides (the example's: 10,000)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--eval-every-steps", type=int, default=None, help="env steps (the row's: 5,000)"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=None, help="per run (default: from the budget)"
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="run nothing: the tables and the report again from the runs in --out",
    )
    args = parser.parse_args()
    if args.table_only and args.out is None:
        parser.error("--table-only: name the folder of the runs with --out")
    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown row {unknown[0]!r} (rows: {', '.join(ROWS)})")
    # The code the runs ran: the checkout may move on during an hour's bench.
    commit = checkout_commit()
    out = args.out or ROOT / "runs" / f"parity-{datetime.now():%Y%m%d-%H%M%S}"
    console = Console(width=200)
    console.print(f"parity: {cpu_line()}; results in {out}")
    document = [
        f"# drover and stable-baselines3 on MuJoCo ({datetime.now():%Y-%m-%d})",
        "",
        f"Machine: {cpu_line()}. {args.collectors} collectors on drover's side.",
        "",
    ]
    all_figures = {}
    for name in names:
        row = ROWS[name]
        if args.eval_every_steps is not None:
            row = dataclasses.replace(row, eval_every_steps=args.eval_every_steps)
        budget = args.budget or row.budget
        # Generous: a seed at 20 updates a second, plus the start.
        timeout_s = args.timeout_s or budget / 20 + 600
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        result = RowResult(row)
        if args.table_only:
            result.runs = runs_in(folder)
        for seed in range(0 if args.table_only else args.seeds):
            config = seeded_example(row, seed, budget, folder, args.learning_starts)
            order = SIDES if seed % 2 == 0 else SIDES[::-1]
            for side in order:
                if side == "drover":
                    run = run_drover(seed, config, args.collectors, folder, timeout_s)
                else:
                    run = run_sb3(row, seed, config, budget, folder, timeout_s)
                result.runs[side].append(run)
                console.print(
                    f"{name} seed {seed} {side}: {run.env_steps:,} env steps in "
                    f"{run.wall_s:,.1f} s {run.note}"
                )
        if not args.table_only:
            (folder / RUNS).write_text(json.dumps(runs_record(result), indent=1) + "\n")
        lines, figures = row_table(result, report_of(result, folder))
        all_figures[name] = figures | {
            "env_id": load_config_file(row.example)["env"]["env_id"],
            "algo": load_config_file(row.example)["policy"]["type"],
            "budget": budget,
            "seeds": len(result.runs["drover"]),
            "collectors": args.collectors,
            # A row is its own run (an hour each): the file keeps the rows not run now.
            "commit": record_commit(folder, commit if not args.table_only else None),
            "date": f"{datetime.now():%Y-%m-%d}",
        }
        document += markdown(result, lines, figures, budget)
        table = Table(title=f"{name}, {budget:,} env steps")
        for column in COLUMNS:
            table.add_column(column)
        for cells in lines:
            table.add_row(*cells)
        console.print(table)
    (out / "parity.md").write_text("\n".join(document))
    console.print(f"parity: tables in {out / 'parity.md'}")
    if args.json is not None and args.json.exists():
        kept = json.loads(args.json.read_text())["figures"]
        all_figures = {
            n: f for n, f in kept.items() if n in ROWS and n not in all_figures
        } | all_figures
    write_figures(args.json, "parity", all_figures, commit=None if args.table_only else commit)


if __name__ == "__main__":
    main()
