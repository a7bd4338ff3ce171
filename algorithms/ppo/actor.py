"""PPO's acting side (IMPALA's too): sampled actions with their log-probabilities and
the critic's values while collecting, the most likely action when evaluating."""

from __future__ import annotations

import numpy as np
import torch

from algorithms.export import Acting, actor_critic_mode, obs_port
from algorithms.ppo.networks import ActorCritic, Shape
from common.config import PolicyConfig
from common.models import load_numpy_state


class ActorCriticPolicy:
    """Samples actions and records their log-probabilities and values; `greedy` is the
    deterministic action, for evaluation."""

    def __init__(self, config: PolicyConfig) -> None:
        model = config.model
        self.device = torch.device(config.torch_device)
        self.network = ActorCritic(model, Shape.of(config)).to(self.device).eval()
        self.obs = obs_port(model)
        self.num_actions = model.action_shape
        self.continuous = model.action_space == "continuous"
        self.low = np.asarray(model.action_low, dtype=np.float32) if self.continuous else None
        self.high = np.asarray(model.action_high, dtype=np.float32) if self.continuous else None
        self.version = 0
        self.loaded = False

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        # uint8 images go to the device as they are (a quarter of float32's bytes); the
        # network's encoder casts and scales them.
        return torch.as_tensor(obs, device=self.device)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """What the env receives: a Gaussian sample clipped to the action bounds."""
        return np.clip(action, self.low, self.high) if self.continuous else action

    def acting(self) -> Acting:
        """What `greedy` does (without a legal-action mask), as a plain network
        (algorithms/export.py)."""
        bounds = (self.low, self.high) if self.continuous else None
        return actor_critic_mode(self.network, self.obs, self.num_actions, bounds)

    def _mask(self, mask: np.ndarray | None) -> torch.Tensor | None:
        return None if mask is None else torch.as_tensor(mask, device=self.device)

    def sample(
        self, obs: np.ndarray, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, their log-probabilities, state values) for a batch of obs; with a
        legal-action `mask` (a row per obs), only allowed actions are drawn."""
        with torch.inference_mode():
            dist, value = self.network.distribution_and_value(self._tensor(obs), self._mask(mask))
            action = dist.sample()
            logp = self.network.log_prob(dist, action)
        return action.cpu().numpy(), logp.cpu().numpy(), value.cpu().numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.network.value(self._tensor(obs)).cpu().numpy()

    def scale_rewards(self, reward: np.ndarray) -> np.ndarray:
        """Rewards as the advantages are computed from: divided by the spread of the
        discounted return this version carries (`policy.normalize.reward`), else as
        they are."""
        norm = self.network.return_norm
        if norm is None:
            return reward
        with torch.inference_mode():
            scaled = norm.scale(torch.as_tensor(reward, dtype=torch.float32))
        return scaled.numpy()

    def greedy(
        self, obs: np.ndarray, rng: np.random.Generator, mask: np.ndarray | None = None
    ) -> np.ndarray:
        """The env action for evaluation: the most likely one (the Gaussian's mean),
        among those `mask` allows when given."""
        with torch.inference_mode():
            action = self.network.mode(self._tensor(obs), self._mask(mask)).cpu().numpy()
        return self.env_action(action)
