"""The acting side of a policy as a plain network, for use outside drover (`drover
export`: ONNX, TorchScript): each actor's `acting()` gives one of these modules with
the names, shapes and meanings of its inputs and outputs.

Every module takes what an env gives (observations as the env makes them: float32
vectors, uint8 images; preprocessing is inside) and gives the action the actor's
`greedy` would: the argmax of Q (DQN, Rainbow, C51, R2D2), the most likely action or
the Gaussian's mean clipped to the bounds (PPO, IMPALA), SAC's squashed mean scaled to
the bounds; with what it was chosen from (Q-values, logits, a mean and a log std,
the state value). R2D2's recurrent state is an explicit input and output: zeros at
an episode's start, the state out fed back in at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from common.config import ModelConfig, obs_shape_of
from common.models import encoder_kind


@dataclass(frozen=True)
class Port:
    """One input or output: its name, shape (`batch` the first axis), dtype, meaning."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str
    meaning: str


@dataclass
class Acting:
    module: nn.Module
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]


def obs_port(model: ModelConfig) -> Port:
    """The observations a model takes: float32 vectors, or images as uint8 (0-255)."""
    shape = obs_shape_of(model)
    if encoder_kind(model) == "mlp":
        return Port("obs", ("batch", *shape), "float32", "observations")
    return Port("obs", ("batch", *shape), "uint8", "images as the env gives them (0-255)")


class GreedyQ(nn.Module):
    """obs -> (the action of the highest Q, every action's Q)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.network(obs)
        return q.argmax(dim=1), q


def greedy_q(network: nn.Module, obs: Port, num_actions: int) -> Acting:
    return Acting(
        GreedyQ(network).eval(),
        (obs,),
        (
            Port("action", ("batch",), "int64", "the action of the highest Q"),
            Port("q", ("batch", num_actions), "float32", "each action's expected return"),
        ),
    )


class ActorCriticMode(nn.Module):
    """obs -> the most likely action (discrete: of the softmax of the logits;
    continuous: the Gaussian's mean clipped to the action bounds), the distribution's
    parameters and the state value."""

    def __init__(self, network: nn.Module, low: torch.Tensor | None, high: torch.Tensor | None):
        super().__init__()
        self.network = network
        self.continuous = low is not None
        if low is not None and high is not None:
            self.register_buffer("low", low)
            self.register_buffer("high", high)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, value = self.network.heads(obs)
        if not self.continuous:
            return torch.softmax(out, dim=-1).argmax(dim=-1), out, value
        action = torch.minimum(torch.maximum(out, self.low), self.high)
        return action, out, self.network.log_std.expand_as(out), value


def actor_critic_mode(
    network: nn.Module, obs: Port, num_actions: int, bounds: tuple | None
) -> Acting:
    value = Port("value", ("batch",), "float32", "the critic's state value")
    if bounds is None:
        outputs = (
            Port("action", ("batch",), "int64", "the most likely action"),
            Port("logits", ("batch", num_actions), "float32", "the policy's logits"),
            value,
        )
        return Acting(ActorCriticMode(network, None, None).eval(), (obs,), outputs)
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in bounds)
    outputs = (
        Port("action", ("batch", num_actions), "float32", "the mean, clipped to the bounds"),
        Port("mean", ("batch", num_actions), "float32", "the Gaussian's mean"),
        Port("log_std", ("batch", num_actions), "float32", "the Gaussian's log std"),
        value,
    )
    return Acting(ActorCriticMode(network, low, high).eval(), (obs,), outputs)


class SquashedMean(nn.Module):
    """obs -> SAC's evaluation action: tanh of the Gaussian's mean, scaled from [-1, 1]
    to the action bounds; and the Gaussian's mean and log std (before tanh)."""

    def __init__(self, network: nn.Module, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.network = network
        self.register_buffer("low", low)
        self.register_buffer("high", high)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.network.body(obs)
        mean = self.network.mean(features)
        log_std = self.network.log_std(features).clamp(
            self.network.LOG_STD_MIN, self.network.LOG_STD_MAX
        )
        action = self.low + (torch.tanh(mean) + 1.0) * 0.5 * (self.high - self.low)
        return action, mean, log_std


def squashed_mean(network: nn.Module, obs: Port, action_dim: int, bounds: tuple) -> Acting:
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in bounds)
    shape = ("batch", action_dim)
    outputs = (
        Port("action", shape, "float32", "tanh of the mean, scaled to the action bounds"),
        Port("mean", shape, "float32", "the Gaussian's mean, before tanh"),
        Port("log_std", shape, "float32", "the Gaussian's log std, before tanh"),
    )
    return Acting(SquashedMean(network, low, high).eval(), (obs,), outputs)


class RecurrentGreedyQ(nn.Module):
    """(obs, h, c) -> (the action of the highest Q, Q, the state after this step)."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(
        self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        q, (h_out, c_out) = self.network.step(obs, (h, c))
        return q.argmax(dim=1), q, h_out, c_out


def recurrent_greedy_q(network: nn.Module, obs: Port, num_actions: int, hidden: int) -> Acting:
    state = ("batch", hidden)
    return Acting(
        RecurrentGreedyQ(network).eval(),
        (
            obs,
            Port("h", state, "float32", "the LSTM's hidden state (zeros at an episode's start)"),
            Port("c", state, "float32", "the LSTM's cell state (zeros at an episode's start)"),
        ),
        (
            Port("action", ("batch",), "int64", "the action of the highest Q"),
            Port("q", ("batch", num_actions), "float32", "each action's expected return"),
            Port("h_out", state, "float32", "the hidden state to give the next step"),
            Port("c_out", state, "float32", "the cell state to give the next step"),
        ),
    )
