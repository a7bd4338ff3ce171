"""A whole algorithm in one module, for tests that add it to the registry: linear
Q-learning on one-step transitions. It is what `algorithms/<name>/` holds, squeezed:
its spec (defaults, collect unit, action spaces, columns, factories), its
network, its acting side and its learning side.

    monkeypatch.setitem(ALGORITHMS, "toy", toy_algorithm.SPEC)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import torch
from annotated_types import Gt
from torch import nn

from algorithms.base import AlgorithmSpec
from algorithms.dqn import TRANSITIONS
from algorithms.step import finite_step
from algorithms.sync import LOCAL, GradientSync
from common.columns import ACTIONS, Column
from common.config import LearnConfig, PolicyConfig, TransitionPolicyConfig, section
from common.models import load_numpy_state

#: One-step transitions, and a vector column of its own: the Q-values the actor acted
#: on (one per action), which its actor records and its learner reports.
TOY_COLUMNS = (
    *TRANSITIONS,
    Column("acted_q", "float", shape=(ACTIONS,), from_actor=True),
)
COLUMNS = tuple(column.name for column in TOY_COLUMNS)
LEARNING_RATE = 0.05


@section
class ToyLearnConfig(LearnConfig):
    #: A knob of its own: TD errors beyond this are clipped in the loss (None: none).
    td_clip: Annotated[float, Gt(0)] | None = None


@section
class ToyConfig(TransitionPolicyConfig):
    type: Literal["toy"] = "toy"
    learn: ToyLearnConfig = field(default_factory=ToyLearnConfig)


def linear_q(policy: PolicyConfig) -> nn.Linear:
    assert policy.model.obs_shape is not None and policy.model.action_shape is not None
    return nn.Linear(policy.model.obs_shape, policy.model.action_shape)


class ToyActor:
    """Greedy in its linear Q-values, uniformly random until it has a version."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.network = linear_q(policy)
        self.num_actions = self.network.out_features
        self.version = 0
        self.loaded = False
        self._acted_q = np.zeros((0, self.num_actions), np.float32)

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        with torch.inference_mode():
            q = self.network(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        self._acted_q = q
        if not self.loaded:
            return rng.integers(0, self.num_actions, size=len(obs))
        return q.argmax(-1)

    def recorded(self) -> dict[str, np.ndarray]:
        return {"acted_q": self._acted_q}

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        return self.greedy(obs, rng)

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class ToyReport:
    loss: float
    q_mean: float
    td_abs: np.ndarray
    scalars: dict[str, float]


class ToyLearner:
    """Q-learning with a squared TD error and no target network."""

    def __init__(self, policy: ToyConfig, device: str | torch.device) -> None:
        self.td_clip = policy.learn.td_clip
        self.device = torch.device(device)
        self.online = linear_q(policy).to(self.device)
        self.optimizer = torch.optim.SGD(self.online.parameters(), lr=policy.learn.learning_rate)
        self.train_iter = 0
        self.skipped_updates = 0
        self.sync: GradientSync = LOCAL

    def learn_batch(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> ToyReport:
        t = {k: torch.as_tensor(columns[k], device=self.device) for k in COLUMNS}
        q = self.online(t["obs"]).gather(1, t["action"].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q = self.online(t["next_obs"]).max(dim=1).values
            target = t["reward"] + t["discount"] * (1.0 - t["done"]) * next_q
        td = target - q
        if self.td_clip is not None:
            td = td.clamp(-self.td_clip, self.td_clip)
        loss = (torch.as_tensor(weights, device=self.device) * td.pow(2)).mean()
        if finite_step(loss, self.optimizer, sync=self.sync) is None:
            self.skipped_updates += 1
        self.train_iter += 1
        loss_value, q_mean = float(loss.detach()), float(q.detach().mean())
        # The actor's own column, as its learner reads it: the Q-values acted on.
        acted_q_mean = float(np.mean(columns["acted_q"]))
        scalars = {
            "loss/td": loss_value,
            "value/q_mean": q_mean,
            "value/acted_q_mean": acted_q_mean,
        }
        return ToyReport(loss_value, q_mean, td.abs().detach().numpy(), scalars)

    def state_dict(self) -> dict:
        return {
            "online": self.online.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_iter": self.train_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.online.load_state_dict(state["online"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_iter = int(state["train_iter"])

    def load_policy(self, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.online, tensors)


SPEC = AlgorithmSpec(
    name="toy",
    defaults={"policy": {"learn": {"learning_rate": LEARNING_RATE}}},
    collect_unit="transitions",
    action_spaces=frozenset({"discrete"}),
    columns=TOY_COLUMNS,
    make_actor=ToyActor,
    make_learner=ToyLearner,
    config=ToyConfig,
)
