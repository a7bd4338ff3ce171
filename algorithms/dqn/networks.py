"""DQN's network: an MLP Q-function with an optional dueling head."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig
from common.models import mlp


class QNetwork(nn.Module):
    """An MLP Q-function, optionally with a dueling head (V + A - mean A)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        hidden = list(config.encoder_hidden_size_list)
        self.encoder = mlp([config.obs_shape, *hidden])
        self.dueling = config.dueling
        if self.dueling:
            self.advantage = nn.Linear(hidden[-1], config.action_shape)
            self.value = nn.Linear(hidden[-1], 1)
        else:
            self.head = nn.Linear(hidden[-1], config.action_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.encoder(obs)
        if not self.dueling:
            return self.head(features)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(dim=-1, keepdim=True)
