"""PPO's network (IMPALA's too): separate actor and critic MLPs."""

from __future__ import annotations

import torch
from torch import nn

from common.config import ModelConfig, obs_shape_of
from common.models import encoder_kind, make_encoder


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
    """Actor and critic. Vectors: separate tanh MLPs (PPO's reference setup). Images:
    one shared CNN encoder with linear actor and critic heads (as Atari PPO and IMPALA
    use). Discrete actions: the actor gives logits. Continuous actions: it gives the
    mean of a Gaussian whose log std is a learned parameter per action dimension
    (state-independent, as in PPO's paper)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        hidden = list(config.encoder_hidden_size_list)
        self.continuous = config.action_space == "continuous"
        self.shared = encoder_kind(config) != "mlp"
        if self.shared:
            self.encoder = make_encoder(config)
            features = self.encoder.out_features
            self.actor = nn.Linear(features, config.action_shape)
            self.critic = nn.Linear(features, 1)
            nn.init.orthogonal_(self.critic.weight, gain=1.0)
            nn.init.zeros_(self.critic.bias)
            last = self.actor
        else:
            width = obs_shape_of(config)[0]
            self.actor = nn.Sequential(
                mlp_tanh([width, *hidden]), nn.Linear(hidden[-1], config.action_shape)
            )
            self.critic = nn.Sequential(mlp_tanh([width, *hidden]), nn.Linear(hidden[-1], 1))
            last = self.actor[-1]
        if self.continuous:
            self.log_std = nn.Parameter(torch.zeros(config.action_shape))
        # Small last layers: a near-uniform first policy and near-zero first values.
        nn.init.orthogonal_(last.weight, gain=0.01)
        nn.init.zeros_(last.bias)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output (logits, or the Gaussian's mean) and the state values."""
        if self.shared:
            features = self.encoder(obs)
            return self.actor(features), self.critic(features).squeeze(-1)
        x = obs.float()
        return self.actor(x), self.critic(x).squeeze(-1)

    def _dist(
        self, out: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.distributions.Distribution:
        if self.continuous:
            return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))
        if mask is not None:
            # A masked action's logit is the lowest finite number: its probability is
            # exactly 0 and the entropy stays finite (an -inf logit would make it NaN).
            out = out.masked_fill(mask == 0, torch.finfo(out.dtype).min)
        return torch.distributions.Categorical(logits=out)

    def distribution_and_value(
        self, obs: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        """The policy's distribution (over the actions `mask` allows, when given) and
        the state values, with one pass through a shared encoder."""
        out, value = self.heads(obs)
        return self._dist(out, mask), value

    def distribution(
        self, obs: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.distributions.Distribution:
        if self.shared:
            return self._dist(self.actor(self.encoder(obs)), mask)
        return self._dist(self.actor(obs.float()), mask)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            return self.critic(self.encoder(obs)).squeeze(-1)
        return self.critic(obs.float()).squeeze(-1)

    def log_prob(
        self, dist: torch.distributions.Distribution, action: torch.Tensor
    ) -> torch.Tensor:
        logp = dist.log_prob(action)
        return logp.sum(-1) if self.continuous else logp

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        entropy = dist.entropy()
        return entropy.sum(-1) if self.continuous else entropy

    def mode(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The deterministic action (for evaluation): the most likely allowed one."""
        out = self.distribution(obs, mask)
        return out.mean if self.continuous else out.probs.argmax(dim=-1)
