"""SAC's own config keys (DI-engine's names), on top of the sections every job has."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from common.config import CollectConfig, LearnConfig, PosFloat, TransitionPolicyConfig, section


@section
class SACLearnConfig(LearnConfig):
    #: Soft (Polyak) update factor of the target critics.
    target_theta: Annotated[float, Gt(0), Le(1)] = 0.005
    #: The entropy temperature it starts from (then tuned automatically).
    init_alpha: Annotated[float, Gt(0)] = 0.2
    #: The critics', the actor's and the temperature's own learning rates (None:
    #: `learning_rate`).
    learning_rate_q: PosFloat | None = None
    learning_rate_policy: PosFloat | None = None
    learning_rate_alpha: PosFloat | None = None


@section
class SACCollectConfig(CollectConfig):
    #: Env steps of uniformly random actions at the start of a job.
    random_collect_size: Annotated[int, Ge(0)] = 1000


@section
class SACConfig(TransitionPolicyConfig):
    type: Literal["sac"] = "sac"
    learn: SACLearnConfig = field(default_factory=SACLearnConfig)
    collect: SACCollectConfig = field(default_factory=SACCollectConfig)
