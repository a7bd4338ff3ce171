"""Atari learning benchmark: Pong from pixels through the services, the evaluation
return against env frames.

A coordinator, collectors and a learner as local processes (what `drover run`
starts) train `examples/pong_<algo>.yaml` until the frame budget, the time limit or
the goal; every evaluation (whole games, the unclipped score) is a point of the
curve. Frames are agent steps x `env.frame_skip` (4), as Atari papers count them.

Anchors, from their papers and reference implementations (GPU, many actors):
CleanRL's PPO reaches about 20 at 10M frames; IMPALA's shallow network about 20
within 10-20M frames; DQN (Nature) needs about 10M frames, with Rainbow-like
settings 2-3M.

    python bench/atari_learning.py [--algo impala|ppo|dqn] [--frames 10000000]
        [--timeout-s 86400] [--collectors 2] [--device cuda] [--manager envpool]
        [--eval-freq 2000]

It is a long benchmark (`make bench-atari`): hours on a GPU machine; on a CPU-only
machine it shows the first part of the curve within the time limit.
"""

from __future__ import annotations

import argparse
import os
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

ANCHORS = {
    "ppo": "CleanRL PPO: ~20 at 10M frames",
    "impala": "IMPALA (shallow): ~20 within 10-20M frames",
    "dqn": "DQN (Nature): ~19 at 10M frames",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=sorted(ANCHORS), default="impala")
    parser.add_argument("--frames", type=int, default=10_000_000, help="env frames budget")
    parser.add_argument("--timeout-s", type=float, default=24 * 3600.0)
    parser.add_argument("--collectors", type=int, default=2)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the config's)")
    parser.add_argument("--manager", choices=("sync", "async", "envpool"), default=None)
    parser.add_argument("--poll-s", type=float, default=10.0)
    parser.add_argument(
        "--eval-freq", type=int, default=None, help="train iterations between evaluations"
    )
    args = parser.parse_args()

    config = load_config_file(ROOT / "examples" / f"pong_{args.algo}.yaml")
    frame_skip = int(config.get("env", {}).get("frame_skip", 4))
    overrides: dict = {
        "system": {"max_env_step": args.frames // frame_skip, "collector_num": args.collectors}
    }
    policy: dict = {}
    if args.device:
        policy["device"] = args.device
    if args.eval_freq:
        policy["eval"] = {"evaluator": {"eval_freq": args.eval_freq}}
    if policy:
        overrides["policy"] = policy
    if args.manager:
        overrides["env"] = {"manager": args.manager}
    config = deep_merge(config, overrides)

    console = Console(width=120)
    console.print(
        f"Pong {args.algo.upper()}: {os.cpu_count()} CPUs, budget {args.frames:,} frames, "
        f"time limit {args.timeout_s:,.0f} s; anchor: {ANCHORS[args.algo]}"
    )
    curve: list[tuple[int, float, float, int, float]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalCluster(Path(tmp) / "run", num_collectors=args.collectors) as cluster,
    ):
        started = time.monotonic()
        job_id = cluster.client.submit_job(config).job_id
        seen_version = -1
        while True:
            status = cluster.client.job(job_id)
            last = status.last_eval
            if last is not None and last.policy_version != seen_version:
                seen_version = last.policy_version
                wall_s = time.monotonic() - started
                point = (last.env_steps * frame_skip, last.return_mean, last.return_std,
                         last.train_iter, wall_s)  # fmt: skip
                curve.append(point)
                console.print(
                    f"{point[0]:>12,} frames  return {point[1]:6.1f} ± {point[2]:4.1f}  "
                    f"train iters {point[3]:,}  {wall_s:,.0f} s"
                )
            if status.phase != "running":
                break
            if time.monotonic() - started > args.timeout_s:
                cluster.client.stop_job(job_id)
                console.print("time limit reached: job stopped")
                stop_by = time.monotonic() + 30
                while status.phase == "running" and time.monotonic() < stop_by:
                    time.sleep(0.5)
                    status = cluster.client.job(job_id)
                break
            if dead := cluster.dead_services():
                console.print(f"a service died: {dead[0].name}\n{dead[0].log_tail()}")
                break
            time.sleep(args.poll_s)
        wall_s = time.monotonic() - started
    table = Table(title=f"Pong {args.algo.upper()}: evaluation return against env frames")
    for column in ("env frames", "return mean", "return std", "train iters", "wall s"):
        table.add_column(column, justify="right")
    for frames, mean, std, iters, seconds in curve:
        table.add_row(f"{frames:,}", f"{mean:.1f}", f"{std:.1f}", f"{iters:,}", f"{seconds:,.0f}")
    console.print(table)
    console.print(
        f"job {status.phase} after {wall_s:,.0f} s, {status.env_steps * frame_skip:,} frames "
        f"({status.env_steps * frame_skip / max(wall_s, 1e-9):,.0f} frames/s); "
        f"anchor: {ANCHORS[args.algo]}"
    )


if __name__ == "__main__":
    main()
