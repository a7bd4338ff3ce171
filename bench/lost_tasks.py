"""A collector that takes every task and runs none, beside two good ones: does the
job still evaluate at its `eval_freq`, and is the bad one held back?

    python bench/lost_tasks.py [--seconds 60] [--eval-freq 1000]

A local cluster (coordinator, 2 collectors, a learner) and a third collector that
answers every assignment as taken and never runs it (tests/black_hole.py: its
heartbeats list no task). The CartPole DQN example without its goal trains for
`--seconds`; the table says how many evaluations the job had against the count its
train iterations call for (one each `eval_freq`: 1,000, a few seconds apart, so that
the count is not bounded by how long an evaluation itself takes), the tasks the bad
collector lost,
and whether `GET /workers` showed it held back. Before drover held such workers back,
the idle bad collector was first in line for every evaluation and a job trained
44,800 iterations with `eval_freq: 200` and none at all.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import cpu_line  # noqa: E402
from common.config import deep_merge  # noqa: E402
from drover.local import LocalCluster  # noqa: E402


@dataclass
class LostTasksRun:
    seconds: float
    train_iters: int
    evaluations: int
    #: Evaluations the train iterations call for: one each eval_freq.
    expected: int
    lost_by_bad: int
    held_back_seen_s: float
    bad_worker: str


def run(root: Path, seconds: float, eval_freq: int) -> LostTasksRun:
    config = deep_merge(
        yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()),
        {
            "env": {"stop_value": None, "n_evaluator_episode": 2},
            "policy": {"eval": {"evaluator": {"eval_freq": eval_freq}}},
            "system": {"max_env_step": 10**8},
        },
    )
    # The bad collector is a test double (tests/black_hole.py): importable from here.
    with LocalCluster(root, num_collectors=2, extra_env={"PYTHONPATH": str(ROOT)}) as cluster:
        cluster.wait_for_workers()
        before = {w.worker_id for w in cluster.client.workers()}
        cluster.add_collector("tests.black_hole")
        deadline = time.monotonic() + 60
        while len(cluster.client.workers()) < len(before) + 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the bad collector did not register")
            time.sleep(0.1)
        (bad,) = [w.worker_id for w in cluster.client.workers() if w.worker_id not in before]
        job_id = cluster.client.submit_job(config).job_id
        started = time.monotonic()
        held_back_s = 0.0
        last = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(0.5)
            now = time.monotonic()
            for worker in cluster.client.workers():
                if worker.worker_id == bad and worker.held_back_s > 0:
                    held_back_s += now - last
            last = now
        status = cluster.client.job(job_id)
        evaluations = len(cluster.client.metrics(job_id)["evals"])
        text = cluster.coordinator.log_path.read_text()
        lost_by_bad = text.count(f"lost by {bad}")
    return LostTasksRun(
        seconds=seconds,
        train_iters=status.train_iters,
        evaluations=evaluations,
        expected=status.train_iters // eval_freq,
        lost_by_bad=lost_by_bad,
        held_back_seen_s=held_back_s,
        bad_worker=bad,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--eval-freq", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp) / "run", args.seconds, args.eval_freq)
    table = Table(title=f"a collector that takes tasks and runs none ({cpu_line()})")
    for column in (
        "seconds",
        "train iterations",
        "evaluations",
        "expected (train iterations / eval_freq)",
        "tasks it lost",
        "seconds shown held back",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        f"{result.seconds:.0f}",
        f"{result.train_iters:,}",
        str(result.evaluations),
        str(result.expected),
        str(result.lost_by_bad),
        f"{result.held_back_seen_s:.0f}",
    )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
