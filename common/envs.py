"""Environment factory shared by the coordinator (to check spaces) and collectors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from common.config import ConfigError, EnvConfig


def make_vector_env(config: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets a finished sub-env in the same step.

    Same-step autoreset puts the terminal observation into `info["final_obs"]` and the
    first observation of the next episode into the returned `obs`, so every step's
    action counts and no step is wasted on a reset.
    """
    return gym.make_vec(
        config.env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **config.env_kwargs,
    )


def discrete_spaces(config: EnvConfig) -> tuple[int, int]:
    """(observation size, number of actions) of a flat-box, discrete-action env.

    Raises:
        ConfigError: the env does not exist or does not have such spaces.
    """
    try:
        env: Any = gym.make(config.env_id, **config.env_kwargs)
    except gym.error.Error as exc:
        raise ConfigError("env.env_id", f"cannot make '{config.env_id}': {exc}") from None
    except TypeError as exc:
        raise ConfigError("env.env_kwargs", str(exc)) from None
    try:
        obs, act = env.observation_space, env.action_space
        if not isinstance(act, gym.spaces.Discrete):
            raise ConfigError("env.env_id", f"'{config.env_id}' needs discrete actions for DQN")
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            raise ConfigError("env.env_id", f"'{config.env_id}' needs a flat Box observation")
        return int(obs.shape[0]), int(act.n)
    finally:
        env.close()
