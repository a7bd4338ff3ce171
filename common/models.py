"""Neural networks shared by the learner (training) and the collector (acting)."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers)


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


def state_to_numpy(module: nn.Module) -> dict:
    """A module's parameters as CPU numpy arrays (for a safetensors policy file)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_numpy_state(module: nn.Module, tensors: dict) -> None:
    """Load parameters from numpy arrays; raises if names or shapes differ."""
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
