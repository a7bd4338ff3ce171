"""SAC's acting side: uniform actions for the job's first `random_collect_size` env
steps (and before the first version), then samples from the squashed Gaussian; its
mean when evaluating. Actions are recorded in [-1, 1]; `env_action` scales them to the
env's bounds, so the networks never see the bounds."""

from __future__ import annotations

import numpy as np
import torch

from algorithms.export import Acting, obs_port, squashed_mean
from algorithms.sac.networks import SquashedGaussianActor
from common.config import PolicyConfig
from common.models import load_numpy_state


class SquashedGaussianPolicy:
    def __init__(self, config: PolicyConfig) -> None:
        model = config.model
        self.device = torch.device(config.torch_device)
        self.network = SquashedGaussianActor(model).to(self.device).eval()
        self.obs = obs_port(model)
        self.low = np.asarray(model.action_low, dtype=np.float32)
        self.high = np.asarray(model.action_high, dtype=np.float32)
        self.random_steps = config.collect.random_collect_size
        self.version = 0
        self.loaded = False

    def load(self, version: int, tensors: dict[str, np.ndarray]) -> None:
        load_numpy_state(self.network, tensors)
        self.version, self.loaded = version, True

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return self.low + (action + 1.0) * 0.5 * (self.high - self.low)

    def act(self, obs: np.ndarray, rng: np.random.Generator, job_env_steps: int) -> np.ndarray:
        """A collecting action in [-1, 1]; SAC explores by sampling."""
        if not self.loaded or job_env_steps < self.random_steps:
            return self._uniform(obs, rng)
        with torch.inference_mode():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            return self.network.sample(x)[0].cpu().numpy()

    def exploration(self, job_env_steps: int) -> dict[str, float]:
        return {}  # the entropy temperature, which the learner tunes, is its exploration

    def greedy(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The env action for evaluation: the squashed mean."""
        if not self.loaded:
            return self.env_action(self._uniform(obs, rng))
        with torch.inference_mode():
            x = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
            return self.env_action(self.network.mode(x).cpu().numpy())

    def acting(self) -> Acting:
        """What `greedy` does once a version is loaded, as a plain network
        (algorithms/export.py)."""
        return squashed_mean(self.network, self.obs, len(self.low), (self.low, self.high))

    def _uniform(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, size=(len(obs), len(self.low))).astype(np.float32)
