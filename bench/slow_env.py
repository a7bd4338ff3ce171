"""A bench env whose step takes a fixed wall time: CartPole-v1 standing in for a simulator
whose step is milliseconds of something that is not Python CPU (a physics code, a game
server, a socket). A sleep stands in for the simulator, so the step costs wall time and
almost no CPU. Importing this module registers it (the bench names it in
`DROVER_ENV_MODULES`, as an operator names an env package)::

    DROVER_ENV_MODULES=bench.slow_env drover run config.yaml    # with PYTHONPATH at the repo

    env:
      env_id: drover-bench/SlowCartPole-v1
      env_kwargs: {step_ms: 10}

It lives in `bench/`, not in the product: only bench/scaling.py and its test use it.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "drover-bench/SlowCartPole-v1"
#: The wall time of one step when the job names none (`env.env_kwargs.step_ms`).
DEFAULT_STEP_MS = 10.0


class SlowCartPole(gym.Wrapper):
    """CartPole-v1 (its dynamics, rewards and 500-step limit) whose every step takes
    `step_ms` milliseconds of wall time: the step, then a sleep for the rest. Resets
    take no extra time."""

    def __init__(self, step_ms: float = DEFAULT_STEP_MS, render_mode: str | None = None) -> None:
        if not step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0, not {step_ms!r}")
        super().__init__(CartPoleEnv(render_mode=render_mode))
        self.step_s = float(step_ms) / 1000.0

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        due = time.monotonic() + self.step_s
        result = self.env.step(action)
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)
        return result


if ENV_ID not in gym.envs.registry:
    gym.register(
        id=ENV_ID,
        entry_point=SlowCartPole,
        max_episode_steps=500,
        reward_threshold=475.0,
    )
