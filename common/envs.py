"""The envs of a collector task: vector envs behind `VectorEnvAdapter`, made by the
job's env adapter (`ENV_ADAPTERS`, chosen by `env.adapter`) and stepped by its
manager (`env.manager`: sync, async worker processes, or envpool); and the spaces a
job's model is fitted to (`env_spaces`).

    envs = make_env(config.env, num_envs)          # a VectorEnvAdapter
    step = envs.step(actions)                      # a VectorStep

One env as the agent sees it is `common/env_make.py`; what a request may name (env
ids, kwargs, modules) is checked by `common/env_guard.py`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from common.config import ConfigError, EnvConfig
from common.env_make import Spaces, make_one_env, spaces_of
from common.games import game_spaces


def make_vector_env(
    config: EnvConfig, num_envs: int, *, training: bool = True
) -> gym.vector.VectorEnv:
    """A synchronous vector env of `make_one_env` envs that resets a finished sub-env
    in the same step.

    Same-step autoreset puts the terminal observation into `info["final_obs"]` and the
    first observation of the next episode into the returned `obs`, so every step's
    action counts and no step is wasted on a reset.

    Raises:
        ConfigError: the env config is refused or the env cannot be made.
    """
    make_one_env(config, training=training).close()  # refuse a bad config here, at once
    return gym.vector.SyncVectorEnv(
        [lambda: make_one_env(config, training=training)] * num_envs,
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


@dataclass(frozen=True)
class VectorStep:
    """One step of every env of a vector env.

    `obs` is what each env shows next: for an env whose episode just ended, the first
    observation of its next episode (envs reset in the same step, so no action is
    wasted on a reset). `final_obs` is what each env showed at the end of this step,
    the same as `obs` where no episode ended: n-step targets and bootstrapping need it.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray

    @functools.cached_property
    def ended(self) -> np.ndarray:
        """Where an episode ended (made once: a loop asks several times a step)."""
        return self.terminated | self.truncated


class VectorEnvAdapter(Protocol):
    """The envs one collector task steps together. Usage::

    envs = make_env(config.env, num_envs=8)
    obs = envs.reset(seed=0)
    step = envs.step(actions)        # a VectorStep
    envs.close()
    """

    num_envs: int

    def reset(self, seed: int) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> VectorStep: ...

    def close(self) -> None: ...


class GymnasiumVector:
    """gymnasium's synchronous vector env, with same-step autoreset."""

    def __init__(self, config: EnvConfig, num_envs: int, *, training: bool = True) -> None:
        self.num_envs = num_envs
        self._env = make_vector_env(config, num_envs, training=training)

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self._env.reset(seed=seed)
        return obs

    def step(self, actions: np.ndarray) -> VectorStep:
        obs, reward, terminated, truncated, info = self._env.step(actions)
        ended = terminated | truncated
        final_obs = obs
        if ended.any():
            # gymnasium keeps an ended env's last observation in info["final_obs"].
            final_obs = obs.copy()
            final_obs[ended] = np.stack(info["final_obs"][ended])
        return VectorStep(obs, reward, terminated, truncated, final_obs)

    def close(self) -> None:
        self._env.close()


class EnvAdapter(Protocol):
    """A kind of environment: reports its spaces at submission and makes the envs of
    each collector task. Registered in `ENV_ADAPTERS` and chosen by `env.adapter`."""

    def spaces(self, config: EnvConfig) -> Spaces:
        """The observation and action spaces (ConfigError when refused)."""
        ...

    def make(self, config: EnvConfig, num_envs: int, *, training: bool = True) -> VectorEnvAdapter:
        """`num_envs` envs stepped together (`training`: with the training-only
        wrappers, such as Atari's episodic life and reward clipping)."""
        ...


#: How a collector steps its envs, by `env.manager`: a factory of vector envs.
VectorFactory = Callable[[EnvConfig, int, bool], VectorEnvAdapter]


def _async_vector(config: EnvConfig, num_envs: int, training: bool) -> VectorEnvAdapter:
    from common.env_workers import SubprocessVector  # starts processes: only when asked

    return SubprocessVector(config, num_envs, training=training)


def _envpool_module() -> Any:
    """common.envpool_vector, which needs the optional envpool package."""
    try:
        import common.envpool_vector as module
    except ImportError as exc:
        raise ConfigError(
            "env.manager",
            f"envpool is not installed here ({exc}); install drover's envpool extra "
            "(pip install 'drover[envpool]') or use manager 'sync' or 'async'",
        ) from None
    return module


def _envpool_vector(config: EnvConfig, num_envs: int, training: bool) -> VectorEnvAdapter:
    return _envpool_module().EnvpoolVector(config, num_envs, training=training)


def _check_envpool(config: EnvConfig, spaces: Spaces) -> None:
    """Refuse at submission what envpool cannot step as `sync` would."""
    module = _envpool_module()
    for training in (True, False):
        task = module.envpool_task(config, training=training)
        actual = module.envpool_spaces(task)
        if not module.same_spaces(spaces, actual):
            raise ConfigError(
                "env.manager",
                f"envpool's {task.task_id} gives {actual}, but '{config.env_id}' gives "
                f"{spaces} with manager 'sync'; use manager 'sync'",
            )


ENV_MANAGERS: dict[str, VectorFactory] = {
    "sync": lambda config, num_envs, training: GymnasiumVector(config, num_envs, training=training),
    "async": _async_vector,
    "envpool": _envpool_vector,
}
#: What a manager checks at submission, beyond what every env is checked for.
MANAGER_CHECKS: dict[str, Callable[[EnvConfig, Spaces], None]] = {
    "envpool": _check_envpool,
}


def env_manager(config: EnvConfig) -> VectorFactory:
    """The vector env factory `env.manager` names.

    Raises:
        ConfigError: on `env.manager`, for a manager not in `ENV_MANAGERS`.
    """
    manager = ENV_MANAGERS.get(config.manager)
    if manager is None:
        known = ", ".join(sorted(ENV_MANAGERS))
        raise ConfigError("env.manager", f"unknown manager '{config.manager}' (known: {known})")
    return manager


class Gymnasium:
    """gymnasium's registry: observations as `_observation_layout` makes them,
    Discrete or flat Box actions, stepped by the job's `env.manager`."""

    def spaces(self, config: EnvConfig) -> Spaces:
        env = make_one_env(config, training=False)
        try:
            spaces = spaces_of(env, config)
        finally:
            # A throwaway env: a failure to close it says nothing about the job's config.
            with contextlib.suppress(Exception):
                env.close()
        env_manager(config)  # a known one
        check = MANAGER_CHECKS.get(config.manager)
        if check is not None:
            check(config, spaces)
        return spaces

    def make(self, config: EnvConfig, num_envs: int, *, training: bool = True) -> VectorEnvAdapter:
        return env_manager(config)(config, num_envs, training)


class PettingZoo:
    """Two-player turn-based games (common/games.py): their spaces, for the model that
    plays either seat; the games themselves are played by the self-play workflow's
    battle loop, seat by seat, not stepped as a single-agent vector env."""

    def spaces(self, config: EnvConfig) -> Spaces:
        return game_spaces(config)

    def make(self, config: EnvConfig, num_envs: int, *, training: bool = True) -> VectorEnvAdapter:
        raise ConfigError(
            "env.adapter",
            f"'{config.env_id}' is a two-player game: a two-player game is played by the "
            "self-play workflow's battle loop (system.workflow: selfplay), not as a "
            "single-agent vector env",
        )


#: The kinds of environment, by `env.adapter`: gymnasium's single-agent envs (stepped by
#: any of `ENV_MANAGERS`) and PettingZoo's two-player games (`selfplay` workflow).
ENV_ADAPTERS: dict[str, EnvAdapter] = {
    "gymnasium": Gymnasium(),
    "pettingzoo": PettingZoo(),
}


def env_adapter(config: EnvConfig) -> EnvAdapter:
    adapter = ENV_ADAPTERS.get(config.adapter)
    if adapter is None:
        known = ", ".join(sorted(ENV_ADAPTERS))
        raise ConfigError("env.adapter", f"unknown adapter '{config.adapter}' (known: {known})")
    return adapter


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def env_spaces(config: EnvConfig) -> Spaces:
    """The spaces of the job's environment, as its adapter reports them.

    Raises:
        ConfigError: the env config is refused, the env cannot be made, or its spaces
            are not supported.
    """
    return env_adapter(config).spaces(config)


def make_env(config: EnvConfig, num_envs: int, *, training: bool = True) -> VectorEnvAdapter:
    """The envs of one collector task, made by the job's adapter; evaluation passes
    `training=False` (whole games, unclipped rewards)."""
    return env_adapter(config).make(config, num_envs, training=training)
