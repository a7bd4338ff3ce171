"""C51 and Rainbow: DQN with a distributional Q head (a categorical return
distribution over `policy.model.n_atom` atoms from `v_min` to `v_max`), for
discrete actions. Both train on DQN's n-step transitions with its double-Q targets,
dueling head, target network and prioritized replay (the priorities are the
distributional loss's KL divergences).

    c51      epsilon-greedy exploration (DQN's `policy.other.eps`)
    rainbow  noisy layers in the head (factorised Gaussian noise, `policy.model.sigma0`;
             one draw per policy version while collecting) in place of epsilon;
             n-step returns and prioritized replay by default

    config.py    C51Config, RainbowConfig: the support's keys and sigma0
    networks.py  NoisyLinear, DistributionalQNetwork
    actor.py     C51Policy, RainbowPolicy: collecting; greedy, noise-free evaluation
    learner.py   DistributionalDQN: the projected categorical loss
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.dqn import TRANSITIONS
from algorithms.rainbow.config import C51Config, RainbowConfig

if TYPE_CHECKING:
    import torch

    from algorithms.rainbow.actor import C51Policy, RainbowPolicy
    from algorithms.rainbow.learner import DistributionalDQN
    from common.config import PolicyConfig


def make_c51_actor(policy: PolicyConfig) -> C51Policy:
    from algorithms.rainbow.actor import C51Policy

    return C51Policy(policy)


def make_c51_learner(policy: PolicyConfig, device: str | torch.device) -> DistributionalDQN:
    from algorithms.rainbow.learner import DistributionalDQN

    return DistributionalDQN(policy, device, noisy=False)


def make_rainbow_actor(policy: PolicyConfig) -> RainbowPolicy:
    from algorithms.rainbow.actor import RainbowPolicy

    return RainbowPolicy(policy)


def make_rainbow_learner(policy: PolicyConfig, device: str | torch.device) -> DistributionalDQN:
    from algorithms.rainbow.learner import DistributionalDQN

    return DistributionalDQN(policy, device, noisy=True)


C51_SPEC = AlgorithmSpec(
    name="c51",
    defaults={},  # DQN's: 1-step returns, uniform replay, as DI-engine's c51
    collect_unit="transitions",
    action_spaces=frozenset({"discrete"}),
    image_obs=True,
    columns=TRANSITIONS,
    make_actor=make_c51_actor,
    make_learner=make_c51_learner,
    config=C51Config,
)

SPEC = AlgorithmSpec(
    name="rainbow",
    # Rainbow's parts that are DQN's options: on unless a job turns them off.
    defaults={"policy": {"nstep": 3, "other": {"replay_buffer": {"type": "prioritized"}}}},
    collect_unit="transitions",
    action_spaces=frozenset({"discrete"}),
    image_obs=True,
    columns=TRANSITIONS,
    make_actor=make_rainbow_actor,
    make_learner=make_rainbow_learner,
    config=RainbowConfig,
)
