"""PPO's own config keys (DI-engine's names), on top of the sections every job has."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from common.config import LearnConfig, PolicyConfig, RoundCollectConfig, section


@section
class PPOLearnConfig(LearnConfig):
    #: Passes over each round's data.
    epoch_per_collect: Annotated[int, Gt(0), Le(1000)] = 10
    #: The clip of the probability ratio in the surrogate objective.
    clip_ratio: Annotated[float, Gt(0), Le(1)] = 0.2
    #: The value loss's weight in the total loss.
    value_weight: Annotated[float, Ge(0)] = 0.5
    #: The entropy bonus's weight in the total loss.
    entropy_weight: Annotated[float, Ge(0)] = 0.0
    #: Normalize advantages within each minibatch.
    adv_norm: bool = True


@section
class PPOConfig(PolicyConfig):
    type: Literal["ppo"] = "ppo"
    learn: PPOLearnConfig = field(default_factory=PPOLearnConfig)
    collect: RoundCollectConfig = field(default_factory=RoundCollectConfig)
