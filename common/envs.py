"""Environment factory shared by the coordinator (to check spaces) and collectors."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Spaces:
    obs_shape: int
    action_shape: int
    action_space: str  # "discrete" | "continuous"
    action_bounds: tuple[list[float], list[float]] | None = None


def env_spaces(config: EnvConfig) -> Spaces:
    """The observation size and action space of a flat-Box-observation env.

    Raises:
        ConfigError: the env does not exist or its spaces are not supported.
    """
    try:
        env: Any = gym.make(config.env_id, **config.env_kwargs)
    except gym.error.Error as exc:
        raise ConfigError("env.env_id", f"cannot make '{config.env_id}': {exc}") from None
    except TypeError as exc:
        raise ConfigError("env.env_kwargs", str(exc)) from None
    try:
        obs, act = env.observation_space, env.action_space
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            raise ConfigError("env.env_id", f"'{config.env_id}' needs a flat Box observation")
        if isinstance(act, gym.spaces.Discrete):
            return Spaces(int(obs.shape[0]), int(act.n), "discrete")
        if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
            bounds = (act.low.astype(float).tolist(), act.high.astype(float).tolist())
            return Spaces(int(obs.shape[0]), int(act.shape[0]), "continuous", bounds)
        raise ConfigError("env.env_id", f"'{config.env_id}' has an unsupported action space")
    finally:
        env.close()
