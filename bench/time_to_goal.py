"""Time to CartPole's goal with `drover run`'s processes, over several seeds.

For each seed: start a coordinator, 2 collectors and a learner as local processes
(exactly what `drover run` starts), submit examples/cartpole_dqn.yaml, and time from
before the first process starts until the job has succeeded. Then one real
`drover run` command, timed end to end (start to exit, shutdown included), and a
collect-only job without a rate limit to show what one collector can do.

    python bench/time_to_goal.py [--seeds 5]

Prints a table; run it on a quiet machine and compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import deep_merge  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from jobconfig import load_config_file  # noqa: E402

EXAMPLE = ROOT / "examples" / "cartpole_dqn.yaml"


def collector_progress(cluster: LocalCluster) -> list[dict]:
    out = []
    for worker in cluster.client.workers():
        out += [p for t, p in worker.progress.items() if t.startswith("collect-")]
    return out


def one_seed(seed: int, work: Path, deadline_s: float, example: Path = EXAMPLE) -> dict:
    config = deep_merge(load_config_file(example), {"system": {"seed": seed}})
    started = time.monotonic()
    cluster = LocalCluster(work / f"seed{seed}", num_collectors=2)
    try:
        cluster.start()
        job_id = cluster.client.submit_job(config).job_id
        rates: list[dict] = []
        while True:
            status = cluster.client.job(job_id)
            progress = collector_progress(cluster)
            if progress:
                rates = progress
            if status.phase != "running":
                break
            if time.monotonic() - started > deadline_s:
                cluster.client.stop_job(job_id)
            time.sleep(0.1)
        wall_s = time.monotonic() - started
    finally:
        cluster.stop()
    return {
        "seed": seed,
        "ok": status.phase == "succeeded",
        "wall_s": wall_s,
        "env_steps": status.env_steps,
        "train_iters": status.train_iters,
        "eval": status.best_eval_return or 0.0,
        "collector_steps_per_s": [r.get("env_steps_per_s", 0.0) for r in rates],
        "collector_unthrottled": [r.get("unthrottled_env_steps_per_s", 0.0) for r in rates],
    }


def cli_run(work: Path) -> tuple[int, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "drover", "run", str(EXAMPLE), "--runs-dir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, time.monotonic() - started


def collect_capacity(work: Path, seconds: float = 8.0) -> list[float]:
    """Collectors with no rate limit and a learner that keeps up as it can."""
    config = deep_merge(
        load_config_file(EXAMPLE),
        {
            "env": {"stop_value": None},
            "policy": {"other": {"replay_buffer": {"samples_per_insert": None}}},
        },
    )
    with LocalCluster(work / "capacity", num_collectors=2) as cluster:
        job_id = cluster.client.submit_job(config).job_id
        time.sleep(seconds)
        progress = collector_progress(cluster)
        cluster.client.stop_job(job_id)
    return [p.get("env_steps_per_s", 0.0) for p in progress]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--deadline-s", type=float, default=120.0)
    args = parser.parse_args()
    console = Console(width=150)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = [one_seed(seed, work, args.deadline_s) for seed in range(args.seeds)]
        cli_rc, cli_wall_s = cli_run(work / "cli")
        capacity = collect_capacity(work)

    table = Table(title="DQN CartPole-v1 to eval return 195: coordinator + 2 collectors + learner")
    for col in (
        "seed",
        "succeeded",
        "wall s",
        "env steps",
        "train iters",
        "best eval",
        "collector steps/s (avg)",
        "collector steps/s (unthrottled)",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["seed"]),
            "yes" if r["ok"] else "NO",
            f"{r['wall_s']:.1f}",
            f"{r['env_steps']:,}",
            f"{r['train_iters']:,}",
            f"{r['eval']:.1f}",
            " / ".join(f"{x:,.0f}" for x in r["collector_steps_per_s"]),
            " / ".join(f"{x:,.0f}" for x in r["collector_unthrottled"]),
        )
    ok = [r for r in rows if r["ok"]]
    if ok:
        table.add_row(
            "median",
            f"{len(ok)}/{len(rows)}",
            f"{statistics.median(r['wall_s'] for r in ok):.1f}",
            f"{statistics.median(r['env_steps'] for r in ok):,.0f}",
            f"{statistics.median(r['train_iters'] for r in ok):,.0f}",
            "",
            "",
            "",
        )
    console.print(table)
    console.print(
        f"`drover run examples/cartpole_dqn.yaml`, start to exit: {cli_wall_s:.1f}s "
        f"(exit code {cli_rc})"
    )
    console.print(
        "collector capacity without a rate limit: "
        + " / ".join(f"{x:,.0f}" for x in capacity)
        + " env steps/s"
    )


if __name__ == "__main__":
    main()
