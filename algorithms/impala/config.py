"""IMPALA's own config keys, on top of the sections every job has."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt

from common.config import LearnConfig, PolicyConfig, UnrollCollectConfig, section


@section
class IMPALALearnConfig(LearnConfig):
    #: V-trace's clip of the importance weights in its value targets (rho-bar).
    rho_clip: Annotated[float, Gt(0)] = 1.0
    #: V-trace's clip of the importance weights its corrections carry back (c-bar).
    c_clip: Annotated[float, Gt(0)] = 1.0
    #: The value loss's weight in the total loss.
    value_weight: Annotated[float, Ge(0)] = 0.5
    #: The entropy bonus's weight in the total loss.
    entropy_weight: Annotated[float, Ge(0)] = 0.01


@section
class IMPALAConfig(PolicyConfig):
    type: Literal["impala"] = "impala"
    learn: IMPALALearnConfig = field(default_factory=IMPALALearnConfig)
    collect: UnrollCollectConfig = field(default_factory=UnrollCollectConfig)
