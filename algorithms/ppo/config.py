"""PPO's own config keys (DI-engine's names), on top of the sections every job has."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from common.config import (
    LearnConfig,
    ModelConfig,
    PolicyConfig,
    PosFloat,
    RoundCollectConfig,
    section,
)


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
class PPOModelConfig(ModelConfig):
    """The actor's and critic's MLPs (vector observations)."""

    #: Their hidden layers' activation: `tanh` (PPO's reference setup) or `relu`.
    activation: Literal["tanh", "relu"] = "tanh"
    #: Orthogonal initial weights (gain sqrt 2; the actor's last layer 0.01) and zero biases,
    #: as PPO's reference implementations start; false: torch's default initialization.
    ortho_init: bool = True
    #: Continuous actions: the Gaussian's initial log standard deviation (a learned
    #: parameter per action dimension).
    log_std_init: Annotated[float, Ge(-20), Le(2)] = 0.0


@section
class NormalizeConfig:
    """Running normalization of what the agent sees, its statistics kept in the network
    (each policy version acts, evaluates and exports with its own) and updated by the
    learner from each round it trained on."""

    #: Standardize observations by their running mean and variance (vector
    #: observations), clipped to +-`clip_obs`.
    obs: bool = False
    #: Divide rewards by the running standard deviation of each env's discounted
    #: return, clipped to +-`clip_reward`, before the collectors compute advantages
    #: (the episode returns reported stay the env's own).
    reward: bool = False
    #: The bound of standardized observations.
    clip_obs: PosFloat = 10.0
    #: The bound of scaled rewards.
    clip_reward: PosFloat = 10.0


@section
class PPOConfig(PolicyConfig):
    type: Literal["ppo"] = "ppo"
    model: PPOModelConfig = field(default_factory=PPOModelConfig)
    learn: PPOLearnConfig = field(default_factory=PPOLearnConfig)
    collect: RoundCollectConfig = field(default_factory=RoundCollectConfig)
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig)
