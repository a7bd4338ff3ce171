"""Every algorithm drover knows, by its `policy.type`: the one place that lists them.

Adding an algorithm is its folder (see `algorithms/dqn/`) and one line here.
"""

from __future__ import annotations

from algorithms import dqn, impala, ppo, r2d2, rainbow, sac
from algorithms.base import Algorithm

ALGORITHMS: dict[str, Algorithm] = {
    "dqn": dqn.SPEC,
    "ppo": ppo.SPEC,
    "impala": impala.SPEC,
    "sac": sac.SPEC,
    "rainbow": rainbow.SPEC,
    "c51": rainbow.C51_SPEC,
    "r2d2": r2d2.SPEC,
}
