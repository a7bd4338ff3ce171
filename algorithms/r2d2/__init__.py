"""R2D2: recurrent experience replay in distributed RL (Kapturowski et al. 2019), for
discrete actions. A recurrent Q-network (encoder, LSTM, dueling head) trained with
double-Q n-step targets in the rescaled value space on replayed sequences, which
start from the LSTM state the actor held and warm it up over a burn-in; prioritized by
each sequence's max and mean |TD error|; Ape-X's per-env epsilons while collecting.

    config.py    R2D2Config: the sequence keys (burnin_step, unroll_len), nstep,
                 value rescaling, priorities' eta, Ape-X's eps
    networks.py  RecurrentQNetwork: sequences for the learner, one step for the actor
    actor.py     R2D2Policy: carries each env's state, records it with each step
    learner.py   R2D2: burn-in, n-step double-Q targets, rescaled squared TD loss

Its step data are single steps (the collector's `transitions` loop with
`policy.collect_nstep` 1) grouped by episode, which the replay buffer cuts into
overlapping sequences (`policy.other.replay_buffer.item: sequence`) of
`burnin_step + unroll_len` rows. With a burn-in of b and n-step returns, a sequence
learns its rows b .. T - n - 1 (from row 0 where it starts its episode, and up to its
end where its episode terminates): an `overlap` of at least b + n rows, which the
config requires, has every step learned by some sequence (but the last n of an
episode a time limit ended: nothing follows them to bootstrap from). An episode the
collector cuts into pieces repeats the `overlap` rows at each cut.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.r2d2.config import BURNIN_STEP, UNROLL_LEN, R2D2Config
from common.columns import Column

if TYPE_CHECKING:
    import torch

    from algorithms.r2d2.actor import R2D2Policy
    from algorithms.r2d2.learner import R2D2
    from common.config import PolicyConfig

#: One env step a row, an episode's rows together. The learner gets them with a time
#: axis, [B, T, ...], and a `valid` column (1 for real rows, 0 for padding).
SEQUENCE_STEPS = (
    Column("obs", "observation"),
    Column("action", "action"),
    Column("reward", "float"),
    # 1 where the episode terminated at this step: no bootstrap past it (a time
    # limit's end is not: its sequence just ends).
    Column("done", "flag"),
    # The actor's LSTM state before this step's observation went in: the learner
    # starts each sequence from its first row's. Zeros at an episode's first step,
    # which tell the learner that a sequence starts its episode (no burn-in).
    Column("h", "recurrent", shape=("lstm_hidden_size",), from_actor=True),
    Column("c", "recurrent", shape=("lstm_hidden_size",), from_actor=True),
)
COLUMNS = tuple(column.name for column in SEQUENCE_STEPS)


def make_actor(policy: PolicyConfig) -> R2D2Policy:
    from algorithms.r2d2.actor import R2D2Policy

    return R2D2Policy(policy)


def make_learner(policy: PolicyConfig, device: str | torch.device) -> R2D2:
    from algorithms.r2d2.learner import R2D2

    return R2D2(policy, device)


SPEC = AlgorithmSpec(
    name="r2d2",
    defaults={
        "policy": {
            "discount_factor": 0.997,
            "model": {"encoder_hidden_size_list": [128, 128]},
            "learn": {"batch_size": 64, "learning_rate": 5e-4},
            "other": {
                "replay_buffer": {
                    "type": "prioritized",
                    "alpha": 0.9,  # R2D2's priority exponent
                    "beta": 0.6,
                    "item": "sequence",
                    "sequence_length": BURNIN_STEP + UNROLL_LEN,
                    # half a sequence: at least burnin_step + nstep, so every step is
                    # learned by some sequence
                    "overlap": (BURNIN_STEP + UNROLL_LEN) // 2,
                    "replay_buffer_size": 10_000,  # sequences
                    "min_size_to_sample": 200,
                    # Sequences sampled per sequence inserted (about 10 env steps each):
                    # CartPole without its velocities learns at 32, barely at 1.5 (what
                    # an unlimited learner reached beside a local collector).
                    "samples_per_insert": 32.0,
                }
            },
        },
    },
    collect_unit="transitions",
    action_spaces=frozenset({"discrete"}),
    image_obs=True,
    recurrent=True,
    columns=SEQUENCE_STEPS,
    make_actor=make_actor,
    make_learner=make_learner,
    config=R2D2Config,
)
