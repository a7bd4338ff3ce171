"""PPO: clipped surrogate objective, value loss, entropy bonus, GAE advantages and
minibatch epochs over on-policy rounds; discrete or Gaussian actions.

    networks.py  ActorCritic (IMPALA acts and learns with it too)
    actor.py     ActorCriticPolicy: sampled actions with log-probabilities and values
    learner.py   PPO: epochs of minibatches over one round
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.ppo.config import PPOConfig
from common.advantages import DISCOUNTED_RETURN
from common.columns import Column
from common.config import PolicyConfig

if TYPE_CHECKING:
    import torch

    from algorithms.ppo.actor import ActorCriticPolicy
    from algorithms.ppo.learner import PPO


def _normalizes_rewards(policy: PolicyConfig) -> bool:
    return bool(policy.normalize.reward)  # type: ignore[attr-defined]  # a PPOConfig


#: One step of a round a row, with the advantage and return the collectors computed
#: with GAE and the collecting version's critic.
ROUND_ROWS = (
    Column("obs", "observation"),
    Column("action", "action"),
    Column("logp", "float"),  # the behaviour policy's log-probability of the action
    Column("adv", "float"),  # GAE advantage, computed by the collector
    Column("ret", "float"),  # the value target: adv + V(obs)
    # Games: the actions that were legal; acting and the loss give the others no
    # probability.
    Column("action_mask", "mask", masked_only=True),
    # Reward normalization: the env's discounted return so far in the row's episode, of
    # which the learner keeps the running spread that the next versions' collectors
    # divide rewards by (algorithms/normalize.py).
    Column(DISCOUNTED_RETURN, "float", needs=_normalizes_rewards),
)
#: The columns of a job whose env gives no action masks and that normalizes no rewards.
COLUMNS = tuple(c.name for c in ROUND_ROWS if not c.masked_only and c.needs is None)


def make_actor(policy: PolicyConfig) -> ActorCriticPolicy:
    from algorithms.ppo.actor import ActorCriticPolicy

    return ActorCriticPolicy(policy)


def make_learner(policy: PolicyConfig, device: str | torch.device) -> PPO:
    from algorithms.ppo.learner import PPO

    return PPO(policy, device)


SPEC = AlgorithmSpec(
    name="ppo",
    defaults={
        "policy": {
            "model": {"encoder_hidden_size_list": [64, 64]},
            "learn": {"batch_size": 64, "learning_rate": 3e-4, "max_grad_norm": 0.5},
            "collect": {"n_sample": 2048},
            "other": {
                # Exactly one round's data, each item used in one round only.
                "replay_buffer": {
                    "type": "fifo",
                    "replay_buffer_size": 16384,
                    "min_size_to_sample": 1,
                    "max_staleness": 0,
                }
            },
        },
        "system": {"workflow": "sync"},
    },
    collect_unit="rounds",
    action_spaces=frozenset({"discrete", "continuous"}),
    image_obs=True,
    columns=ROUND_ROWS,
    make_actor=make_actor,
    make_learner=make_learner,
    config=PPOConfig,
)
