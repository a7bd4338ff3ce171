"""Single-process stable-baselines3 DQN on CartPole-v1 to mean greedy eval return 195:
the reference that bench/whole_run.py times as a whole process (python's start and the
imports included).

    python -m bench.sb3_cartpole SEED [--eval-episodes 10] [--eval-every-steps 400]
        [--torch-threads N]

The hyperparameters are rl-baselines3-zoo's for CartPole-v1 (hyperparams/dqn.yml).
An EvalCallback plays `--eval-episodes` greedy episodes on its own env every
`--eval-every-steps` env steps and StopTrainingOnRewardThreshold ends training at the
first mean at or above 195. Prints one JSON line: whether the goal was reached, the env
steps taken, the best mean eval return, and seconds spent importing and training.

Needs the optional extra `sb3` (`pip install -e '.[sb3]'`).
"""

from __future__ import annotations

import argparse
import json
import time

STARTED_S = time.monotonic()

import gymnasium as gym  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.callbacks import (  # noqa: E402
    EvalCallback,
    StopTrainingOnRewardThreshold,
)
from stable_baselines3.common.monitor import Monitor  # noqa: E402

IMPORTED_S = time.monotonic()

#: rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1.
ZOO_TIMESTEPS = 50_000
ZOO_HYPERPARAMS = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
GOAL_RETURN = 195.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", type=int)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--eval-every-steps", type=int, default=400)
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch's threads (default: torch's own)"
    )
    args = parser.parse_args()
    if args.torch_threads is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
    env = gym.make("CartPole-v1")
    # Monitor: episode returns as the env gives them (what EvalCallback asks for).
    eval_env = Monitor(gym.make("CartPole-v1"))
    eval_env.reset(seed=args.seed + 10_000)
    stop = StopTrainingOnRewardThreshold(reward_threshold=GOAL_RETURN, verbose=0)
    evaluate = EvalCallback(
        eval_env,
        callback_on_new_best=stop,
        n_eval_episodes=args.eval_episodes,
        eval_freq=args.eval_every_steps,
        deterministic=True,
        verbose=0,
    )
    model = DQN("MlpPolicy", env, seed=args.seed, verbose=0, **ZOO_HYPERPARAMS)
    model.learn(total_timesteps=ZOO_TIMESTEPS, callback=evaluate)
    done_s = time.monotonic()
    print(
        json.dumps(
            {
                "reached": bool(evaluate.best_mean_reward >= GOAL_RETURN),
                "env_steps": int(model.num_timesteps),
                "best_eval": float(evaluate.best_mean_reward),
                "import_s": IMPORTED_S - STARTED_S,
                "train_s": done_s - IMPORTED_S,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
