"""Learner groups as the rest of drover sees them: how many ranks a learner has, and
on which devices.

A learner group (services/learner/group.py) registers as one learner and reports
`learner_ranks` and `rank_devices` with its resources. The coordinator gives a job's
learn task only to a learner whose ranks split the job's batches (each rank trains on
an equal share of every global batch: `jobconfig.ranks.split_error`); `drover run
--learner-ranks N` checks the same before it starts anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
