"""Strong scaling where the env is the cost: one config to its goal with 1 to 32
collectors, each env step taking a fixed wall time (`--step-ms`) as a simulator's would.

    python bench/scaling.py [--algos dqn,ppo] [--collectors 1,2,4,8,16,32] [--seeds 2]
        [--step-ms 10] [--out DIR] [--json PATH]
    python bench/scaling.py --from-runs DIR/runs.json ... --out DIR   # table, plot again

The env is bench/slow_env.py's `drover-bench/SlowCartPole-v1`: CartPole-v1 whose step
sleeps for the rest of `--step-ms` (the simulator's time, not Python CPU). The services
import it as an operator's env package (`DROVER_ENV_MODULES=bench.slow_env`).

Each run is one job on a fresh local cluster of a coordinator, N collectors and one
learner (`drover.local.LocalCluster`; collectors and learner forked from one process, as
`drover run` does), started and registered before the job is submitted. Only the number
of collectors (`system.collector_num`) changes between the runs of an algorithm:

- `dqn`: examples/cartpole_dqn.yaml (async workflow: collectors never wait for the
  learner unless the replay ratio's limiter holds them) at `--samples-per-insert`;
- `ppo`: examples/cartpole_ppo.yaml (sync workflow: rounds of `n_sample` env steps split
  over the collectors, each trained on before the next round starts);
- both: `--envs` envs a collector, stepped in turn in the collector's process
  (`env.manager: sync`), so a collector steps 1000 / step_ms env steps/s whatever
  `--envs` is, and more envs only spread its inference over more steps;
  `system.max_env_step` and `--timeout-s` bound every run.

The goal is the example's: a mean greedy return of `stop_value` over the example's
`n_evaluator_episode` episodes. The bench evaluates the policy versions itself, as the
learner publishes them (each file on the shared root, the newest each `--eval-every-s`,
and on a pass the versions skipped before it), on the same env at 0 ms a step, in a
thread of its own at lower priority, from the example's `eval_freq` train iterations on
(where the job's first evaluation would come); the job's own evaluations are off. A run
reaches the goal at the publication of the first version that passes (the file's time),
and the bench stops the job then. On the slow env an evaluation takes an episode's wall time
(seconds), and one at a time they would see only some versions: time and env steps to
the goal would grow with the evaluation's latency times the collectors' rate, which is
not what the bench measures.

For each run: its wall time to the goal (from when the job ran to the goal version's
publication), env steps to the goal (the job's count then, read every `POLL_S`), env
steps/s to the goal (or to the end of a run that did not reach it; `rate_until`: DQN's
from the first read that counted any, PPO's, counted a round at a time, from the first
policy version), the learner's busy fraction (time in its updates over wall time, its
TensorBoard scalar `train/busy_fraction`: bench/job_figures.py), and CPU seconds over
the job's wall time of the data plane (the coordinator and the job's buffer processes),
the collectors, the learner (with its feeder), the bench, other work on the machine and
the whole machine. Per collector
count the table gives min / median / max over the seeds of: env steps/s and its
efficiency (rate / (collectors x the median rate at 1 collector)), wall time to the
goal and its speed-up (the median wall time at 1 collector / this one), env steps to
the goal, the learner's busy fraction, the data plane's CPU; the medians of the other
CPUs. A run that did not reach the goal counts in the rates, not in the times and steps
to the goal.

Writes to `--out`: `scaling.md` (the table), `scaling.png` (speed-up against
collectors, with the linear line), `runs.json` (every run's figures); `--json`: the
headline figures (bench/results.py; 16 collectors against 1, for bench/headline.py).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import machine_busy_s  # noqa: E402
from bench.job_figures import ProcessCpu, learner_busy_fraction  # noqa: E402
from bench.learner_scaling import cpu_line  # noqa: E402
from bench.procfs import cpu_s  # noqa: E402
from bench.results import write_figures  # noqa: E402
from bench.single_process import evaluate  # noqa: E402
from bench.slow_env import ENV_ID  # noqa: E402
from common.config import JobConfig, deep_merge  # noqa: E402
from common.http_client import ServiceUnavailable  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from drover.plot import read_record  # noqa: E402
from jobconfig import algorithm_of, load_config_file, read_job_config  # noqa: E402

EXAMPLES = ROOT / "examples"
#: Each algorithm's example and its budget of env steps (what bounds a run that never
#: reaches the goal).
ALGOS: dict[str, tuple[Path, int]] = {
    "dqn": (EXAMPLES / "cartpole_dqn.yaml", 30_000),
    "ppo": (EXAMPLES / "cartpole_ppo.yaml", 100_000),
}
#: How often the bench reads the job's status (its env steps) and the processes' CPU.
POLL_S = 0.2
#: Train iterations between the job's own evaluations: never (the bench evaluates).
NO_EVALUATIONS = 1_000_000_000
#: How long a job may take to end after `--timeout-s` and its stop request.
STOP_GRACE_S = 120.0
#: The niceness of the bench's evaluating thread: the cluster's processes come first.
EVAL_NICENESS = 10


def job_config(
    algo: str,
    *,
    collectors: int,
    seed: int,
    step_ms: float,
    envs: int,
    samples_per_insert: float,
    max_env_step: int | None,
    stop_value: float | None,
) -> dict[str, Any]:
    """The algorithm's example on the slow env, with `collectors` collectors."""
    example, budget = ALGOS[algo]
    config = deep_merge(
        load_config_file(example),
        {
            "env": {
                "env_id": ENV_ID,
                "env_kwargs": {"step_ms": step_ms},
                "manager": "sync",
                "collector_env_num": envs,
            },
            "policy": {"eval": {"evaluator": {"eval_freq": NO_EVALUATIONS}}},
            "system": {
                "seed": seed,
                "collector_num": collectors,
                "max_env_step": max_env_step or budget,
            },
        },
    )
    if stop_value is not None:
        config["env"]["stop_value"] = stop_value
    if algo == "dqn":
        replay = {"samples_per_insert": samples_per_insert}
        config = deep_merge(config, {"policy": {"other": {"replay_buffer": replay}}})
    return config


# --- the goal ---------------------------------------------------------------------------


@dataclass
class Goal:
    version: int
    #: When its file was written (the shared root's clock: time.time()).
    published_t: float
    train_iter: int
    return_mean: float


class GoalWatch:
    """Evaluates a job's policy versions as its learner publishes them, in a thread:
    the newest every `every_s`, and when one passes, the versions skipped before it in
    order, so that `goal` is the first version whose mean greedy return reaches the
    job's `stop_value` (`bench/single_process.py`'s `evaluate`: the job's
    `n_evaluator_episode` episodes over its `evaluator_env_num` envs). The env is the
    job's at 0 ms a step. A version counts from `min_train_iter` train iterations on (the
    example's `eval_freq`, where the job's own first evaluation would come: an untrained
    network's greedy policy balances the pole now and then); one before, or whose file
    was deleted before its turn, is passed over (NaN in `returns`)."""

    def __init__(
        self, run_dir: Path, job_id: str, seed: int, every_s: float, min_train_iter: int
    ) -> None:
        self.store = SharedStore(run_dir)
        self.min_train_iter = min_train_iter
        self.folder = run_dir / job_id / "policies"
        self.job_id = job_id
        self.seed = seed
        self.every_s = every_s
        self.published: dict[int, float] = {}
        self.returns: dict[int, float] = {}
        self.train_iters: dict[int, int] = {}
        self.goal: Goal | None = None
        self.error: str = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="goal-watch", daemon=True)

    def start(self) -> GoalWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60.0)

    def _loop(self) -> None:
        with contextlib.suppress(OSError):  # lower this thread's priority (Linux)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EVAL_NICENESS)
        try:
            self._watch()
        except Exception as exc:  # reported with the run; the job then runs to its budget
            self.error = f"{type(exc).__name__}: {exc}"

    def _watch(self) -> None:
        import torch

        torch.set_num_threads(1)
        config: JobConfig | None = None
        actor = None
        last_eval = 0.0
        while not self._stop.wait(0.05) and self.goal is None:
            self._note_files()
            if config is None:
                try:
                    config = read_job_config(self.store, self.job_id)
                except (OSError, ValueError):
                    continue  # not written yet
                fast = dataclasses.replace(config.env, env_kwargs={"step_ms": 0.0})
                config = dataclasses.replace(config, env=fast)
                actor = algorithm_of(config).make_actor(config.policy)
            waiting = [v for v in self.published if v not in self.returns]
            if not waiting or time.monotonic() - last_eval < self.every_s:
                continue
            last_eval = time.monotonic()
            newest = max(waiting)
            if not self._passes(config, actor, newest):
                continue
            # Versions passed over since the last one evaluated, oldest first.
            below = max((v for v in self.returns if v < newest), default=-1)
            for version in sorted(v for v in waiting if below < v < newest):
                if self._passes(config, actor, version):
                    newest = version
                    break
            self.goal = Goal(
                newest,
                self.published[newest],
                self.train_iters[newest],
                self.returns[newest],
            )

    def _note_files(self) -> None:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        for name in names:
            stem, _, ext = name.partition(".")
            if ext != "safetensors" or not stem.isdigit() or int(stem) in self.published:
                continue
            with contextlib.suppress(OSError):
                self.published[int(stem)] = (self.folder / name).stat().st_mtime

    def _passes(self, config: JobConfig, actor: Any, version: int) -> bool:
        rel = self.store.policy_path(self.job_id, version)
        try:
            policy_file = self.store.read_policy(rel, algo=config.policy.type)
        except Exception:  # deleted (only the newest few are kept) or being replaced
            self.returns[version] = float("nan")
            return False
        if policy_file.train_iter < self.min_train_iter:
            self.returns[version] = float("nan")
            return False
        actor.load(policy_file.version, policy_file.tensors)
        mean = evaluate(config, actor, self.seed)
        self.returns[version] = mean
        self.train_iters[version] = policy_file.train_iter
        stop_value = config.env.stop_value
        return stop_value is not None and mean >= stop_value


# --- one run ----------------------------------------------------------------------------


@dataclass
class Run:
    algo: str
    collectors: int
    seed: int
    #: The job's end (`stopped` by the bench at the goal, or `failed` at its budget).
    phase: str
    reason: str
    reached: bool
    #: From when the job ran to the goal version's publication (to its end if none).
    wall_s: float
    #: The job's env steps at the goal (at its end if none).
    env_steps: int
    #: The goal version's train iterations (the job's at its end if none).
    train_iters: int
    #: Env steps from the first read that counted any to the goal (or the end), per second.
    env_steps_per_s: float | None
    learner_busy: float | None
    #: CPU seconds over the job's wall time (to its end): the coordinator and the job's
    #: buffer processes; the collectors; the learner and its feeder; the whole machine.
    data_plane_cpu: float
    collectors_cpu: float
    learner_cpu: float
    machine_cpu: float
    #: The bench's own process (its evaluations), and what the machine spent besides the
    #: cluster and the bench (other work on the machine).
    bench_cpu: float
    other_cpu: float
    #: Policy versions the bench evaluated, their mean returns (NaN: its file was gone),
    #: and its error if its evaluation failed.
    versions_evaluated: int
    returns: dict[int, float]
    watch_error: str
    #: The bench's own wall time for the run: cluster start to stop.
    run_s: float
    #: From the bench's stop request to the job's end (None: it ended by its budget).
    stop_s: float | None
    #: (seconds since the job ran, env steps) at each read.
    steps: list[tuple[float, int]] = field(default_factory=list)


#: The roles whose CPU the table shows, and the processes of each (`bench/memory.py`'s
#: `role_of`: a service by its log file, a helper process by its module).
ROLES = {
    "collectors": ("collector-",),
    "learner": ("learner-", "services.learner.feeder"),
    "data plane": ("coordinator", "services.buffer"),
}


def _is_spare_buffer(pid: int, job_id: str) -> bool:
    """Whether `pid` is a buffer process that does not serve `job_id` (it works in its
    job's folder)."""
    try:
        if b"services.buffer" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        return Path(f"/proc/{pid}/cwd").readlink().name != job_id
    except OSError:
        return True


def steps_at(steps: list[tuple[float, int]], t: float) -> int:
    """The env steps at `t`, between the reads before and after it."""
    times = [x for x, _ in steps]
    i = bisect.bisect_left(times, t)
    if i == 0:
        return steps[0][1] if steps else 0
    if i == len(steps):
        return steps[-1][1]
    (t0, s0), (t1, s1) = steps[i - 1], steps[i]
    return round(s0 + (s1 - s0) * (t - t0) / (t1 - t0)) if t1 > t0 else s1


def rate_until(
    steps: list[tuple[float, int]], t: float, *, rounds: bool, first_policy_t: float | None
) -> float | None:
    """Env steps/s up to `t`. Steps counted as they come (async): the count's growth from
    its first read to `t` (both ends lag the collectors alike). Steps counted a round at
    a time, when it ends (sync): the count at `t` over the time from the first policy
    version, which starts the first round, to `t`."""
    if rounds:
        if first_policy_t is None or t <= first_policy_t:
            return None
        return steps_at(steps, t) / (t - first_policy_t)
    first = next(((x, n) for x, n in steps if n > 0), None)
    if first is None or t <= first[0]:
        return None
    return (steps_at(steps, t) - first[1]) / (t - first[0])


def run_one(algo: str, collectors: int, seed: int, args: argparse.Namespace, work: Path) -> Run:
    config = job_config(
        algo,
        collectors=collectors,
        seed=seed,
        step_ms=args.step_ms,
        envs=args.envs,
        samples_per_insert=args.samples_per_insert,
        max_env_step=args.max_env_step,
        stop_value=args.stop_value,
    )
    env = {"DROVER_ENV_MODULES": "bench.slow_env", "PYTHONPATH": str(ROOT)}
    if args.buffer_threads is not None:
        env["DROVER_BUFFER_THREADS"] = str(args.buffer_threads)
    run_dir = work / f"{algo}-c{collectors}-s{seed}"
    started = time.monotonic()
    cluster = LocalCluster(run_dir, num_collectors=collectors, extra_env=env, fork_server=True)
    watch = None
    reads: list[tuple[float, int]] = []  # (time.time(), env steps)
    try:
        cluster.start()
        cluster.wait_for_workers(timeout_s=120.0)
        # The roles' CPU from here on; the spare buffer process, which waits for the
        # next job, is left out.
        cpu = ProcessCpu(os.getpid())
        cpu.baseline()
        busy0, bench0 = machine_busy_s(), cpu_s(os.getpid())
        job_id = cluster.client.submit_job(config).job_id
        example = load_config_file(ALGOS[algo][0])
        first_eval = int(example["policy"]["eval"]["evaluator"]["eval_freq"])
        watch = GoalWatch(run_dir, job_id, seed, args.eval_every_s, first_eval).start()
        deadline = time.monotonic() + args.timeout_s
        stop_sent: float | None = None
        while True:
            if time.monotonic() > deadline + STOP_GRACE_S:
                raise TimeoutError(f"job {job_id} did not end {STOP_GRACE_S} s after its stop")
            try:
                status = cluster.client.job(job_id)
            except ServiceUnavailable:  # a coordinator slow to answer: read again
                continue
            reads.append((time.time(), status.env_steps))
            cpu.read(skip=lambda pid: _is_spare_buffer(pid, job_id))
            if status.phase != "running":
                break
            dead = cluster.dead_services()
            if dead:
                raise RuntimeError(f"{dead[0].name} died:\n{dead[0].log_tail()}")
            if stop_sent is None and (watch.goal is not None or time.monotonic() > deadline):
                stop_sent = time.time()
                with contextlib.suppress(ServiceUnavailable):  # its end is read above
                    cluster.client.call("DELETE", f"/api/v1/jobs/{job_id}", timeout_s=60.0)
            time.sleep(POLL_S)
        busy1, bench1 = machine_busy_s(), cpu_s(os.getpid())
        watch.stop()
        # The record is written before the end is shown (services/coordinator/jobs.py).
        job_dir = run_dir / job_id
        record = read_record(job_dir)
    finally:
        if watch is not None:
            watch.stop()
        cluster.stop()
    spent = {role: cpu.seconds(prefixes) for role, prefixes in ROLES.items()}
    ran_at = float(record.get("running_since") or record["started_at"])
    job_s = float(record["finished_at"]) - ran_at
    goal = watch.goal
    end_t = goal.published_t if goal is not None else float(record["finished_at"])
    return Run(
        algo=algo,
        collectors=collectors,
        seed=seed,
        phase=status.phase,
        reason=status.reason,
        reached=goal is not None,
        wall_s=end_t - ran_at,
        env_steps=steps_at(reads, end_t) if goal is not None else int(record["env_steps"]),
        train_iters=goal.train_iter if goal is not None else int(record["train_iters"]),
        env_steps_per_s=rate_until(
            reads,
            end_t,
            rounds=algo == "ppo",
            first_policy_t=min(watch.published.items())[1] if watch.published else None,
        ),
        learner_busy=learner_busy_fraction(job_dir),
        data_plane_cpu=spent["data plane"] / job_s,
        collectors_cpu=spent["collectors"] / job_s,
        learner_cpu=spent["learner"] / job_s,
        machine_cpu=(busy1 - busy0) / job_s,
        bench_cpu=(bench1 - bench0) / job_s,
        other_cpu=max(0.0, busy1 - busy0 - (bench1 - bench0) - sum(spent.values())) / job_s,
        versions_evaluated=len([v for v in watch.returns.values() if v == v]),
        returns=dict(sorted(watch.returns.items())),
        watch_error=watch.error,
        run_s=time.monotonic() - started,
        stop_s=None if stop_sent is None else float(record["finished_at"]) - stop_sent,
        steps=[(round(t - ran_at, 2), n) for t, n in reads],
    )


# --- figures ----------------------------------------------------------------------------


@dataclass
class Spread:
    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return cls(min(known), statistics.median(known), max(known))

    def text(self, fmt: Callable[[float], str]) -> str:
        if fmt(self.low) == fmt(self.high):
            return fmt(self.median)
        return f"{fmt(self.median)} ({fmt(self.low)}-{fmt(self.high)})"


def rows_of(runs: list[Run]) -> list[dict[str, Any]]:
    """Per algorithm and collector count: the spreads over seeds of each figure."""
    rows = []
    for algo in dict.fromkeys(r.algo for r in runs):
        mine = [r for r in runs if r.algo == algo]
        base = [r for r in mine if r.collectors == min(x.collectors for x in mine)]
        base_n = base[0].collectors
        base_rate = Spread.of([r.env_steps_per_s for r in base])
        base_wall = Spread.of([r.wall_s for r in base if r.reached])
        for n in sorted({r.collectors for r in mine}):
            these = [r for r in mine if r.collectors == n]
            reached = [r for r in these if r.reached]
            rates = [r.env_steps_per_s for r in these]
            rows.append(
                {
                    "algo": algo,
                    "collectors": n,
                    "runs": len(these),
                    "reached": len(reached),
                    "env_steps_per_s": Spread.of(rates),
                    "efficiency": Spread.of(
                        [
                            x * base_n / (n * base_rate.median) if x and base_rate else None
                            for x in rates
                        ]
                    ),
                    "wall_s": Spread.of([r.wall_s for r in reached]),
                    "speedup": Spread.of(
                        [base_wall.median / r.wall_s for r in reached] if base_wall else []
                    ),
                    "env_steps": Spread.of([r.env_steps for r in reached]),
                    "learner_busy": Spread.of([r.learner_busy for r in these]),
                    "data_plane_cpu": Spread.of([r.data_plane_cpu for r in these]),
                    "collectors_cpu": Spread.of([r.collectors_cpu for r in these]),
                    "learner_cpu": Spread.of([r.learner_cpu for r in these]),
                    "other_cpu": Spread.of([r.other_cpu for r in these]),
                    "machine_cpu": Spread.of([r.machine_cpu for r in these]),
                }
            )
    return rows


COLUMNS = (
    "algo",
    "collectors",
    "reached goal",
    "env steps/s",
    "efficiency",
    "wall s to goal",
    "speed-up",
    "env steps to goal",
    "learner busy",
    "data plane CPU",
    "CPUs: collectors / learner / others / machine",
)


def cells(row: dict[str, Any]) -> list[str]:
    def show(key: str, fmt: Callable[[float], str]) -> str:
        spread = row[key]
        return "-" if spread is None else spread.text(fmt)

    return [
        row["algo"],
        str(row["collectors"]),
        f"{row['reached']}/{row['runs']}",
        show("env_steps_per_s", lambda x: f"{x:,.0f}"),
        show("efficiency", lambda x: f"{x:.2f}"),
        show("wall_s", lambda x: f"{x:.1f}"),
        show("speedup", lambda x: f"{x:.1f}"),
        show("env_steps", lambda x: f"{x:,.0f}"),
        show("learner_busy", lambda x: f"{x:.0%}"),
        show("data_plane_cpu", lambda x: f"{x:.0%}"),
        " / ".join(
            "-" if row[key] is None else f"{row[key].median:.2f}"
            for key in ("collectors_cpu", "learner_cpu", "other_cpu", "machine_cpu")
        ),
    ]


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    previous = None
    for row in rows:
        values = cells(row)
        if row["algo"] == previous:
            values[0] = ""
        previous = row["algo"]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Speed-up of the wall time to the goal against collectors, per algorithm (median,
    min-max bars), and of env steps/s beside it, with the linear line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    counts = sorted({r["collectors"] for r in rows})
    panels = (
        ("speedup", "wall time to goal: speed-up"),
        ("efficiency", "env steps/s: speed-up (rate / rate at 1)"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(counts, counts, color="gray", linestyle="--", label="linear")
        for algo in dict.fromkeys(r["algo"] for r in rows):
            xs, ys, lows, highs = [], [], [], []
            for row in rows:
                spread = row[key]
                if row["algo"] != algo or spread is None:
                    continue
                scale = row["collectors"] if key == "efficiency" else 1.0
                xs.append(row["collectors"])
                ys.append(spread.median * scale)
                lows.append((spread.median - spread.low) * scale)
                highs.append((spread.high - spread.median) * scale)
            if xs:
                ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=algo)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("collectors")
        ax.set_ylabel("speed-up over 1 collector")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The collector count the headline compares with 1 (the targets' count).
HEADLINE_COLLECTORS = 16
#: Each algorithm's workflow, as the headline names it.
WORKFLOW = {"dqn": "async", "ppo": "sync"}
#: The figures of a row that `--json` gives (their medians over the seeds).
FIGURES = (
    "env_steps_per_s",
    "efficiency",
    "wall_s",
    "speedup",
    "env_steps",
    "learner_busy",
    "data_plane_cpu",
)


def headline(rows: list[dict[str, Any]], step_ms: float) -> dict[str, Any]:
    """For `--json` (bench/headline.py's scaling rows), per algorithm: its medians at
    `HEADLINE_COLLECTORS` collectors (or the most it ran, if fewer) against 1 collector's,
    and every collector count's medians under `by_collectors`."""

    def median(row: dict[str, Any], key: str) -> float | None:
        return None if row[key] is None else row[key].median

    figures: dict[str, Any] = {}
    for algo in dict.fromkeys(r["algo"] for r in rows):
        mine = {r["collectors"]: r for r in rows if r["algo"] == algo}
        base = mine[min(mine)]
        counts = [n for n in mine if n <= HEADLINE_COLLECTORS]
        top = mine[max(counts) if counts else max(mine)]
        steps, steps_at_1 = median(top, "env_steps"), median(base, "env_steps")
        figures[algo] = {
            "workflow": WORKFLOW.get(algo, ""),
            "step_ms": step_ms,
            "collectors": top["collectors"],
            "reached": top["reached"],
            "runs": top["runs"],
            **{key: median(top, key) for key in FIGURES},
            "wall_s_at_1": median(base, "wall_s"),
            "env_steps_at_1": steps_at_1,
            "env_steps_ratio": steps / steps_at_1 if steps and steps_at_1 else None,
            "by_collectors": {
                str(n): {
                    "reached": row["reached"],
                    "runs": row["runs"],
                    **{key: median(row, key) for key in FIGURES},
                }
                for n, row in mine.items()
            },
        }
    return figures


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="dqn,ppo", help="of: " + ", ".join(ALGOS))
    parser.add_argument("--collectors", default="1,2,4,8,16,32")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=10.0, help="wall time of an env step")
    parser.add_argument("--envs", type=int, default=4, help="envs a collector (fixed)")
    parser.add_argument("--samples-per-insert", type=float, default=8.0, help="DQN's replay ratio")
    parser.add_argument(
        "--max-env-step", type=int, default=None, help="each run's budget (default: per algo)"
    )
    parser.add_argument(
        "--stop-value", type=float, default=None, help="the goal (default: the example's)"
    )
    parser.add_argument(
        "--eval-every-s", type=float, default=0.5, help="evaluate the newest version this often"
    )
    parser.add_argument(
        "--buffer-threads",
        type=int,
        default=None,
        help="the buffer processes' server threads (DROVER_BUFFER_THREADS; default: theirs)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="each job's limit")
    parser.add_argument("--out", type=Path, default=None, help="table, plot and runs here")
    parser.add_argument("--json", type=Path, default=None, help="the headline figures")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    parser.add_argument(
        "--from-runs",
        type=Path,
        nargs="+",
        default=None,
        help="no runs: the table, plot and figures of these runs.json files (a later file's "
        "runs of an algorithm replace an earlier one's)",
    )
    args = parser.parse_args(argv)
    args.algo_list = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in args.algo_list if a not in ALGOS]
    if unknown:
        parser.error(f"--algos: unknown {unknown}; known: {', '.join(ALGOS)}")
    args.collector_list = sorted({int(c) for c in args.collectors.split(",") if c.strip()})
    return args


def run_all(args: argparse.Namespace, console: Console) -> list[Run]:
    """Every run the arguments ask for, printing a line for each."""
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="drover-scaling-") as tmp:
        work = args.keep or Path(tmp)
        for algo in args.algo_list:
            for seed in range(args.seeds):
                for n in args.collector_list:
                    try:
                        run = run_one(algo, n, seed, args, work)
                    except Exception as exc:  # the other runs go on; the table says how many
                        console.print(
                            f"{algo} {n} collectors seed {seed}: failed: "
                            f"{type(exc).__name__}: {exc}",
                            markup=False,
                        )
                        continue
                    runs.append(run)
                    rate = run.env_steps_per_s or 0.0
                    busy = "-" if run.learner_busy is None else f"{run.learner_busy:.0%}"
                    outcome = "goal" if run.reached else f"no goal ({run.phase})"
                    console.print(
                        f"{algo} {n} collectors seed {seed}: {outcome} in {run.wall_s:.1f} s, "
                        f"{run.env_steps:,} env steps, {rate:,.0f}/s, learner busy {busy}, "
                        f"CPUs: data plane {run.data_plane_cpu:.2f}, collectors "
                        f"{run.collectors_cpu:.2f}, learner {run.learner_cpu:.2f}, bench "
                        f"{run.bench_cpu:.2f}, others {run.other_cpu:.2f}, machine "
                        f"{run.machine_cpu:.2f}; {run.versions_evaluated} versions evaluated "
                        f"({run.run_s:.0f} s with the cluster's start and stop"
                        + ("" if run.stop_s is None else f"; the stop took {run.stop_s:.1f} s")
                        + ")",
                        markup=False,
                    )
                    if run.watch_error:
                        console.print(f"  its evaluation failed: {run.watch_error}", markup=False)
    return runs


def read_runs(paths: list[Path], algos: list[str]) -> list[Run]:
    """The runs of `algos` in the `runs.json` files at `paths`; for each algorithm, those
    of the last file that has any."""
    chosen: dict[str, list[Run]] = {}
    for path in paths:
        runs = [Run(**r) for r in json.loads(path.read_text())]
        for algo in algos:
            mine = [r for r in runs if r.algo == algo]
            if mine:
                chosen[algo] = mine
    return [r for algo in algos for r in chosen.get(algo, [])]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(width=220)  # whole rows in a log file too
    runs = read_runs(args.from_runs, args.algo_list) if args.from_runs else run_all(args, console)
    rows = rows_of(runs)
    table = Table(
        title=f"SlowCartPole-v1 at {args.step_ms:g} ms a step, {args.envs} env(s) a collector, "
        f"{len({r.seed for r in runs})} seed(s): median (min-max)"
    )
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "algo" else "right")
    for row in rows:
        table.add_row(*cells(row))
    console.print(table)
    console.print(cpu_line())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scaling.md").write_text(markdown(rows))
        (args.out / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
        plot(rows, args.out / "scaling.png")
    write_figures(args.json, "scaling", headline(rows, args.step_ms))


if __name__ == "__main__":
    main()
