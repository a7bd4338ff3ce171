"""A job's buffer process killed again and again beside another job: does its job fail,
naming it, and does the other job's collection go on at its rate?

    python bench/buffer_restarts.py [--kills 20] [--window-s 60]

A local cluster (coordinator, 2 collectors, 2 learners) runs two DQN CartPole jobs
without goals, a collector and a learner each. The other job's env steps/s are measured
for `--window-s` with nothing happening (the reference), then for as long again while
the first job's buffer process is killed (SIGKILL) each time it is back, up to `--kills`
times: the coordinator restarts it with a growing backoff, and past
`DROVER_BUFFER_MAX_RESTARTS` (5) in its window fails its job with the reason.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.learner_scaling import cpu_line  # noqa: E402
from common.config import deep_merge  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from tests.helpers import buffer_processes, wait_until  # noqa: E402

JOB = deep_merge(
    yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()),
    {
        "env": {"stop_value": None, "n_evaluator_episode": 2},
        "system": {"max_env_step": 10**8, "collector_num": 1},
    },
)


def rate(cluster: LocalCluster, job_id: str, seconds: float, during=lambda: None) -> float:
    """The job's env steps a second over `seconds`, calling `during()` meanwhile."""
    start_steps, started = cluster.client.job(job_id).env_steps, time.monotonic()
    while time.monotonic() - started < seconds:
        during()
        time.sleep(0.1)
    return (cluster.client.job(job_id).env_steps - start_steps) / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--window-s", type=float, default=60.0)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp) / "run", num_collectors=2, num_learners=2) as cluster,
    ):
        cluster.wait_for_workers()
        doomed = cluster.client.submit_job(JOB).job_id
        other = cluster.client.submit_job(JOB).job_id
        wait_until(lambda: cluster.client.job(other).train_iters > 0, 120, "training")
        reference = rate(cluster, other, args.window_s)
        killed: set[int] = set()
        failed_after_s = None
        started = time.monotonic()

        def kill_it() -> None:
            nonlocal failed_after_s
            if failed_after_s is None and cluster.client.job(doomed).phase != "running":
                failed_after_s = time.monotonic() - started
            pid = buffer_processes(cluster.coordinator.process.pid).get(doomed)
            if pid is not None and pid not in killed and len(killed) < args.kills:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)

        during = rate(cluster, other, args.window_s, kill_it)
        status = cluster.client.job(doomed)
        other_phase = cluster.client.job(other).phase
    table = Table(title=f"a buffer process killed each time it is back ({cpu_line()})")
    for column in (
        "kills",
        "its job",
        "failed after",
        "the other job's env steps/s: before",
        "while killed",
        "ratio",
        "the other job",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        str(len(killed)),
        status.phase,
        "-" if failed_after_s is None else f"{failed_after_s:.1f} s",
        f"{reference:,.0f}",
        f"{during:,.0f}",
        f"{during / reference:.2f}",
        other_phase,
    )
    Console(width=180).print(table)
    print(f"its reason: {status.reason}")
    return 0 if status.phase == "failed" and other_phase == "running" else 1


if __name__ == "__main__":
    sys.exit(main())
