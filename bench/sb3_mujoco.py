"""One stable-baselines3 run of a drover example (SAC or PPO on a MuJoCo task), with the
example's own hyperparameters, evaluated as drover evaluates, and recorded as a drover
job: bench/parity.py's reference side, which `drover report` tables beside drover's.

    python -m bench.sb3_mujoco examples/mujoco/hopper_sac.yaml --seed 0 \\
        --budget 50000 --eval-every-steps 5000 --out RUN_FOLDER [--torch-threads N]

The example is resolved as drover resolves it (`jobconfig`) and its keys are handed to
stable-baselines3 under SB3's names (`sb3_kwargs`), so the two sides cannot drift
apart. Evaluation: `env.n_evaluator_episode` greedy (deterministic) episodes on an env
of their own every `--eval-every-steps` env steps once training began (SAC: after
`random_collect_size`, where drover's first evaluation also comes), and at the budget.

What it writes: `RUN_FOLDER/<job id>/coordinator/record.json`, a job record in the
coordinator's format (services/coordinator/snapshot.py) with the example's config,
each evaluation as an `EvalSummary` and a `MetricsPoint` every 1,000 env steps (what
`drover report` and `drover plot` read for env steps and wall time). Prints one JSON
line: env steps, train iterations, wall seconds, the last evaluation.

Needs the optional extras `sb3` and `mujoco`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import JobConfig, to_dict  # noqa: E402
from common.messages import EvalSummary, MetricsPoint, dump  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from jobconfig import load_config_file, resolve_job_config  # noqa: E402
from services.coordinator.snapshot import write_job_record  # noqa: E402

#: A metrics point every this many env steps: `drover report`'s wall time to a return.
METRICS_EVERY_STEPS = 1000


def sb3_kwargs(config: JobConfig) -> dict[str, Any]:
    """The example's hyperparameters under stable-baselines3's names."""
    policy = config.policy
    learn, hidden = policy.learn, list(policy.model.encoder_hidden_size_list)
    if policy.type == "sac":
        replay = policy.other.replay_buffer
        assert replay.samples_per_insert is not None, "SAC's examples set a replay ratio"
        return {
            "learning_rate": learn.learning_rate,
            "buffer_size": replay.replay_buffer_size,
            # SB3 acts at random for learning_starts steps and trains from then on:
            # drover's random_collect_size, with min_size_to_sample its equal.
            "learning_starts": policy.collect.random_collect_size,
            "batch_size": learn.batch_size,
            "tau": learn.target_theta,
            "gamma": policy.discount_factor,
            "train_freq": 1,
            # Updates per env step: drover's samples per insert over the batch.
            "gradient_steps": max(1, round(replay.samples_per_insert / learn.batch_size)),
            "ent_coef": f"auto_{learn.init_alpha}",
            "policy_kwargs": {"net_arch": hidden},
        }
    if policy.type == "ppo":
        from torch import nn

        model = policy.model
        return {
            "learning_rate": learn.learning_rate,
            # One env on SB3's side: its rollout is drover's whole round.
            "n_steps": policy.collect.n_sample,
            "batch_size": learn.batch_size,
            "n_epochs": learn.epoch_per_collect,
            "gamma": policy.discount_factor,
            "gae_lambda": policy.collect.gae_lambda,
            "clip_range": learn.clip_ratio,
            "ent_coef": learn.entropy_weight,
            # SB3's value loss is the mean squared error; drover's has a 1/2 before it.
            "vf_coef": learn.value_weight / 2,
            "max_grad_norm": learn.max_grad_norm,
            "normalize_advantage": learn.adv_norm,
            "policy_kwargs": {
                "log_std_init": model.log_std_init,
                "ortho_init": model.ortho_init,
                "activation_fn": {"relu": nn.ReLU, "tanh": nn.Tanh}[model.activation],
                "net_arch": {"pi": hidden, "vf": hidden},
            },
        }
    raise ValueError(
        f"policy.type {policy.type!r}: only sac and ppo have a stable-baselines3 side here"
    )


def normalize_kwargs(config: JobConfig) -> dict[str, Any] | None:
    """VecNormalize's arguments for a job that normalizes (PPO's `policy.normalize`;
    RL Zoo's `normalize: true`), its discount the job's; None for one that does not."""
    norm = getattr(config.policy, "normalize", None)
    if norm is None or not (norm.obs or norm.reward):
        return None
    return {
        "norm_obs": norm.obs,
        "norm_reward": norm.reward,
        "clip_obs": norm.clip_obs,
        "clip_reward": norm.clip_reward,
        "gamma": config.policy.discount_factor,
    }


def updates_by(config: JobConfig, kwargs: dict[str, Any], steps: int) -> int:
    """Gradient steps SB3 has taken by `steps` env steps: SAC `gradient_steps` an env
    step once learning started; PPO its epochs of minibatches a whole rollout."""
    if config.policy.type == "ppo":
        minibatches = -(-kwargs["n_steps"] // kwargs["batch_size"])
        return steps // kwargs["n_steps"] * kwargs["n_epochs"] * minibatches
    return max(0, steps - kwargs["learning_starts"]) * kwargs["gradient_steps"]


def first_eval_steps(config: JobConfig, eval_every_steps: int) -> int:
    """Env steps of the first evaluation: one interval after training began."""
    random_steps = getattr(config.policy.collect, "random_collect_size", 0)
    return random_steps + eval_every_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="a drover example (examples/mujoco/...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, required=True, help="env steps")
    parser.add_argument("--eval-every-steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the run folder it joins")
    parser.add_argument("--job-id", default=None, help="(default: sb3-<exp_name>-seed<N>)")
    parser.add_argument("--torch-threads", type=int, default=None)
    args = parser.parse_args()

    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    raw = load_config_file(args.config)
    raw.setdefault("system", {})["seed"] = args.seed
    raw["system"]["max_env_step"] = args.budget
    config, _ = resolve_job_config(raw)
    env_config = config.env
    job_id = args.job_id or f"sb3-{config.exp_name}-seed{args.seed}"
    kwargs = sb3_kwargs(config)
    normalize = normalize_kwargs(config)
    # Monitor: episode returns as the env gives them (what evaluate_policy asks for).
    eval_gym = Monitor(gym.make(env_config.env_id))
    eval_gym.reset(seed=args.seed + 10_000)
    train_gym = gym.make(env_config.env_id)
    env, eval_env = train_gym, eval_gym
    if normalize is not None:
        # As RL Zoo trains with `normalize: true`; evaluation sees observations
        # normalized by the training statistics of the moment, and raw rewards.
        env = VecNormalize(DummyVecEnv([lambda: train_gym]), **normalize)
        eval_env = VecNormalize(
            DummyVecEnv([lambda: eval_gym]),
            training=False,
            **(normalize | {"norm_reward": False}),
        )
        eval_env.seed(args.seed + 10_000)
    evals: list[EvalSummary] = []
    metrics: list[MetricsPoint] = []
    first_eval = first_eval_steps(config, args.eval_every_steps)

    class Recorder(BaseCallback):
        """Evaluations and metrics points at drover's cadence."""

        def _on_step(self) -> bool:
            steps = self.num_timesteps
            if steps % METRICS_EVERY_STEPS == 0:
                metrics.append(self.point())
            due = steps >= first_eval and (steps - first_eval) % args.eval_every_steps == 0
            if due and steps < args.budget:
                self.evaluate()
            return True

        def _on_training_end(self) -> None:
            # The policy the run ends with, as drover's final evaluation: once, after
            # the last update (PPO's last rollout runs past the budget to its end).
            self.evaluate()

        def point(self) -> MetricsPoint:
            return MetricsPoint(
                t=time.time(),
                env_steps=self.num_timesteps,
                train_iters=updates(self.num_timesteps),
                buffer_size=min(
                    self.num_timesteps, kwargs.get("buffer_size", kwargs.get("n_steps", 0))
                ),
                policy_version=0,
            )

        def evaluate(self) -> None:
            if normalize is not None:
                eval_env.obs_rms = env.obs_rms.copy()
            returns, _ = evaluate_policy(
                self.model,
                eval_env,
                n_eval_episodes=env_config.n_evaluator_episode,
                deterministic=True,
                return_episode_rewards=True,
            )
            returns = [float(r) for r in returns]
            evals.append(
                EvalSummary(
                    return_mean=statistics.fmean(returns),
                    return_std=statistics.pstdev(returns),
                    episodes=len(returns),
                    policy_version=len(evals) + 1,
                    train_iter=updates(self.num_timesteps),
                    env_steps=self.num_timesteps,
                    return_min=min(returns),
                    return_max=max(returns),
                )
            )
            # An evaluation's time is when its env steps were first seen (drover/plot.py
            # wall_seconds): a point before the evaluation places it there.
            metrics.append(self.point())

    def updates(steps: int) -> int:
        return updates_by(config, kwargs, steps)

    started = time.time()
    algorithm = PPO if config.policy.type == "ppo" else SAC
    model = algorithm("MlpPolicy", env, seed=args.seed, verbose=0, **kwargs)
    model.learn(total_timesteps=args.budget, callback=Recorder())
    finished = time.time()
    record = {
        "job_id": job_id,
        "name": f"{config.exp_name} (stable-baselines3)",
        "config": to_dict(config),
        "started_at": started,
        "running_since": started,
        "phase": "succeeded",
        "reason": f"max_env_step {args.budget} reached",
        "finished_at": finished,
        "env_steps": int(model.num_timesteps),
        "train_iters": updates(int(model.num_timesteps)),
        "evals": [dump(e) for e in evals],
        "metrics": [dump(p) for p in metrics],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_job_record(SharedStore(args.out), job_id, record)
    last = evals[-1] if evals else None
    print(
        json.dumps(
            {
                "job_id": job_id,
                "env_steps": record["env_steps"],
                "train_iters": record["train_iters"],
                "wall_s": finished - started,
                "last_eval": None if last is None else last.return_mean,
                "eval_steps": [int(e.env_steps) for e in evals],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
