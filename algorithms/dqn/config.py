"""DQN's own config keys, on top of the sections every job has (common/config.py)."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Gt, Le

from common.config import (
    ConfigError,
    Fraction,
    LearnConfig,
    ModelConfig,
    OtherConfig,
    PosInt,
    TransitionPolicyConfig,
    section,
)


@section
class EpsConfig:
    #: How epsilon decays from `start` to `end`: exponentially or linearly.
    type: Literal["exp", "linear"] = "exp"
    #: The probability of a uniformly random action at the job's start, and at the end
    #: of the decay.
    start: Fraction = 0.95
    end: Fraction = 0.05
    #: Env steps (of the whole job) over which epsilon decays.
    decay: PosInt = 10_000


@section
class DQNModelConfig(ModelConfig):
    #: Separate value and advantage streams in the Q head.
    dueling: bool = True


@section
class DQNLearnConfig(LearnConfig):
    #: Hard target-network copy every this many train iterations.
    target_update_freq: PosInt = 100
    #: Soft (Polyak) target update factor; when set it replaces the hard copy.
    target_theta: Annotated[float, Gt(0), Le(1)] | None = None


@section
class DQNOtherConfig(OtherConfig):
    #: Epsilon-greedy exploration while collecting.
    eps: EpsConfig = field(default_factory=EpsConfig)


@section
class DQNConfig(TransitionPolicyConfig):
    type: Literal["dqn"] = "dqn"
    model: DQNModelConfig = field(default_factory=DQNModelConfig)
    learn: DQNLearnConfig = field(default_factory=DQNLearnConfig)
    other: DQNOtherConfig = field(default_factory=DQNOtherConfig)

    def check(self) -> None:
        eps = self.other.eps
        if eps.end > eps.start:
            raise ConfigError("policy.other.eps.end", f"{eps.end} is above start {eps.start}")
