"""C51's and Rainbow's acting side: the action of highest expected return.

C51 collects epsilon-greedily (DQN's schedule, `policy.other.eps`). Rainbow has no
epsilon: it collects greedily on a noisy network. As NoisyNet's agent acts on one
draw of the noise between two optimisation steps, a collector acts on one draw per
policy version it loads (every `publish_every_iters` updates), drawn from a
generator seeded by the collector's rng: exploration that stays consistent over
several steps, rather than a new perturbation at each. Both evaluate greedily on
the noise-free network, and act at random until the first version arrives.
"""

from __future__ import annotations

import numpy as np
import torch

from algorithms.dqn.actor import QActor, QPolicy
from algorithms.export import Acting
from algorithms.rainbow.networks import DistributionalQNetwork, noise_sigma, with_noise
from common.config import PolicyConfig


class C51Policy(QPolicy):
    """DQN's epsilon-greedy acting, on the expected returns of the distributional
    network."""

    def make_network(self, config: PolicyConfig) -> DistributionalQNetwork:
        return DistributionalQNetwork(config.model, noisy=False)


class RainbowPolicy(QActor):
    """Greedy on a noisy network while collecting: the noise explores, one draw of it
    for each policy version."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self._noise: torch.Generator | None = None
        self._noise_version = -1
        self._sigma = float(noise_sigma(self.network))

    def make_network(self, config: PolicyConfig) -> DistributionalQNetwork:
        return DistributionalQNetwork(config.model, noisy=True)

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        super().load(version, tensors)
        self._sigma = float(noise_sigma(self.network))

    def acting(self) -> Acting:
        """The noise-free network, as `greedy` acts on it."""
        with_noise(self.network, False)
        return super().acting()

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation: greedy on the noise-free network."""
        with_noise(self.network, False)
        return self._argmax(obs)

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        if not self.loaded:
            return rng.integers(0, self.num_actions, size=len(obs))
        if self._noise is None:
            self._noise = torch.Generator().manual_seed(int(rng.integers(2**62)))
        if self._noise_version != self.version:
            self.network.reset_noise(self._noise)
            self._noise_version = self.version
        with_noise(self.network, True)
        return self._argmax(obs)

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        return {"noise_sigma": round(self._sigma, 4)}
