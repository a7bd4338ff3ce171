"""The same algorithms in one process, for comparison with the services.

Runs DQN and PPO from the example configs serially in a single process, with the same
components and hyperparameters as the distributed run (actors, n-step builder, replay
buffer and its samples-per-insert ratio, the algorithm files, greedy evaluation every
`eval_freq` train iterations), and reports env steps to the threshold over seeds.
`bench/learning.py` gives the distributed side; the issue's question is whether the
services need more env steps than this.

    python bench/single_process.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.dqn import TRANSITION_COLUMNS  # noqa: E402
from algorithms.dqn.actor import QPolicy  # noqa: E402
from algorithms.dqn.learner import DQN  # noqa: E402
from algorithms.ppo.actor import ActorCriticPolicy  # noqa: E402
from algorithms.ppo.learner import PPO  # noqa: E402
from common.config import JobConfig, deep_merge  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.messages import SegmentRef  # noqa: E402
from common.models import state_to_numpy  # noqa: E402
from jobconfig import fit_to_env, load_config_file, resolve_job_config  # noqa: E402
from services.buffer.core import ReplayBuffer  # noqa: E402
from services.collector.step_data import ROUND_COLUMNS, NStepBuilder, round_columns  # noqa: E402


class MemoryFiles:
    """Segments kept in a dict instead of files (one process needs no shared disk)."""

    def __init__(self) -> None:
        self.segments: dict[str, dict[str, np.ndarray]] = {}

    def delete(self, rel: str) -> bool:
        return self.segments.pop(rel, None) is not None


def load(example: str, seed: int) -> JobConfig:
    raw = deep_merge(load_config_file(ROOT / example), {"system": {"seed": seed}})
    config, _ = resolve_job_config(raw)
    return fit_to_env(config)


def evaluate(config: JobConfig, policy, seed: int) -> float:  # noqa: ANN001
    """Mean greedy return over n_evaluator_episode episodes, split evenly over envs."""
    episodes, num_envs = config.env.n_evaluator_episode, config.env.evaluator_env_num
    num_envs = min(num_envs, episodes)
    quota = np.full(num_envs, episodes // num_envs)
    quota[: episodes % num_envs] += 1
    env = make_env(config.env, num_envs)
    obs = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done, total, returns = np.zeros(num_envs, int), np.zeros(num_envs), []
    while (done < quota).any():
        step = env.step(policy.greedy(obs, rng))
        obs = step.obs
        total += step.reward
        for i in np.flatnonzero(step.ended):
            if done[i] < quota[i]:
                returns.append(total[i])
                done[i] += 1
            total[i] = 0.0
    env.close()
    return float(np.mean(returns))


def dqn_run(config: JobConfig, seed: int, max_steps: int) -> tuple[bool, int]:
    torch.manual_seed(seed)
    policy_cfg = config.policy
    files = MemoryFiles()
    replay = policy_cfg.other.replay_buffer
    # This loop keeps the samples-per-insert ratio itself (below), exactly.
    unlimited = dataclasses.replace(replay, samples_per_insert=None)
    buffer = ReplayBuffer("job-1", unlimited, files, error_buffer=0.0, seed=seed)
    dqn = DQN(policy_cfg)
    actor = QPolicy(policy_cfg)
    builder = NStepBuilder(
        config.env.collector_env_num, policy_cfg.nstep, policy_cfg.discount_factor
    )
    env = make_env(config.env, config.env.collector_env_num)
    obs = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    steps, seq, debt = 0, 0, 0.0
    spi = replay.samples_per_insert or 1.0
    learn = policy_cfg.learn
    next_eval = policy_cfg.eval.evaluator.eval_freq
    while steps < max_steps:
        actions = actor.act(obs, rng, steps)
        step = env.step(actions)
        builder.add(obs, actions, step.reward, step.final_obs, step.terminated, step.truncated)
        obs, steps = step.obs, steps + config.env.collector_env_num
        if len(builder) < policy_cfg.collect.n_sample:
            continue
        columns = builder.take()
        path = f"job-1/segments/w/{seq:08d}.safetensors"
        seq += 1
        files.segments[path] = columns
        ref = SegmentRef(path=path, rows=len(columns["obs"]), env_steps=0, policy_version=0)
        buffer.insert([ref], force=True)
        if buffer.size < replay.min_size_to_sample:
            continue
        # The same replay ratio the rate limiter holds the services to.
        debt += spi * len(columns["obs"]) / learn.batch_size
        while debt >= 1:
            debt -= 1
            (batch,) = buffer.sample(learn.batch_size, 1, timeout_s=0)
            parts = [
                {k: files.segments[s.path][k][s.rows] for k in TRANSITION_COLUMNS}
                for s in batch.segments
            ]
            cols = {k: np.concatenate([p[k] for p in parts]) for k in TRANSITION_COLUMNS}
            info_ = dqn.learn_batch(cols, np.asarray(batch.weights, np.float32))
            if replay.type == "prioritized":
                buffer.update_priorities(batch.keys, info_.td_abs.tolist())
            if dqn.train_iter % learn.publish_every_iters == 0:
                actor.load(dqn.train_iter, state_to_numpy(dqn.online))
            if dqn.train_iter >= next_eval:
                next_eval += policy_cfg.eval.evaluator.eval_freq
                actor.load(dqn.train_iter, state_to_numpy(dqn.online))
                if evaluate(config, actor, seed + dqn.train_iter) >= config.env.stop_value:
                    return True, steps
    return False, steps


def ppo_run(config: JobConfig, seed: int, max_steps: int) -> tuple[bool, int]:
    torch.manual_seed(seed)
    policy_cfg = config.policy
    ppo = PPO(policy_cfg)
    actor = ActorCriticPolicy(policy_cfg)
    num_envs = config.env.collector_env_num
    env = make_env(config.env, num_envs)
    obs = env.reset(seed=seed)
    steps = 0
    next_eval = policy_cfg.eval.evaluator.eval_freq
    rounds_steps = -(-policy_cfg.collect.n_sample // num_envs)
    while steps < max_steps:
        actor.load(ppo.train_iter, state_to_numpy(ppo.online))
        rec: dict[str, list] = {k: [] for k in ROUND_COLUMNS}
        for _ in range(rounds_steps):
            action, logp, value = actor.sample(obs)
            step = env.step(actor.env_action(action))
            for k, v in (
                ("obs", obs),
                ("action", action),
                ("logp", logp),
                ("value", value),
                ("reward", step.reward),
                ("terminated", step.terminated),
                ("ended", step.ended),
                ("next_value", actor.value(step.final_obs)),
            ):
                rec[k].append(v)
            obs, steps = step.obs, steps + num_envs
        ppo.train_round(round_columns(rec, policy_cfg))
        if ppo.train_iter >= next_eval:
            next_eval += policy_cfg.eval.evaluator.eval_freq
            actor.load(ppo.train_iter, state_to_numpy(ppo.online))
            if evaluate(config, actor, seed + ppo.train_iter) >= config.env.stop_value:
                return True, steps
    return False, steps


RUNS = [
    ("DQN", "examples/cartpole_dqn.yaml", dqn_run),
    ("DQN", "examples/cartpole_dqn_475.yaml", dqn_run),
    ("PPO", "examples/cartpole_ppo.yaml", ppo_run),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=300_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(title="One process, same components and hyperparameters")
    for column in (
        "algorithm",
        "config",
        "threshold",
        "succeeded",
        "median env steps",
        "median wall s",
    ):
        table.add_column(column, justify="right")
    for algo, example, run in RUNS:
        results = []
        for seed in range(args.seeds):
            config = load(example, seed)
            started = time.monotonic()
            ok, steps = run(config, seed, args.max_steps)
            results.append((ok, steps, time.monotonic() - started))
        ok = [r for r in results if r[0]]
        table.add_row(
            algo,
            example.split("/")[-1],
            f">= {config.env.stop_value:g}",
            f"{len(ok)}/{len(results)}",
            f"{statistics.median(r[1] for r in ok):,.0f}" if ok else "-",
            f"{statistics.median(r[2] for r in ok):.1f}" if ok else "-",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
