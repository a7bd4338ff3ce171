"""Neural networks shared by the learner (training) and the collector (acting)."""

from __future__ import annotations

import numpy as np
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


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs. Discrete actions: the actor gives logits.
    Continuous actions: it gives the mean of a Gaussian whose log std is a learned
    parameter per action dimension (state-independent, as in PPO's paper)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        hidden = list(config.encoder_hidden_size_list)
        self.continuous = config.action_space == "continuous"
        self.actor = nn.Sequential(
            mlp_tanh([config.obs_shape, *hidden]), nn.Linear(hidden[-1], config.action_shape)
        )
        self.critic = nn.Sequential(mlp_tanh([config.obs_shape, *hidden]), nn.Linear(hidden[-1], 1))
        if self.continuous:
            self.log_std = nn.Parameter(torch.zeros(config.action_shape))
        # Small last layers: a near-uniform first policy and near-zero first values.
        nn.init.orthogonal_(self.actor[-1].weight, gain=0.01)
        nn.init.zeros_(self.actor[-1].bias)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(obs)
        if self.continuous:
            return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))
        return torch.distributions.Categorical(logits=out)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def log_prob(
        self, dist: torch.distributions.Distribution, action: torch.Tensor
    ) -> torch.Tensor:
        logp = dist.log_prob(action)
        return logp.sum(-1) if self.continuous else logp

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        entropy = dist.entropy()
        return entropy.sum(-1) if self.continuous else entropy

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action (for evaluation)."""
        out = self.actor(obs)
        return out if self.continuous else out.argmax(dim=-1)


class SquashedGaussianActor(nn.Module):
    """SAC's actor: a Gaussian squashed by tanh into [-1, 1] per action dimension."""

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


def mlp_tanh(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        linear = nn.Linear(fan_in, fan_out)
        nn.init.orthogonal_(linear.weight, gain=2**0.5)
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.Tanh()]
    return nn.Sequential(*layers)


def state_to_numpy(module: nn.Module) -> dict:
    """A module's parameters as CPU numpy arrays (for a safetensors policy file)."""
    return {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}


def load_numpy_state(module: nn.Module, tensors: dict) -> None:
    """Load parameters from numpy arrays; raises if names or shapes differ."""
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
