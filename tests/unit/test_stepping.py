"""Double-buffered stepping (services/collector/stepping.py) gives every env the same
observations, actions and steps as stepping all envs in turn."""

import numpy as np
import pytest

from common.config import EnvConfig
from common.envs import make_env
from services.collector.stepping import (
    DoubleBuffered,
    Sequential,
    double_buffered,
    make_stepper,
)


def lean_right(obs):
    """A deterministic policy: push the cart the way the pole leans."""
    actions = (obs[:, 2] > 0).astype(np.int64)
    return actions, (actions, obs[:, 2].copy())


def run(stepper, steps):
    stepper.reset(seed=7)
    out = []
    try:
        for _ in range(steps):
            obs, recorded, step = stepper.step_with(lean_right)
            out.append((obs, recorded, step))
    finally:
        stepper.close()
    return out


@pytest.mark.parametrize("manager", ["sync", "async"])
def test_double_buffering_steps_every_env_as_stepping_in_turn_does(manager):
    config = EnvConfig(env_id="CartPole-v1", manager=manager, num_workers=1)
    in_turn = run(Sequential(make_env(config, 5)), 300)
    buffered = run(DoubleBuffered(make_env(config, 2), make_env(config, 3)), 300)
    ends = 0
    for (obs_a, rec_a, step_a), (obs_b, rec_b, step_b) in zip(in_turn, buffered, strict=True):
        np.testing.assert_array_equal(obs_a, obs_b)
        for x, y in zip(rec_a, rec_b, strict=True):
            np.testing.assert_array_equal(x, y)
        for field in ("obs", "reward", "terminated", "truncated", "final_obs"):
            np.testing.assert_array_equal(getattr(step_a, field), getattr(step_b, field))
        ends += int(step_a.ended.sum())
    assert ends >= 5  # episodes ended (and envs reset) along the way


def test_double_buffering_is_chosen_by_config_and_needs_two_envs():
    assert not double_buffered(EnvConfig(manager="envpool"), 8)
    assert double_buffered(EnvConfig(manager="envpool", double_buffer=True), 8)
    assert not double_buffered(EnvConfig(manager="async", double_buffer=True), 1)
    assert double_buffered(EnvConfig(manager="sync", double_buffer=True), 2)
    stepper = make_stepper(EnvConfig(double_buffer=True), 3)
    assert isinstance(stepper, DoubleBuffered) and stepper.num_envs == 3
    assert stepper.reset(seed=0).shape == (3, 4)
    stepper.close()
