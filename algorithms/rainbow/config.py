"""C51's and Rainbow's own config keys, on top of DQN's (algorithms/dqn/config.py).

The return distribution's support is DI-engine's `policy.model.v_min`, `v_max` and
`n_atom`. Rainbow's noisy layers take `policy.model.sigma0`, the scale their noise
starts at (DI-engine fixes it in its noisy layer, whose argument has this name).
Rainbow explores through that noise alone: it has no `policy.other.eps`.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from algorithms.dqn.config import DQNConfig, DQNLearnConfig, DQNModelConfig
from common.config import ConfigError, OtherConfig, TransitionPolicyConfig, section

#: An end of the support: finite, and within what a return can sensibly be.
SupportEnd = Annotated[float, Ge(-1e6), Le(1e6)]
#: The most atoms a support may have (at least 2: its ends).
MAX_ATOMS = 1024


@section
class C51ModelConfig(DQNModelConfig):
    #: The lowest atom of the return distribution's support. A target return below
    #: it counts as `v_min`: the support should cover the env's discounted returns.
    v_min: SupportEnd = -10.0
    #: The highest atom of the support; a target return above it counts as `v_max`.
    v_max: SupportEnd = 10.0
    #: Atoms in the support, evenly spaced from `v_min` to `v_max` (the Q head has
    #: actions x n_atom outputs).
    n_atom: Annotated[int, Ge(2), Le(MAX_ATOMS)] = 51


@section
class RainbowModelConfig(C51ModelConfig):
    #: Noisy layers' starting noise: each weight's and bias's sigma starts at
    #: sigma0 / sqrt(fan_in) (factorised Gaussian noise, Fortunato et al. 2018), and
    #: is learned from there.
    sigma0: Annotated[float, Gt(0), Le(10)] = 0.5


def check_support(model: C51ModelConfig) -> None:
    if model.v_min >= model.v_max:
        raise ConfigError("policy.model.v_max", f"{model.v_max} is not above v_min {model.v_min}")


@section
class C51Config(DQNConfig):
    """DQN's keys (epsilon-greedy exploration included) and the support's."""

    type: Literal["c51"] = "c51"
    model: C51ModelConfig = field(default_factory=C51ModelConfig)

    def check(self) -> None:
        super().check()
        check_support(self.model)


@section
class RainbowConfig(TransitionPolicyConfig):
    """DQN's keys but epsilon, the support's, and the noisy layers' sigma0."""

    type: Literal["rainbow"] = "rainbow"
    model: RainbowModelConfig = field(default_factory=RainbowModelConfig)
    learn: DQNLearnConfig = field(default_factory=DQNLearnConfig)
    other: OtherConfig = field(default_factory=OtherConfig)

    def check(self) -> None:
        check_support(self.model)
