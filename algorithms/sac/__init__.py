"""SAC for continuous actions: a tanh-squashed Gaussian actor, twin Q critics with
Polyak-averaged targets, and automatic entropy tuning. It trains on DQN's n-step
transitions, with actions normalized to [-1, 1].

    networks.py  SquashedGaussianActor, TwinQ
    actor.py     SquashedGaussianPolicy: uniform, then sampled actions; the mean to evaluate
    learner.py   SAC: one critic, actor and temperature step a batch
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.dqn import TRANSITIONS
from algorithms.sac.config import SACConfig

if TYPE_CHECKING:
    import torch

    from algorithms.sac.actor import SquashedGaussianPolicy
    from algorithms.sac.learner import SAC
    from common.config import PolicyConfig


def make_actor(policy: PolicyConfig) -> SquashedGaussianPolicy:
    from algorithms.sac.actor import SquashedGaussianPolicy

    return SquashedGaussianPolicy(policy)


def make_learner(policy: PolicyConfig, device: str | torch.device) -> SAC:
    from algorithms.sac.learner import SAC

    return SAC(policy, device)


SPEC = AlgorithmSpec(
    name="sac",
    defaults={
        "policy": {
            "model": {"encoder_hidden_size_list": [256, 256]},
            "learn": {"batch_size": 256, "learning_rate": 3e-4},
            "other": {"replay_buffer": {"replay_buffer_size": 100_000}},
        },
    },
    collect_unit="transitions",
    action_spaces=frozenset({"continuous"}),
    columns=TRANSITIONS,
    make_actor=make_actor,
    make_learner=make_learner,
    config=SACConfig,
)
