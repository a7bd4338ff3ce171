"""The whole `drover run examples/cartpole_dqn.yaml` command, start to exit, against a
single stable-baselines3 DQN process to the same goal, seeds alternating.

    python bench/whole_run.py [--seeds 5] [--timeline] [--sb3-torch-threads N]
        [--learn-feed thread]

For each seed, first drover, then SB3, on this machine one after the other:

- drover: `python -m drover run` (the `drover` command) on the example with `system.seed` set to the
  seed (a copy of the example, nothing else changed), timed from before the command
  starts to its exit: the launcher's start, every service's start and registration,
  training, the evaluations, and the shutdown of every process.
- SB3: `python -m bench.sb3_cartpole SEED` (bench/sb3_cartpole.py), timed the same
  way: python's start, torch's and SB3's imports, training with rl-baselines3-zoo's
  CartPole-v1 hyperparameters, evaluations of the same number of greedy episodes as
  the example's (`env.n_evaluator_episode`), every `eval_freq` train iterations'
  worth of env steps (200 x train_freq 256 / gradient_steps 128 = 400 env steps),
  until the mean reaches the example's `stop_value`.

SB3 runs with torch's own number of threads (one per CPU), as a single process
would; `--sb3-torch-threads 1` gives it the one thread each drover process has
(`system.torch_num_threads`), which keeps it from fighting other load for the CPUs.

The table shows each seed's seconds, the medians over the seeds that reached the goal,
and drover's median over SB3's. Without stable-baselines3 installed (the optional
extra `sb3`: `pip install -e '.[sb3]'`), the SB3 column says so and drover's side
still runs.

`--learn-feed thread` runs drover with `policy.learn.feed: thread` in its copies of the
example (a learner samples on a thread of its own process instead of its feeder
process), to compare the two; the table's title says which ran.

`--timeline` then runs drover once more with every process watched, and prints when
each thing happened, in seconds from the command's start: each service serving (its
imports done, its app built), registered, its first task, the first policy file and
the first segment on the shared root, each evaluation, the job's end, each service
stopping and its process gone, and the command's exit.

Timings vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import cpu_line  # noqa: E402
from bench.memory import PssSampler  # noqa: E402
from bench.results import write_figures  # noqa: E402
from common.config import deep_merge  # noqa: E402
from jobconfig import load_config_file  # noqa: E402

EXAMPLE = ROOT / "examples" / "cartpole_dqn.yaml"
#: Env steps between SB3's evaluations: the example's 200 train iterations between
#: evaluations, at the zoo's 128 gradient steps per 256 env steps.
SB3_EVAL_EVERY_STEPS = 400
RUN_TIMEOUT_S = 600


@dataclass
class Outcome:
    wall_s: float
    reached: bool
    env_steps: int
    note: str = ""


#: `policy.learn.feed` for drover's runs (`--learn-feed`); None: the example's.
LEARN_FEED: str | None = None


def seeded_config(seed: int, work: Path) -> Path:
    """The example with `system.seed` set (and `--learn-feed`'s feed), written where the
    run can read it."""
    config = deep_merge(load_config_file(EXAMPLE), {"system": {"seed": seed}})
    if LEARN_FEED is not None:
        config = deep_merge(config, {"policy": {"learn": {"feed": LEARN_FEED}}})
    path = work / f"cartpole_dqn_seed{seed}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_drover(seed: int, work: Path) -> tuple[Outcome, subprocess.CompletedProcess]:
    config = seeded_config(seed, work)
    runs_dir = work / f"drover-seed{seed}"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "drover", "run", str(config), "--runs-dir", str(runs_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    wall_s = time.monotonic() - started
    summaries = sorted(runs_dir.glob("*/job-*/summary.json"))
    if not summaries:
        return Outcome(wall_s, False, 0, f"exit {proc.returncode}, no summary"), proc
    summary = json.loads(summaries[-1].read_text())
    reached = summary["phase"] == "succeeded" and proc.returncode == 0
    return Outcome(wall_s, reached, summary["env_steps"]), proc


def sb3_installed() -> bool:
    return importlib.util.find_spec("stable_baselines3") is not None


def run_sb3(seed: int, eval_episodes: int, torch_threads: int | None) -> Outcome:
    threads = [] if torch_threads is None else ["--torch-threads", str(torch_threads)]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sb3_cartpole", str(seed), *threads]
        + ["--eval-episodes", str(eval_episodes), "--eval-every-steps", str(SB3_EVAL_EVERY_STEPS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        return Outcome(wall_s, False, 0, f"exit {proc.returncode}: {proc.stderr[-300:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return Outcome(wall_s, result["reached"], result["env_steps"])


def median_s(outcomes: list[Outcome]) -> float | None:
    reached = [o.wall_s for o in outcomes if o.reached]
    return statistics.median(reached) if reached else None


# --- the timeline -----------------------------------------------------------------------

#: Log lines worth a row, by what they say (services log `<date> <time>,<ms> <role> ...`).
_EVENTS = [
    (re.compile(r"serving drover\.\w+ on"), "serving"),
    (re.compile(r"registered as "), "registered"),
    (re.compile(r"task (\S+) \((\w+), job"), "task started"),
    (re.compile(r"eval of version (\d+): ([\d.]+)"), "evaluation"),
    (re.compile(r"job \S+ (succeeded|failed|stopped):"), "job ended"),
    (re.compile(r"signal 15: stopping"), "SIGTERM"),
    (re.compile(r"\bstopped$"), "stopped serving"),
]
_STAMP_RE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_events(log_dir: Path) -> list[tuple[float, str, str]]:
    """(wall-clock time, service, what) for each line of interest in the services' logs;
    a service's first task of each kind only."""
    events = []
    for log in sorted(log_dir.glob("*.log")):
        kinds_seen = set()
        for line in log.read_text(errors="replace").splitlines():
            stamp = _STAMP_RE.match(line)
            if not stamp:
                continue
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for pattern, what in _EVENTS:
                match = pattern.search(line)
                if not match:
                    continue
                if what == "task started":
                    if match.group(2) in kinds_seen:
                        break
                    kinds_seen.add(match.group(2))
                    what = f"first {match.group(2)} task started"
                elif what == "evaluation":
                    what = f"evaluation of v{match.group(1)}: {match.group(2)}"
                events.append((when, log.stem, what))
                break
    return events


class FirstFiles:
    """Notes, every `interval_s`, when the first file appears in each kind of folder of
    the job (policies/, segments/) on the shared root."""

    def __init__(self, runs_dir: Path, interval_s: float = 0.02) -> None:
        self.runs_dir = runs_dir
        self.interval_s = interval_s
        self.first: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.first) < 2:
            for kind in ("policies", "segments"):
                if kind not in self.first and any(
                    p.suffix == ".safetensors" for p in self.runs_dir.glob(f"*/job-*/{kind}/*")
                ):
                    self.first[kind] = time.time()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


def timeline(seed: int, work: Path) -> list[tuple[float, str, str]]:
    """One drover run, watched: (seconds from the command's start, who, what)."""
    config = seeded_config(seed, work)
    runs_dir = work / "timeline"
    runs_dir.mkdir()
    started_wall, started = time.time(), time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover", "run", str(config), "--runs-dir", str(runs_dir)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    processes = PssSampler(proc.pid, interval_s=0.02, read_pss=False).start()
    files = FirstFiles(runs_dir)
    proc.wait(timeout=RUN_TIMEOUT_S)
    exit_s = time.monotonic() - started
    processes.stop()
    files.stop()
    rows = [
        (t - started_wall, who, what) for t, who, what in log_events(next(runs_dir.glob("*/logs")))
    ]
    rows += [
        (t - started_wall, "shared root", f"first file in {k}/") for k, t in files.first.items()
    ]
    rows += [
        (t - started, role, "process last seen")
        for role, t in processes.last_seen_s.items()
        if role != "launcher"
    ]
    rows.append((exit_s, "launcher", f"command exited ({proc.returncode})"))
    return sorted(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--timeline", action="store_true")
    parser.add_argument("--sb3-torch-threads", type=int, default=None)
    parser.add_argument("--learn-feed", choices=("process", "thread"), default=None)
    parser.add_argument("--json", type=Path, help="also write the medians and their ratio here")
    args = parser.parse_args()
    global LEARN_FEED
    LEARN_FEED = args.learn_feed
    console = Console(width=150)
    example = load_config_file(EXAMPLE)
    eval_episodes = int(example["env"]["n_evaluator_episode"])
    with_sb3 = sb3_installed()
    if not with_sb3:
        console.print(
            "stable-baselines3 is not installed: the SB3 column is left empty. It is the "
            "optional extra `sb3`: pip install -e '.[sb3]'",
            markup=False,  # rich would take [sb3] for a style and drop it
        )
    drover_runs: list[Outcome] = []
    sb3_runs: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for seed in range(args.seeds):
            outcome, proc = run_drover(seed, work)
            drover_runs.append(outcome)
            if not outcome.reached:
                console.print(f"seed {seed}: drover: {outcome.note}\n{proc.stderr[-2000:]}")
            if with_sb3:
                sb3_runs.append(run_sb3(seed, eval_episodes, args.sb3_torch_threads))
        events = timeline(args.seeds, work) if args.timeline else []

    table = Table(
        title=f"CartPole-v1 DQN to mean eval return {example['env']['stop_value']} "
        f"over {eval_episodes} episodes: whole command / whole process, seconds"
        + (f"; drover with learn.feed: {LEARN_FEED}" if LEARN_FEED else "")
    )
    for col in ("seed", "drover s", "drover env steps", "SB3 s", "SB3 env steps"):
        table.add_column(col, justify="right")

    def cell(o: Outcome | None) -> tuple[str, str]:
        if o is None:
            return "-", "-"
        mark = "" if o.reached else " (goal not reached)"
        return f"{o.wall_s:.2f}{mark}", f"{o.env_steps:,}"

    for seed, ours in enumerate(drover_runs):
        theirs = sb3_runs[seed] if sb3_runs else None
        table.add_row(str(seed), *cell(ours), *cell(theirs))
    ours_s, theirs_s = median_s(drover_runs), median_s(sb3_runs)
    table.add_row(
        "median",
        f"[bold]{ours_s:.2f}[/]" if ours_s is not None else "-",
        "",
        f"[bold]{theirs_s:.2f}[/]" if theirs_s is not None else "-",
        "",
    )
    console.print(table)
    if ours_s is not None and theirs_s is not None:
        console.print(f"drover / SB3 (medians): [bold]{ours_s / theirs_s:.2f}[/]")
        write_figures(
            args.json,
            "whole_run",
            {
                "seeds": args.seeds,
                "drover_s": ours_s,
                "sb3_s": theirs_s,
                "ratio": ours_s / theirs_s,
                "reached": sum(o.reached for o in drover_runs),
            },
        )
    threads = args.sb3_torch_threads or "torch's default number of"
    console.print(f"SB3 with {threads} torch threads; {cpu_line()}")
    for o in sb3_runs:
        if o.note:
            console.print(f"SB3: {o.note}")
    if events:
        t = Table(title="one `drover run`, seconds from the command's start")
        for col in ("s", "who", "what"):
            t.add_column(col, justify="right" if col == "s" else "left")
        for when, who, what in events:
            t.add_row(f"{when:.2f}", who, what)
        console.print(t)


if __name__ == "__main__":
    main()
