"""DQN's collector-side pieces: epsilon-greedy action selection and n-step transitions.

Each collected row is one n-step transition::

    obs, action, reward = sum_k gamma^k r_{t+k}, next_obs = o_{t+m},
    done = episode terminated within the m steps, discount = gamma^m   (m <= nstep)

so the learner's target is ``reward + discount * (1 - done) * Q_target(next_obs, a*)``.
A time-limit truncation is not `done`: the learner bootstraps from the last state.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np
import torch

from common.config import EpsConfig, ModelConfig, PolicyConfig
from common.models import ActorCritic, QNetwork, SquashedGaussianActor, load_numpy_state


@dataclass(frozen=True)
class EpsilonSchedule:
    config: EpsConfig

    def __call__(self, env_steps: int) -> float:
        c = self.config
        if c.type == "linear":
            return max(c.end, c.start - (c.start - c.end) * env_steps / c.decay)
        return c.end + (c.start - c.end) * math.exp(-env_steps / c.decay)


class EpisodeTracker:
    """Returns and lengths of the episodes a vector env finishes."""

    def __init__(self, num_envs: int) -> None:
        self._return = np.zeros(num_envs)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self._returns: list[float] = []
        self._lengths: list[int] = []

    def step(self, rewards: np.ndarray, ended: np.ndarray) -> list[tuple[int, float, int]]:
        """Count one vector step; returns (env, return, length) of each episode it ended."""
        self._return += rewards
        self._length += 1
        finished = [
            (int(i), float(self._return[i]), int(self._length[i])) for i in np.flatnonzero(ended)
        ]
        for i, ret, length in finished:
            self._returns.append(ret)
            self._lengths.append(length)
            self._return[i], self._length[i] = 0.0, 0
        return finished

    def take(self) -> tuple[list[float], list[int]]:
        """The episodes finished since the last call."""
        out = (self._returns, self._lengths)
        self._returns, self._lengths = [], []
        return out


class QPolicy:
    """A Q-network acting epsilon-greedily; random until the first version arrives."""

    def __init__(self, model: ModelConfig, device: str) -> None:
        assert model.action_shape is not None
        self.num_actions = model.action_shape
        self.device = torch.device(device)
        self.network = QNetwork(model).to(self.device).eval()
        self.version = 0
        self.loaded = False

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation."""
        return self.act(obs, 0.0, rng)

    def act(self, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
        n = len(obs)
        explore = rng.random(n) < eps if self.loaded else np.ones(n, dtype=bool)
        actions = rng.integers(0, self.num_actions, size=n)
        if not explore.all():
            with torch.inference_mode():
                q = self.network(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
            greedy = q.argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        return actions


class NStepBuilder:
    """Turns a vector env's steps into n-step transitions, one queue per env."""

    COLUMNS = ("obs", "action", "reward", "next_obs", "done", "discount")

    def __init__(self, num_envs: int, nstep: int, gamma: float) -> None:
        self.nstep = nstep
        self.gamma = gamma
        self._pending: list[collections.deque] = [collections.deque() for _ in range(num_envs)]
        self._rows: dict[str, list] = {c: [] for c in self.COLUMNS}

    def __len__(self) -> int:
        return len(self._rows["obs"])

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """One vector step; `next_obs` holds the true next observation, also at an
        episode's end (not the first observation of the next episode)."""
        for i, pending in enumerate(self._pending):
            pending.append((obs[i], actions[i], float(rewards[i])))
            if terminated[i] or truncated[i]:
                while pending:
                    self._emit(pending, next_obs[i], bool(terminated[i]))
                    pending.popleft()
            elif len(pending) == self.nstep:
                self._emit(pending, next_obs[i], False)
                pending.popleft()

    def _emit(self, pending: collections.deque, next_obs: np.ndarray, done: bool) -> None:
        ret = 0.0
        for k, (_, _, reward) in enumerate(pending):
            ret += self.gamma**k * reward
        first_obs, action, _ = pending[0]
        rows = self._rows
        rows["obs"].append(first_obs)
        rows["action"].append(action)
        rows["reward"].append(ret)
        rows["next_obs"].append(next_obs)
        rows["done"].append(done)
        rows["discount"].append(self.gamma ** len(pending))

    def take(self) -> dict[str, np.ndarray]:
        """All finished transitions as column arrays; the builder keeps the rest."""
        rows, self._rows = self._rows, {c: [] for c in self.COLUMNS}
        return {
            "obs": np.asarray(rows["obs"], dtype=np.float32),
            # discrete: action ids; continuous: actions normalized to [-1, 1]
            "action": np.asarray(rows["action"]).astype(
                np.float32 if np.asarray(rows["action"]).dtype.kind == "f" else np.int64
            ),
            "reward": np.asarray(rows["reward"], dtype=np.float32),
            "next_obs": np.asarray(rows["next_obs"], dtype=np.float32),
            "done": np.asarray(rows["done"], dtype=np.float32),
            "discount": np.asarray(rows["discount"], dtype=np.float32),
        }


class ActorCriticPolicy:
    """PPO's acting side: samples actions and records their log-probabilities and
    values; `act` is the deterministic action, for evaluation."""

    def __init__(self, model: ModelConfig, device: str) -> None:
        self.device = torch.device(device)
        self.network = ActorCritic(model).to(self.device).eval()
        self.continuous = model.action_space == "continuous"
        self.low = np.asarray(model.action_low, dtype=np.float32) if self.continuous else None
        self.high = np.asarray(model.action_high, dtype=np.float32) if self.continuous else None
        self.version = 0
        self.loaded = False

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """What the env receives: a Gaussian sample clipped to the action bounds."""
        return np.clip(action, self.low, self.high) if self.continuous else action

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, their log-probabilities, state values) for a batch of obs."""
        with torch.inference_mode():
            x = self._tensor(obs)
            dist = self.network.distribution(x)
            action = dist.sample()
            logp = self.network.log_prob(dist, action)
            value = self.network.value(x)
        return action.cpu().numpy(), logp.cpu().numpy(), value.cpu().numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.network.value(self._tensor(obs)).cpu().numpy()

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation: the most likely one (the Gaussian's mean)."""
        with torch.inference_mode():
            action = self.network.mode(self._tensor(obs)).cpu().numpy()
        return self.env_action(action)


class SquashedGaussianPolicy:
    """SAC's acting side: samples from the squashed Gaussian while collecting (uniform
    actions until `random_steps` env steps of the job, and before the first version),
    its mean when evaluating. Actions are kept in [-1, 1]; `env_action` scales them
    to the env's bounds."""

    def __init__(self, config: PolicyConfig) -> None:
        model = config.model
        self.device = torch.device(config.torch_device)
        self.network = SquashedGaussianActor(model).to(self.device).eval()
        self.low = np.asarray(model.action_low, dtype=np.float32)
        self.high = np.asarray(model.action_high, dtype=np.float32)
        self.random_steps = config.collect.random_collect_size
        self.env_steps = 0  # the job's, as the collector last heard
        self.version = 0
        self.loaded = False

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return self.low + (action + 1.0) * 0.5 * (self.high - self.low)

    def act(self, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
        """A collecting action in [-1, 1] (`eps` is DQN's; SAC explores by sampling)."""
        if not self.loaded or self.env_steps < self.random_steps:
            return rng.uniform(-1.0, 1.0, size=(len(obs), len(self.low))).astype(np.float32)
        with torch.inference_mode():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            return self.network.sample(x)[0].cpu().numpy()

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation: the squashed mean."""
        if not self.loaded:
            return self.env_action(self.act(obs, 0.0, rng))
        with torch.inference_mode():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            return self.env_action(self.network.mode(x).cpu().numpy())


def make_policy(config: PolicyConfig) -> QPolicy | ActorCriticPolicy | SquashedGaussianPolicy:
    """The acting side of the job's algorithm."""
    if config.type in ("ppo", "impala"):
        return ActorCriticPolicy(config.model, config.torch_device)
    if config.type == "sac":
        return SquashedGaussianPolicy(config)
    return QPolicy(config.model, config.torch_device)
