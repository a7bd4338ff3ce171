"""Learning benchmark: each algorithm to its threshold through the services.

For every (example config, threshold) below and each of `--seeds` seeds: a coordinator,
2 collectors and a learner as local processes (what `drover run` starts), timed from
the first process start until the job succeeded. Prints, per row, the success count
and the median env steps and wall time of the successful seeds.

    python bench/learning.py [--seeds 5] [--only ppo] [--env positions]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.time_to_goal import one_seed  # noqa: E402

#: (algorithm, env, threshold, example, deadline in s). A seed succeeds when its job
#: succeeded with a best evaluation at the threshold: a job that ran out of its env
#: step budget first did not.
RUNS = [
    ("DQN", "CartPole-v1", 475, "examples/cartpole_dqn_475.yaml", 300),
    ("PPO", "CartPole-v1", 475, "examples/cartpole_ppo.yaml", 300),
    ("PPO", "Acrobot-v1", -100, "examples/acrobot_ppo.yaml", 300),
    ("IMPALA", "CartPole-v1", 475, "examples/cartpole_impala.yaml", 300),
    ("SAC", "Pendulum-v1", -200, "examples/pendulum_sac.yaml", 400),
    # CartPole with its velocities hidden (env.observation_filter: [0, 2]): the same
    # services, a feed-forward DQN against R2D2's recurrent one.
    ("DQN", "CartPole-v1 positions only", 195, "examples/cartpole_pomdp_dqn.yaml", 600),
    ("R2D2", "CartPole-v1 positions only", 195, "examples/cartpole_pomdp_r2d2.yaml", 600),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", help="run only the rows of this algorithm (case-insensitive)")
    parser.add_argument("--env", help="run only the rows whose env contains this text")
    args = parser.parse_args()
    console = Console(width=140)
    table = Table(title=f"Time to threshold through the services, {args.seeds} seeds each")
    for column in (
        "algorithm",
        "env",
        "threshold",
        "succeeded",
        "median env steps",
        "median wall s",
        "env steps per seed",
        "best eval per seed",
    ):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for algo, env, threshold, example, deadline_s in RUNS:
            if args.only and args.only.lower() != algo.lower():
                continue
            if args.env and args.env.lower() not in env.lower():
                continue
            rows = [
                one_seed(seed, Path(tmp) / f"{algo}-{env}", deadline_s, ROOT / example)
                for seed in range(args.seeds)
            ]
            for r in rows:
                r["ok"] = r["ok"] and r["eval"] >= threshold
            ok = [r for r in rows if r["ok"]]
            table.add_row(
                algo,
                env,
                f">= {threshold:g}",
                f"{len(ok)}/{len(rows)}",
                f"{statistics.median(r['env_steps'] for r in ok):,.0f}" if ok else "-",
                f"{statistics.median(r['wall_s'] for r in ok):.1f}" if ok else "-",
                " / ".join(f"{r['env_steps']:,}{'' if r['ok'] else ' (failed)'}" for r in rows),
                " / ".join(f"{r['eval']:.0f}" for r in rows),
            )
            console.print(f"{algo} {env}: {len(ok)}/{len(rows)} succeeded")
    console.print(table)


if __name__ == "__main__":
    main()
