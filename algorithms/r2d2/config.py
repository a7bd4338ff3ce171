"""R2D2's own config keys, on top of the sections every job has (common/config.py).

The sequence keys are DI-engine's: `policy.burnin_step` steps at each sequence's
start only warm the LSTM's state up, and `policy.unroll_len` steps after them are
learned on, so the replay buffer's sequences must be `burnin_step + unroll_len` rows
long (a sequence that starts its episode has no burn-in: its stored state, zeros, is
exact for any network, so it is learned from its first step). `policy.nstep` is the
learner's n-step return within a sequence; the collector writes single steps
(`collect_nstep`). Consecutive sequences must share at least `burnin_step + nstep`
rows (the buffer's `overlap`), which one learns and the other cannot.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from common.config import (
    ConfigError,
    Fraction,
    LearnConfig,
    ModelConfig,
    OtherConfig,
    TransitionPolicyConfig,
    section,
)

#: The longest sequence part a config may ask for (burn-in or learned steps): an
#: LSTM unrolled over thousands of steps per item is a mistake, not a setting.
MAX_SEQUENCE_STEPS = 1000
#: The default burn-in and learned steps of a sequence (the replay buffer's default
#: `sequence_length` is their sum: algorithms/r2d2/__init__.py).
BURNIN_STEP = 2
UNROLL_LEN = 18


@section
class ApeXEpsConfig:
    """Ape-X's exploration (Horgan et al. 2018), which R2D2 keeps: no schedule, but a
    fixed epsilon per env, spread over the collector's envs so that some explore a lot
    and some hardly at all. Env i of N acts with `base ** (1 + alpha * i / (N - 1))`
    (one env: `base`); with the defaults, from 0.4 down to 0.4 ** 8 (about 0.0007)."""

    #: The most exploring env's epsilon.
    base: Fraction = 0.4
    #: How fast epsilon falls across the envs (0: every env uses `base`).
    alpha: Annotated[float, Ge(0), Le(100)] = 7.0


@section
class R2D2ModelConfig(ModelConfig):
    #: Units of the LSTM between the encoder and the Q head; also the size of the
    #: `h` and `c` columns (the actor's state, stored with each step).
    lstm_hidden_size: Annotated[int, Gt(0), Le(4096)] = 64
    #: Separate value and advantage streams in the Q head.
    dueling: bool = True


@section
class R2D2LearnConfig(LearnConfig):
    #: Learn in the rescaled value space of Pohlen et al. (2018): targets are
    #: h(G + gamma^n h^-1(Q')), h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x, so returns of
    #: very different scales train alike without clipping rewards.
    value_rescale: bool = True
    #: Hard target-network copy every this many train iterations.
    target_update_freq: Annotated[int, Gt(0)] = 100
    #: Soft (Polyak) target update factor (DI-engine's name); when set it replaces the
    #: hard copy.
    target_update_theta: Annotated[float, Gt(0), Le(1)] | None = None
    #: A sequence's new priority mixes the max and the mean of its |TD errors| over its
    #: learned steps: eta * max + (1 - eta) * mean (R2D2's 0.9: a sequence with one
    #: surprising step stays likely to be sampled).
    priority_eta: Fraction = 0.9
    #: The per-step loss on the TD error: squared (R2D2's) or Huber (delta 1).
    td_loss: Literal["mse", "huber"] = "mse"


@section
class R2D2OtherConfig(OtherConfig):
    #: Ape-X's per-env epsilon-greedy exploration while collecting.
    eps: ApeXEpsConfig = field(default_factory=ApeXEpsConfig)


@section
class R2D2Config(TransitionPolicyConfig):
    """R2D2's `policy` section (the replay buffer's sequence keys are checked against
    it: `check`)."""

    type: Literal["r2d2"] = "r2d2"
    #: Steps summed into each learned step's return before bootstrapping, within its
    #: sequence (a return that would reach past the sequence's end is learned by the
    #: next, overlapping, sequence instead).
    nstep: Annotated[int, Gt(0), Le(100)] = 5
    #: Steps at each sequence's start that only run the networks from the stored state
    #: to warm it up (no loss), so stale stored states matter less; a sequence that
    #: starts its episode (zero state) needs none and is learned from its first step.
    burnin_step: Annotated[int, Ge(0), Le(MAX_SEQUENCE_STEPS)] = BURNIN_STEP
    #: Steps after the burn-in that are learned on.
    unroll_len: Annotated[int, Gt(0), Le(MAX_SEQUENCE_STEPS)] = UNROLL_LEN
    #: Weight each sequence's loss by the prioritized buffer's importance weight.
    priority_IS_weight: bool = True
    model: R2D2ModelConfig = field(default_factory=R2D2ModelConfig)
    learn: R2D2LearnConfig = field(default_factory=R2D2LearnConfig)
    other: R2D2OtherConfig = field(default_factory=R2D2OtherConfig)

    @property
    def collect_nstep(self) -> int:
        """What the collector's n-step builder sums: single steps, for R2D2 forms its
        n-step returns in the learner, over each stored sequence."""
        return 1

    @property
    def sequence_length(self) -> int:
        """Rows of each replayed sequence: the burn-in and the learned steps."""
        return self.burnin_step + self.unroll_len

    def check(self) -> None:
        buffer = self.other.replay_buffer
        if buffer.item != "sequence":
            raise ConfigError(
                "policy.other.replay_buffer.item",
                f"r2d2 trains on sequences of steps, not {buffer.item!r} items: set item: sequence",
            )
        if self.burnin_step >= buffer.sequence_length:
            raise ConfigError(
                "policy.burnin_step",
                f"{self.burnin_step} leaves no step to learn on in sequences of "
                f"{buffer.sequence_length} (policy.other.replay_buffer.sequence_length)",
            )
        if buffer.sequence_length != self.sequence_length:
            raise ConfigError(
                "policy.other.replay_buffer.sequence_length",
                f"{buffer.sequence_length} is not burnin_step + unroll_len = "
                f"{self.burnin_step} + {self.unroll_len}: set it to {self.sequence_length}",
            )
        if self.nstep >= self.unroll_len:
            raise ConfigError(
                "policy.nstep",
                f"{self.nstep} is not below unroll_len {self.unroll_len}: only steps whose "
                "episode ends within n steps could be learned",
            )
        # A sequence learns neither its burn-in rows nor its last nstep (no row to
        # bootstrap from), so the next one must start early enough to learn them.
        least = self.burnin_step + self.nstep
        if buffer.overlap < least:
            raise ConfigError(
                "policy.other.replay_buffer.overlap",
                f"{buffer.overlap} leaves steps that no sequence learns: a sequence's first "
                f"burnin_step rows only warm the LSTM up and its last nstep rows have no "
                f"n-step target, so consecutive sequences must share at least burnin_step + "
                f"nstep = {self.burnin_step} + {self.nstep}: set it to at least {least}",
            )
