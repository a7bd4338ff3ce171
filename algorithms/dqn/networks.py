"""DQN's network: an observation encoder (an MLP for vectors, a CNN for images) and
a Q head, optionally dueling."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig
from common.models import make_encoder


class QNetwork(nn.Module):
    """Q-values from an encoder's features, optionally with a dueling head
    (V + A - mean A)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        self.encoder = make_encoder(config)
        features = self.encoder.out_features
        self.dueling = config.dueling
        if self.dueling:
            self.advantage = nn.Linear(features, config.action_shape)
            self.value = nn.Linear(features, 1)
        else:
            self.head = nn.Linear(features, config.action_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.encoder(obs)
        if not self.dueling:
            return self.head(features)
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(dim=-1, keepdim=True)
