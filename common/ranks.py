"""Learner groups as the rest of drover sees them: how many ranks a learner has, on
which devices, and whether a job's batches split evenly over them.

A learner group (services/learner/group.py) registers as one learner and reports
`learner_ranks` and `rank_devices` with its resources. The coordinator gives a job's
learn task only to a learner whose ranks split the job's batches (each rank trains on
an equal share of every global batch); `drover run --learner-ranks N` checks the same
before it starts anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from algorithms.registry import ALGORITHMS
from common.config import PolicyConfig

#: Registration resources of a learner group: its world size, and each rank's device
#: ("cpu", "cuda:0", ...) joined by commas, in rank order.
LEARNER_RANKS = "learner_ranks"
RANK_DEVICES = "rank_devices"


def learner_ranks(resources: Mapping[str, Any]) -> int:
    """The ranks of a learner (1 for a learner that reports none)."""
    value = resources.get(LEARNER_RANKS)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return 1
    return int(value)


def split_error(policy: PolicyConfig, ranks: int) -> tuple[str, str] | None:
    """Why a job's batches do not split evenly over `ranks` learner ranks, as (config
    key, message); None when they do.

    Every rank trains on `batch_size / ranks` items of each global batch; an on-policy
    round (`rounds` unit, PPO) of `n_sample` items is split the same way, and each
    rank's minibatches are `batch_size / ranks` of its share.
    """
    if ranks <= 1:
        return None
    learn, collect = policy.learn, policy.collect
    sizes = [("policy.learn.batch_size", learn.batch_size)]
    if ALGORITHMS[policy.type].collect_unit == "rounds":
        sizes.append(("policy.collect.n_sample", collect.n_sample))
    for key, size in sizes:
        if size % ranks:
            return key, (
                f"{size} does not split evenly over a learner group of {ranks} ranks: "
                f"use a multiple of {ranks} (each rank trains on an equal share)"
            )
    return None
