"""PPO's network (IMPALA's too): separate actor and critic MLPs, with PPO's running
normalization of observations and rewards (algorithms/normalize.py) where asked."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from algorithms.normalize import RunningMeanStd
from common.config import ModelConfig, PolicyConfig, obs_shape_of
from common.models import encoder_kind, make_encoder

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


@dataclass(frozen=True)
class Shape:
    """How an ActorCritic's MLPs are built and what it normalizes (PPO's keys; IMPALA
    takes the defaults)."""

    activation: str = "tanh"
    ortho_init: bool = True
    log_std_init: float = 0.0
    #: Clip of standardized observations; None: observations are not normalized.
    obs_clip: float | None = None
    #: Clip of scaled rewards; None: rewards are not scaled.
    reward_clip: float | None = None

    @classmethod
    def of(cls, policy: PolicyConfig) -> Shape:
        from algorithms.ppo.config import PPOConfig

        if not isinstance(policy, PPOConfig):
            return cls()
        model, norm = policy.model, policy.normalize
        return cls(
            activation=model.activation,
            ortho_init=model.ortho_init,
            log_std_init=model.log_std_init,
            obs_clip=norm.clip_obs if norm.obs else None,
            reward_clip=norm.clip_reward if norm.reward else None,
        )


def hidden_mlp(
    sizes: list[int], activation: str = "tanh", ortho_init: bool = True
) -> nn.Sequential:
    """Hidden layers of `activation`; with `ortho_init`, orthogonal weights (gain
    sqrt 2) and zero biases, as PPO's reference implementations start them."""
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        linear = nn.Linear(fan_in, fan_out)
        if ortho_init:
            nn.init.orthogonal_(linear.weight, gain=2**0.5)
            nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATIONS[activation]()]
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Actor and critic. Vectors: separate tanh MLPs (PPO's reference setup). Images:
    one shared CNN encoder with linear actor and critic heads (as Atari PPO and IMPALA
    use). Discrete actions: the actor gives logits. Continuous actions: it gives the
    mean of a Gaussian whose log std is a learned parameter per action dimension
    (state-independent, as in PPO's paper).

    With `shape.obs_clip`, every input passes the running observation statistics
    (`obs_norm`) first; with `shape.reward_clip`, the network carries the running
    statistics of the discounted return (`return_norm`) that the collectors scale
    rewards by. Both are buffers: in its state dict, each version's policy file and
    its export."""

    def __init__(self, config: ModelConfig, shape: Shape = Shape()) -> None:
        super().__init__()
        if config.obs_shape is None or config.action_shape is None:
            raise ValueError("model.obs_shape and model.action_shape must be resolved first")
        hidden = list(config.encoder_hidden_size_list)
        self.continuous = config.action_space == "continuous"
        self.shared = encoder_kind(config) != "mlp"
        if shape.obs_clip is not None and self.shared:
            raise ValueError("policy.normalize.obs: observation normalization takes vectors")
        self.obs_norm = (
            RunningMeanStd(tuple(obs_shape_of(config)), shape.obs_clip)
            if shape.obs_clip is not None
            else None
        )
        self.return_norm = (
            RunningMeanStd((), shape.reward_clip) if shape.reward_clip is not None else None
        )
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
            act, ortho = shape.activation, shape.ortho_init
            self.actor = nn.Sequential(
                hidden_mlp([width, *hidden], act, ortho), nn.Linear(hidden[-1], config.action_shape)
            )
            self.critic = nn.Sequential(
                hidden_mlp([width, *hidden], act, ortho), nn.Linear(hidden[-1], 1)
            )
            last = self.actor[-1]
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((config.action_shape,), shape.log_std_init))
        if shape.ortho_init or self.shared:
            # Small last layers: a near-uniform first policy and near-zero first values.
            nn.init.orthogonal_(last.weight, gain=0.01)
            nn.init.zeros_(last.bias)

    def _vector(self, obs: torch.Tensor) -> torch.Tensor:
        """A vector observation as the MLPs take it: float, normalized where asked."""
        x = obs.float()
        return x if self.obs_norm is None else self.obs_norm(x)

    def heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output (logits, or the Gaussian's mean) and the state values."""
        if self.shared:
            features = self.encoder(obs)
            return self.actor(features), self.critic(features).squeeze(-1)
        x = self._vector(obs)
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
        return self._dist(self.actor(self._vector(obs)), mask)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.shared:
            return self.critic(self.encoder(obs)).squeeze(-1)
        return self.critic(self._vector(obs)).squeeze(-1)

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
