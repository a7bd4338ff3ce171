"""SAC's networks: the squashed Gaussian actor and the twin Q critics."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from common.config import ModelConfig
from common.models import mlp


class SquashedGaussianActor(nn.Module):
    """A Gaussian squashed by tanh into [-1, 1] per action dimension."""

    LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        hidden = list(config.encoder_hidden_size_list)
        self.body = mlp([config.obs_shape, *hidden])
        self.mean = nn.Linear(hidden[-1], config.action_shape)
        self.log_std = nn.Linear(hidden[-1], config.action_shape)

    def _gaussian(self, obs: torch.Tensor) -> torch.distributions.Normal:
        features = self.body(obs)
        log_std = self.log_std(features).clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)
        return torch.distributions.Normal(self.mean(features), log_std.exp())

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterized action in [-1, 1] and its log-probability."""
        gaussian = self._gaussian(obs)
        u = gaussian.rsample()
        action = torch.tanh(u)
        # The change of variables through tanh (in its numerically stable form).
        correction = 2 * (np.log(2) - u - torch.nn.functional.softplus(-2 * u))
        return action, (gaussian.log_prob(u) - correction).sum(-1)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mean(self.body(obs)))


class TwinQ(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.q1 = nn.Sequential(mlp([obs_dim + action_dim, *hidden]), nn.Linear(hidden[-1], 1))
        self.q2 = nn.Sequential(mlp([obs_dim + action_dim, *hidden]), nn.Linear(hidden[-1], 1))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)
