"""DQN's acting side: epsilon-greedy actions while collecting, greedy ones when
evaluating. Epsilon decays with the whole job's env steps (`policy.other.eps`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from algorithms.dqn.config import EpsConfig
from algorithms.dqn.networks import QNetwork
from algorithms.export import Acting, greedy_q, obs_port
from common.config import PolicyConfig
from common.models import load_numpy_state


@dataclass(frozen=True)
class EpsilonSchedule:
    config: EpsConfig

    def __call__(self, env_steps: int) -> float:
        c = self.config
        if c.type == "linear":
            return max(c.end, c.start - (c.start - c.end) * env_steps / c.decay)
        return c.end + (c.start - c.end) * math.exp(-env_steps / c.decay)


class QActor:
    """What acting on a Q-network takes, whatever the exploration: the network (a
    variant's head through `make_network`), its loaded version, greedy actions."""

    def __init__(self, config: PolicyConfig) -> None:
        assert config.model.action_shape is not None
        self.num_actions = config.model.action_shape
        self.device = torch.device(config.torch_device)
        self.network = self.make_network(config).to(self.device).eval()
        self.obs = obs_port(config.model)
        self.version = 0
        self.loaded = False

    def make_network(self, config: PolicyConfig) -> torch.nn.Module:
        """The Q-network: a module whose forward gives each action's expected return."""
        return QNetwork(config.model)

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action

    def acting(self) -> Acting:
        """What `greedy` does, as a plain network (algorithms/export.py)."""
        return greedy_q(self.network, self.obs, self.num_actions)

    def _argmax(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            q = self.network(torch.as_tensor(obs, device=self.device))
        return q.argmax(dim=1).cpu().numpy()


class QPolicy(QActor):
    """A Q-network acting epsilon-greedily; random until the first version arrives."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self.epsilon = EpsilonSchedule(config.other.eps)

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation."""
        return self._act(obs, 0.0, rng)

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        return self._act(obs, self.epsilon(job_env_steps), rng)

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        return {"epsilon": round(self.epsilon(job_env_steps), 4)}

    def _act(self, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        explore = rng.random(n) < eps if self.loaded else np.ones(n, dtype=bool)
        actions = rng.integers(0, self.num_actions, size=n)
        if not explore.all():
            actions = np.where(explore, actions, self._argmax(obs))
        return actions
