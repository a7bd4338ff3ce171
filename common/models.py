"""Network building blocks and weight conversion shared by the algorithms (whose own
networks live in `algorithms/<name>/networks.py`), the learner and the collector."""

from __future__ import annotations

import torch
from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    """ReLU layers of the given sizes (an encoder: no output layer)."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers)


def state_to_numpy(module: nn.Module) -> dict:
    """A module's parameters as CPU numpy arrays (for a safetensors policy file)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_numpy_state(module: nn.Module, tensors: dict) -> None:
    """Load parameters from numpy arrays; raises if names or shapes differ."""
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
