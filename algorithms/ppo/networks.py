"""PPO's network (IMPALA's too): separate actor and critic MLPs."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig


def mlp_tanh(sizes: list[int]) -> nn.Sequential:
    """Tanh layers with orthogonal weights (gain sqrt 2) and zero biases, as PPO's
    reference implementations start them."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        linear = nn.Linear(fan_in, fan_out)
        nn.init.orthogonal_(linear.weight, gain=2**0.5)
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.Tanh()]
    return nn.Sequential(*layers)


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
