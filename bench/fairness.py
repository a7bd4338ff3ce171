"""Many jobs on one cluster: what each job is given against what it is owed.

One coordinator, `--collectors` collectors and `--learners` learners as local processes
(what `drover run` starts), and copies of examples/cartpole_dqn.yaml without a goal
(and examples/cartpole_ppo.yaml for the gang), in turn:

- gang:      a sync PPO job needing 2 collectors beside two DQN jobs, on 3 collectors:
             every job's env steps and collector-seconds over `--gang-s`
- equal:     3 DQN jobs of equal weight on 4 collectors
- weighted:  3 DQN jobs of weights 1:1:2
- newcomer:  2 DQN jobs run; a third is submitted: how long until its first env steps
- priority:  2 DQN jobs run; a priority-10 job is submitted: how long until it holds
             every collector, then, once it is stopped, until the others hold theirs

For equal and weighted, after `--settle-s`, each job's share of the collector-seconds
(read from `GET /api/v1/workers` every 0.25 s: which job each collector's collect task
is for) and of the env steps over `--window-s`, against what it is owed (its weight
over the weights), and the collect tasks ended to move shares. Jobs are stopped
between scenarios; the processes stay.

    python bench/fairness.py [--collectors 4] [--learners 3] [--settle-s 10] [--window-s 40]
        [--scenarios gang,equal,weighted,newcomer,priority] [--json FILE]

Prints a table; the targets (issue "Many jobs, one cluster"): each share within 15%
of what it is owed, a newcomer's first env steps within 5 s, the priority job holding
every collector within 5 s. Against a coordinator without shares (no `jobs` in the
workers' listing) it reports what it can: env steps.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import deep_merge  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from jobconfig import load_config_file  # noqa: E402

DQN = ROOT / "examples" / "cartpole_dqn.yaml"
PPO = ROOT / "examples" / "cartpole_ppo.yaml"
#: No goal, no budget a window could reach: the jobs run until the bench stops them.
ENDLESS = {"env": {"stop_value": None}, "system": {"max_env_step": 100_000_000}}
#: The DQN jobs' learners train each item about once, so that the collectors set the
#: pace: with the example's 16 samples per insert a job's env steps follow its one
#: learner's updates, not the collectors it holds (`--samples-per-insert 16`).
SAMPLES_PER_INSERT = 1.0
POLL_S = 0.25


@dataclass(frozen=True)
class Configs:
    """The jobs' configs: the examples, endless, with `samples_per_insert` for DQN."""

    samples_per_insert: float = SAMPLES_PER_INSERT

    def dqn(self, **system: Any) -> dict[str, Any]:
        config = deep_merge(load_config_file(DQN), deep_merge(ENDLESS, {"system": system}))
        limiter = {"samples_per_insert": self.samples_per_insert}
        return deep_merge(config, {"policy": {"other": {"replay_buffer": limiter}}})

    def ppo(self, **system: Any) -> dict[str, Any]:
        return deep_merge(load_config_file(PPO), deep_merge(ENDLESS, {"system": system}))


@dataclass
class Watch:
    """Collector-seconds by job, from the workers' listing, sampled in a thread."""

    cluster: LocalCluster
    seconds: collections.Counter = field(default_factory=collections.Counter)
    #: The coordinator names the job of each task (False: it does not: no shares).
    knows_jobs: bool = True
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(POLL_S):
            workers = self.cluster.client.workers()
            now = time.monotonic()
            for worker in workers:
                jobs = getattr(worker, "jobs", None)
                if jobs is None:
                    self.knows_jobs = False
                    continue
                for task_id, job_id in jobs.items():
                    if task_id.startswith("collect-"):
                        self.seconds[job_id] += now - last
            last = now


def env_steps(cluster: LocalCluster, jobs: list[str]) -> dict[str, int]:
    return {j: cluster.client.job(j).env_steps for j in jobs}


def preempted(cluster: LocalCluster, jobs: list[str]) -> int:
    return sum(getattr(cluster.client.job(j), "tasks_preempted", 0) for j in jobs)


def stop_all(cluster: LocalCluster, jobs: list[str]) -> None:
    for job_id in jobs:
        cluster.client.stop_job(job_id)
    # The released collectors register no task before the next scenario starts.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(w.task_ids for w in cluster.client.workers()):
            return
        time.sleep(0.2)


def wait_for(what: str, check: Any, timeout_s: float, since: float | None = None) -> float | None:
    """Seconds from `since` (now when None) until `check()` holds (None: not within
    `timeout_s`)."""
    started = time.monotonic() if since is None else since
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    print(f"  {what}: not within {timeout_s:.0f} s", file=sys.stderr)
    return None


@dataclass
class Row:
    scenario: str
    job: str
    owed: float
    collector_share: float | None
    step_share: float | None
    env_steps: int
    note: str = ""

    def deviation(self, value: float | None) -> str:
        if value is None or not self.owed:
            return "-"
        return f"{value / self.owed - 1:+.0%}"


def shares_over(
    cluster: LocalCluster,
    scenario: str,
    configs: list[tuple[str, dict[str, Any], float]],
    settle_s: float,
    window_s: float,
) -> tuple[list[Row], dict[str, Any]]:
    """Submit the jobs; after `settle_s`, each one's shares over `window_s`."""
    jobs = [cluster.client.submit_job(config, name=name).job_id for name, config, _ in configs]
    time.sleep(settle_s)
    before, moved = env_steps(cluster, jobs), preempted(cluster, jobs)
    with Watch(cluster) as watch:
        time.sleep(window_s)
    after, moved = env_steps(cluster, jobs), preempted(cluster, jobs) - moved
    stop_all(cluster, jobs)
    steps = {j: after[j] - before[j] for j in jobs}
    total_steps, total_s = sum(steps.values()), sum(watch.seconds.values())
    weights = sum(weight for _, _, weight in configs)
    rows = [
        Row(
            scenario,
            name,
            weight / weights,
            watch.seconds[job] / total_s if watch.knows_jobs and total_s else None,
            steps[job] / total_steps if total_steps else None,
            steps[job],
        )
        for job, (name, _, weight) in zip(jobs, configs, strict=True)
    ]
    return rows, {"collect tasks ended to move shares": moved}


def newcomer(
    cluster: LocalCluster, configs: Configs, settle_s: float, wait_s: float
) -> dict[str, Any]:
    first = [cluster.client.submit_job(configs.dqn()).job_id for _ in range(2)]
    time.sleep(settle_s)
    submitted = time.monotonic()
    late = cluster.client.submit_job(configs.dqn()).job_id
    waited = wait_for(
        "the newcomer's first env steps",
        lambda: env_steps(cluster, [late])[late] > 0,
        wait_s,
        since=submitted,
    )
    stop_all(cluster, [*first, late])
    return {"newcomer: s from its submission to its first env steps": waited}


def priority(
    cluster: LocalCluster, configs: Configs, settle_s: float, wait_s: float, collectors: int
) -> dict[str, Any]:
    low = [cluster.client.submit_job(configs.dqn()).job_id for _ in range(2)]
    time.sleep(settle_s)
    submitted = time.monotonic()
    urgent = cluster.client.submit_job(configs.dqn(priority=10)).job_id

    def held(job_id: str) -> int:
        share = getattr(cluster.client.job(job_id), "collector_share", None)
        return share.held if share is not None else 0

    took = wait_for(
        "the priority job holding every collector",
        lambda: held(urgent) == collectors and not any(held(j) for j in low),
        wait_s,
        since=submitted,
    )
    stepped = wait_for(
        "the priority job's first env steps",
        lambda: env_steps(cluster, [urgent])[urgent] > 0,
        wait_s,
        since=submitted,
    )
    time.sleep(5)
    steps = env_steps(cluster, low)
    time.sleep(5)
    low_steps_while = sum(env_steps(cluster, low).values()) - sum(steps.values())
    paused = env_steps(cluster, low)
    stopping = time.monotonic()
    cluster.client.stop_job(urgent)
    resumed = wait_for(
        "the others collecting again",
        lambda: all(n > paused[j] for j, n in env_steps(cluster, low).items()),
        wait_s,
        since=stopping,
    )
    stop_all(cluster, low)
    return {
        "priority: s from its submission until it holds every collector": took,
        "priority: s from its submission to its first env steps": stepped,
        "priority: the others' env steps in 5 s while it runs": low_steps_while,
        "priority: s from its stop request until the others collect again": resumed,
    }


def gang(
    cluster: LocalCluster, configs: Configs, window_s: float
) -> tuple[list[Row], dict[str, Any]]:
    configs = [
        ("ppo (sync, 2 collectors)", configs.ppo(collector_num=2), 1.0),
        ("dqn a", configs.dqn(), 1.0),
        ("dqn b", configs.dqn(), 1.0),
    ]
    jobs = [cluster.client.submit_job(config, name=name).job_id for name, config, _ in configs]
    moved = preempted(cluster, jobs)
    with Watch(cluster) as watch:
        time.sleep(window_s)
    statuses = {j: cluster.client.job(j) for j in jobs}
    moved = preempted(cluster, jobs) - moved
    stop_all(cluster, jobs)
    total_s = sum(watch.seconds.values())
    total_steps = sum(s.env_steps for s in statuses.values())
    rows = [
        Row(
            "gang",
            name,
            1 / 3,
            watch.seconds[job] / total_s if watch.knows_jobs and total_s else None,
            statuses[job].env_steps / total_steps if total_steps else None,
            statuses[job].env_steps,
            f"{statuses[job].train_iters} train iters, policy v{statuses[job].policy_version}",
        )
        for job, (name, _, _) in zip(jobs, configs, strict=True)
    ]
    return rows, {"gang: collect tasks ended to move shares": moved}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collectors", type=int, default=4)
    parser.add_argument("--learners", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--gang-s", type=float, default=60.0)
    parser.add_argument("--wait-s", type=float, default=30.0, help="longest wait timed")
    parser.add_argument("--scenarios", default="gang,equal,weighted,newcomer,priority")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--samples-per-insert",
        type=float,
        default=SAMPLES_PER_INSERT,
        help="the DQN jobs' rate limiter (the example's 16: env steps follow each learner)",
    )
    args = parser.parse_args()
    configs = Configs(samples_per_insert=args.samples_per_insert)
    scenarios = args.scenarios.split(",")
    rows: list[Row] = []
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # The gang runs on 3 collectors; the rest on all of them.
        first = 3 if "gang" in scenarios else args.collectors
        cluster = LocalCluster(
            Path(tmp) / "run", num_collectors=first, num_learners=args.learners, fork_server=True
        )
        cluster.start()
        try:
            cluster.wait_for_workers()
            if "gang" in scenarios:
                got, more = gang(cluster, configs, args.gang_s)
                rows += got
                figures.update(more)
                for _ in range(args.collectors - first):
                    cluster.add_collector()
                cluster.wait_for_workers()
            for name, weights in (("equal", (1, 1, 1)), ("weighted", (1, 1, 2))):
                if name not in scenarios:
                    continue
                weighted = [(f"dqn share {w}", configs.dqn(share=w), float(w)) for w in weights]
                got, more = shares_over(cluster, name, weighted, args.settle_s, args.window_s)
                rows += got
                figures.update({f"{name}: {k}": v for k, v in more.items()})
            if "newcomer" in scenarios:
                figures.update(newcomer(cluster, configs, args.settle_s, args.wait_s))
            if "priority" in scenarios:
                figures.update(
                    priority(cluster, configs, args.settle_s, args.wait_s, args.collectors)
                )
        finally:
            cluster.stop()
    table = Table(
        title=f"Shares of {args.collectors} collectors and {args.learners} learners "
        f"({args.window_s:.0f} s windows after {args.settle_s:.0f} s)"
    )
    for column in (
        "scenario",
        "job",
        "owed",
        "collector-s",
        "vs owed",
        "env steps",
        "vs owed",
        "steps",
        "note",
    ):
        table.add_column(
            column, justify="left" if column in ("scenario", "job", "note") else "right"
        )
    for row in rows:
        table.add_row(
            row.scenario,
            row.job,
            f"{row.owed:.3f}",
            "-" if row.collector_share is None else f"{row.collector_share:.3f}",
            row.deviation(row.collector_share),
            "-" if row.step_share is None else f"{row.step_share:.3f}",
            row.deviation(row.step_share),
            f"{row.env_steps:,}",
            row.note,
        )
    console = Console(width=160)
    console.print(table)
    other = Table(title="Waits and moves")
    other.add_column("figure")
    other.add_column("value", justify="right")
    for key, value in figures.items():
        shown = (
            "not within the wait"
            if value is None
            else (f"{value:.2f}" if isinstance(value, float) else f"{value:,}")
        )
        other.add_row(key, shown)
    console.print(other)
    if args.json:
        args.json.write_text(
            json.dumps({"rows": [row.__dict__ for row in rows], "figures": figures}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
