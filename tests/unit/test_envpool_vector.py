"""The envpool manager gives what the sync manager gives: the same spaces, same-step
autoreset, clipped rewards only in training, and ConfigError for what it cannot play."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from common.config import ConfigError, EnvConfig
from common.env_guard import setup_env_registry
from common.envpool_vector import EnvpoolVector, envpool_spaces, envpool_task, same_spaces
from common.envs import GymnasiumVector, VectorEnvAdapter, env_spaces, make_env

PONG = "PongNoFrameskip-v4"
#: Pong's action that moves the paddle, so consecutive frames differ.
UP = 2


@pytest.fixture(autouse=True, scope="module")
def atari_registered() -> None:
    setup_env_registry({})  # registers ale_py's ids


def pong(**fields) -> EnvConfig:
    return EnvConfig(env_id=PONG, manager="envpool", **fields)


@pytest.fixture
def closing() -> Iterator[list[VectorEnvAdapter]]:
    """Vector envs to close at the end of the test, even a failed one."""
    envs: list[VectorEnvAdapter] = []
    yield envs
    for env in envs:
        env.close()


def test_pong_observes_like_sync(closing: list[VectorEnvAdapter]) -> None:
    config = pong()
    envs = EnvpoolVector(config, 3)
    closing.append(envs)
    assert same_spaces(envpool_spaces(envs.task), env_spaces(config))
    obs = envs.reset(seed=0)
    assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8
    step = envs.step(np.full(3, UP))
    assert step.obs.shape == step.final_obs.shape == (3, 4, 84, 84)
    assert step.obs.dtype == np.uint8
    assert step.reward.shape == (3,) and step.terminated.dtype == step.truncated.dtype == bool
    # A stack shifts by one frame a step.
    assert np.array_equal(step.obs[:, :3], obs[:, 1:])


def _first_end(envs: VectorEnvAdapter, max_steps: int) -> tuple[int, np.ndarray, object]:
    """Steps UP until some episode ends; (steps taken, obs before that step, the step)."""
    obs = envs.reset(seed=0)
    for steps in range(1, max_steps + 1):
        step = envs.step(np.full(envs.num_envs, UP))
        if step.ended.any():
            return steps, obs, step
        assert np.array_equal(step.final_obs, step.obs)
        obs = step.obs
    raise AssertionError(f"no episode ended within {max_steps} steps")


@pytest.mark.parametrize("manager", [EnvpoolVector, GymnasiumVector])
def test_same_step_autoreset(manager: type, closing: list[VectorEnvAdapter]) -> None:
    # 200 frames is 50 agent steps (sync counts its reset's no-op frames too, so its
    # episodes end a little sooner).
    envs = manager(pong(env_kwargs={"max_episode_steps": 200}), 2)
    closing.append(envs)
    _, before, step = _first_end(envs, max_steps=60)
    for i in range(envs.num_envs):
        if not step.ended[i]:
            assert np.array_equal(step.final_obs[i], step.obs[i])
            continue
        assert step.truncated[i] and not step.terminated[i]
        # final_obs is the episode's last observation: the previous stack, shifted.
        assert np.array_equal(step.final_obs[i, :3], before[i, 1:])
        # obs is the next episode's first: its stack is one frame, repeated.
        assert not np.array_equal(step.final_obs[i], step.obs[i])
        assert all(np.array_equal(frame, step.obs[i, 0]) for frame in step.obs[i])


def test_envpool_episode_counter_restarts_at_the_end(closing: list[VectorEnvAdapter]) -> None:
    """No step is spent on a reset: with a 50-step limit, episodes end at 50, 100, 150."""
    envs = EnvpoolVector(pong(env_kwargs={"max_episode_steps": 200}), 2)
    closing.append(envs)
    envs.reset(seed=0)
    ends = []
    for t in range(1, 151):
        step = envs.step(np.full(2, UP))
        if step.ended.any():
            assert step.ended.all()
            ends.append(t)
    assert ends == [50, 100, 150]


def test_rewards_are_clipped_only_in_training(closing: list[VectorEnvAdapter]) -> None:
    """Space Invaders scores 5 and more a hit: training sees its sign, evaluation the
    score (random play hits something within 150 steps with this seed)."""
    config = EnvConfig(env_id="SpaceInvadersNoFrameskip-v4", manager="envpool")
    rewards = {}
    for training in (True, False):
        envs = EnvpoolVector(config, 2, training=training)
        closing.append(envs)
        assert envs.task.options["episodic_life"] is training
        envs.reset(seed=0)
        rng = np.random.default_rng(0)
        rewards[training] = np.concatenate(
            [envs.step(rng.integers(0, 6, 2)).reward for _ in range(150)]
        )
    assert set(np.unique(rewards[True])) <= {-1.0, 0.0, 1.0} and rewards[True].max() == 1.0
    assert rewards[False].max() >= 5.0


def test_same_seed_same_episodes(closing: list[VectorEnvAdapter]) -> None:
    envs = EnvpoolVector(pong(), 2)
    closing.append(envs)
    runs = []
    for _ in range(2):
        first = envs.reset(seed=7)
        rng = np.random.default_rng(1)
        steps = [envs.step(rng.integers(0, 6, 2)).obs for _ in range(20)]
        runs.append(np.stack([first, *steps]))
    assert np.array_equal(runs[0], runs[1])


def test_atari_options_follow_gymnasium_specs() -> None:
    v4 = envpool_task(pong(), training=True)
    assert v4.task_id == "Pong-v5"
    assert v4.options["repeat_action_probability"] == 0.0
    assert v4.options["max_episode_steps"] == 108_000 // 4
    assert v4.options["episodic_life"] and v4.options["reward_clip"]
    v5 = envpool_task(EnvConfig(env_id="ALE/Breakout-v5", manager="envpool"), training=False)
    assert v5.task_id == "Breakout-v5" and v5.options["repeat_action_probability"] == 0.25
    assert not v5.options["episodic_life"] and not v5.options["reward_clip"]
    kwargs = {"repeat_action_probability": 0.1, "max_episode_steps": 1001}
    custom = envpool_task(pong(env_kwargs=kwargs, frame_skip=2, clip_rewards=False), training=True)
    assert custom.options["repeat_action_probability"] == 0.1
    assert custom.options["max_episode_steps"] == 501  # frames, rounded up to steps
    assert custom.options["frame_skip"] == 2 and not custom.options["reward_clip"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (EnvConfig(env_id="CartPole-v1", manager="envpool"), "env.manager"),
        (pong(env_kwargs={"game": "joust"}), "env.manager"),  # a ROM envpool lacks
        (pong(env_kwargs={"obs_type": "ram"}), "env.env_kwargs.obs_type"),
        (pong(noop_max=0), "env.noop_max"),
        (pong(obs_key="image"), "env.obs_key"),
        (EnvConfig(env_id="not-an-id", manager="envpool"), "env.env_id"),
    ],
)
def test_refuses_what_envpool_cannot_play(config: EnvConfig, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        EnvpoolVector(config, 2)
    assert err.value.field == field


def test_mujoco_matches_sync(closing: list[VectorEnvAdapter]) -> None:
    pytest.importorskip("mujoco")
    config = EnvConfig(env_id="Hopper-v5", manager="envpool", env_kwargs={"max_episode_steps": 5})
    envs = EnvpoolVector(config, 2)
    closing.append(envs)
    assert same_spaces(envpool_spaces(envs.task), env_spaces(config))
    obs = envs.reset(seed=0)
    assert obs.shape == (2, 11) and obs.dtype == np.float32
    for _ in range(5):
        step = envs.step(np.zeros((2, 3), np.float32))
    assert step.truncated.all() and not np.array_equal(step.obs, step.final_obs)
    with pytest.raises(ConfigError) as err:
        EnvpoolVector(EnvConfig(env_id="Hopper-v5", manager="envpool", frame_stack=2), 2)
    assert err.value.field == "env.frame_stack"


def test_make_env_dispatches_to_envpool(closing: list[VectorEnvAdapter]) -> None:
    envs = make_env(EnvConfig(env_id=PONG, manager="envpool"), 4)
    closing.append(envs)
    assert isinstance(envs, EnvpoolVector)
    assert envs.reset(seed=0).shape == (4, 4, 84, 84)
