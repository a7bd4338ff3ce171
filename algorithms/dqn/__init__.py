"""DQN: double DQN with a target network, a dueling head, n-step targets and
prioritized replay (Rainbow-lite), for discrete actions.

    networks.py  QNetwork
    actor.py     QPolicy: epsilon-greedy collecting, greedy evaluation
    learner.py   DQN: Huber loss on double-DQN n-step targets, importance weights
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.dqn.config import DQNConfig
from common.columns import Column

if TYPE_CHECKING:
    import torch

    from algorithms.dqn.actor import QPolicy
    from algorithms.dqn.learner import DQN
    from common.config import PolicyConfig

#: One n-step transition a row (the collector's n-step builder writes them; see
#: `TransitionBatch` for what each holds). SAC trains on the same.
TRANSITIONS = (
    Column("obs", "observation"),
    Column("action", "action"),
    Column("reward", "float"),
    Column("next_obs", "observation"),
    Column("done", "flag"),
    Column("discount", "float"),
)
TRANSITION_COLUMNS = tuple(column.name for column in TRANSITIONS)


def make_actor(policy: PolicyConfig) -> QPolicy:
    from algorithms.dqn.actor import QPolicy

    return QPolicy(policy)


def make_learner(policy: PolicyConfig, device: str | torch.device) -> DQN:
    from algorithms.dqn.learner import DQN

    return DQN(policy, device)


SPEC = AlgorithmSpec(
    name="dqn",
    defaults={},  # the shared sections' defaults are DQN's
    collect_unit="transitions",
    action_spaces=frozenset({"discrete"}),
    image_obs=True,
    columns=TRANSITIONS,
    make_actor=make_actor,
    make_learner=make_learner,
    config=DQNConfig,
)
