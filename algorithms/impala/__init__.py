"""IMPALA: an actor-critic trained on unrolls with V-trace off-policy correction.

It acts and learns with PPO's actor-critic (`algorithms.ppo.networks`, `.actor`); its
own part is the learner:

    learner.py   Impala and vtrace
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from algorithms.base import AlgorithmSpec
from algorithms.impala.config import IMPALAConfig
from algorithms.ppo import make_actor  # IMPALA acts as PPO does
from common.columns import Column

if TYPE_CHECKING:
    import torch

    from algorithms.impala.learner import Impala
    from common.config import PolicyConfig

#: One unroll of `unroll_len` steps a row: each per-step column has a time axis; the
#: state after the unroll's last step (`bootstrap_obs`) is one per row.
UNROLLS = (
    Column("obs", "observation"),
    Column("action", "action"),
    Column("reward", "float"),
    Column("logp", "float"),  # the behaviour policy's, for V-trace
    Column("done", "flag"),  # any episode end
    Column("bootstrap_obs", "observation", per_item=True),
    Column("truncated", "flag"),  # a time limit's end: bootstrapped from final_obs
    Column("final_obs", "observation"),
)
COLUMNS = tuple(column.name for column in UNROLLS)


def make_learner(policy: PolicyConfig, device: str | torch.device) -> Impala:
    from algorithms.impala.learner import Impala

    return Impala(policy, device)


SPEC = AlgorithmSpec(
    name="impala",
    defaults={
        "policy": {
            "model": {"encoder_hidden_size_list": [64, 64]},
            "learn": {
                "batch_size": 16,  # unrolls per update
                "num_batches": 1,
                "learning_rate": 5e-4,
                "max_grad_norm": 40.0,
            },
            "other": {
                # Each unroll is used once, oldest first; data too far behind is dropped.
                "replay_buffer": {
                    "type": "fifo",
                    "replay_buffer_size": 4096,
                    "min_size_to_sample": 1,
                }
            },
        },
        "system": {"workflow": "async", "max_policy_lag": 8},
    },
    collect_unit="unrolls",
    action_spaces=frozenset({"discrete", "continuous"}),
    image_obs=True,
    columns=UNROLLS,
    make_actor=make_actor,
    make_learner=make_learner,
    config=IMPALAConfig,
)
