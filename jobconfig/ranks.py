"""Whether a job's batches split evenly over a learner group's ranks: what the
coordinator checks before it gives a job's learn task to a learner group, and
`drover run --learner-ranks N` before it starts anything (the group's own
bookkeeping is `common.ranks`)."""

from __future__ import annotations

from algorithms.registry import ALGORITHMS
from common.config import PolicyConfig


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
