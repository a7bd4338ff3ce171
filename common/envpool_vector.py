"""The `envpool` env manager: a collector's envs stepped by envpool's C++ thread pool.

Chosen by `env.manager: envpool`; `make_env` builds it. Usage::

    envs = EnvpoolVector(config.env, num_envs=8)   # ConfigError if envpool cannot
    obs = envs.reset(seed=0)                       # [8, 4, 84, 84] uint8 for Pong
    step = envs.step(actions)                      # a VectorStep
    envs.close()

It gives what the `sync` manager gives for the same config: the same observation
layout (checked against `env_spaces` when it is built), and Atari preprocessing done
by envpool with drover's settings (`env.frame_skip` frames per action with the last
two max-pooled, up to `env.noop_max` (>= 1) no-op frames and FIRE at reset, gray
`env.screen_size` squares, `frame_stack_of` frames; episodic life and reward signs
only when `training`). It steps Atari games and gymnasium's MuJoCo envs, each mapped
to the envpool task of the same game or the same id and version; anything else, or an
option envpool cannot honour, is a ConfigError naming the field.

Autoreset. envpool resets an env whose episode ended on the *next* step (gymnasium's
NEXT_STEP mode): that step ignores the env's action and returns its first observation.
drover's envs reset in the *same* step (`VectorStep`), so after a step in which some
envs ended, this adapter resets just those (`reset(env_id)`), puts their first
observations into `obs` and keeps the terminal ones in `final_obs`. A reset env is no
longer done, so envpool steps it normally next time: no action is ignored.

Where envpool's Atari differs from `sync` (from envpool's `atari_env.h`), none of which
changes a game's rules or scores:

- FIRE at reset is one frame after the no-ops; `sync` (`FireReset`) plays FIRE, then
  action 2, for an agent step each.
- The time limit counts agent steps after the reset's no-ops; `sync`'s counts every
  frame, its reset's no-ops and FIRE steps included, so a `sync` episode may be cut
  up to `noop_max` + 2 x `frame_skip` frames sooner. A limit of F frames is
  ceil(F / frame_skip) envpool steps (108000 frames, gymnasium's Atari limit, is 27000
  steps).
- After a lost life under episodic life, play resumes after random no-ops (and FIRE);
  `sync` takes one no-op agent step (then FIRE, action 2).
- Seeds: envpool fixes them when a pool is made, so `reset(seed)` makes a new pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import envpool
import gymnasium as gym
import numpy as np

from common.config import ConfigError, EnvConfig
from common.env_guard import check_env
from common.env_make import Spaces, atari_train_option, frame_stack_of, is_atari, spaces_from
from common.envs import VectorStep, env_spaces, usable_cpus

#: The entry points of gymnasium's MuJoCo envs, which envpool has under the same ids.
MUJOCO_ENTRY_PREFIX = "gymnasium.envs.mujoco."
#: envpool's time limit is an int32 counter; "no limit" is this many steps.
NO_STEP_LIMIT = 2**30
#: envpool seeds env i with seed + i, all int32.
_INT32_LIMIT = 2**31

# ale_py keywords whose value `sync` ignores or overrides (it makes the env with
# frameskip=1 and skips frames in AtariPreprocessing), or that do not change the game.
_ATARI_IGNORED_KWARGS = frozenset(
    {"frameskip", "disable_env_checker", "continuous_action_threshold"}
)
# ale_py keywords envpool can honour only at their default value.
_ATARI_FIXED_KWARGS: dict[str, Any] = {
    "obs_type": "rgb",  # every obs type is turned into gray frames; rgb is what sync uses
    "continuous": False,
    "sound_obs": False,
    "render_mode": None,
}
# The ale_py keywords envpool honours (as options of its own, or as the time limit).
_ATARI_OPTIONS = frozenset(
    {
        "game",
        "mode",
        "difficulty",
        "repeat_action_probability",
        "full_action_space",
        "max_num_frames_per_episode",
        "max_episode_steps",
    }
)


# envpool options of a MuJoCo task that an env config may not set: the pool's own, a
# file path, and what drover does itself (frame stacking).
_MUJOCO_RESERVED_OPTIONS = frozenset(
    {
        "num_envs",
        "batch_size",
        "num_threads",
        "max_num_players",
        "thread_affinity_offset",
        "base_path",
        "seed",
        "env_seed",
        "gym_reset_return_info",
        "max_episode_steps",  # set from the gymnasium keyword of that name
        "xml_file",
        "frame_stack",
        "gymnasium_v5_render_camera",
        "reward_threshold",
    }
)
_MUJOCO_IGNORED_KWARGS = frozenset({"disable_env_checker"})


@dataclass(frozen=True)
class EnvpoolTask:
    """What `envpool.make` is called with for a config: envpool's id ("Pong-v5") and
    its keyword options (all but the pool's size, threads and seed)."""

    task_id: str
    options: Mapping[str, Any]


@functools.cache
def _envpool_ids() -> frozenset[str]:
    return frozenset(envpool.list_all_envs())


def envpool_task(config: EnvConfig, *, training: bool) -> EnvpoolTask:
    """The envpool task and options that play `config`'s env as `make_one_env` makes
    it; `training` turns on Atari's episodic life and reward signs (as configured).

    Raises:
        ConfigError: as `check_env`; on `env.manager` when envpool has no such env; on
            the field of an option it cannot honour.
    """
    check_env(config)  # a registered id, kwargs the env takes: what sync asks first
    spec = gym.envs.registry[config.env_id]
    if config.obs_key is not None:
        raise ConfigError(
            "env.obs_key", "the envpool manager steps Atari and MuJoCo envs, which have no Dict"
        )
    if is_atari(config):
        return _atari_task(config, spec, training)
    entry = spec.entry_point if isinstance(spec.entry_point, str) else ""
    if entry.startswith(MUJOCO_ENTRY_PREFIX) and config.env_id in _envpool_ids():
        return _mujoco_task(config, spec)
    raise ConfigError(
        "env.manager",
        f"envpool does not step '{config.env_id}': it steps Atari games (ale_py ids such as "
        "'PongNoFrameskip-v4' or 'ALE/Pong-v5') and gymnasium's MuJoCo envs whose id and "
        "version envpool has (such as 'HalfCheetah-v5'); use manager 'sync' or 'async'",
    )


def _atari_task(
    config: EnvConfig, spec: gym.envs.registration.EnvSpec, training: bool
) -> EnvpoolTask:
    # The registered kwargs (game, sticky actions, frame limit) with the job's over them,
    # as gymnasium.make merges them.
    kwargs = {**spec.kwargs, **config.env_kwargs}
    for name, value in config.env_kwargs.items():
        if name in _ATARI_IGNORED_KWARGS:
            continue
        if name in _ATARI_FIXED_KWARGS and value != _ATARI_FIXED_KWARGS[name]:
            raise ConfigError(
                f"env.env_kwargs.{name}",
                f"the envpool manager plays Atari only with {name}="
                f"{_ATARI_FIXED_KWARGS[name]!r}; use manager 'sync' for {value!r}",
            )
        if name not in _ATARI_FIXED_KWARGS and name not in _ATARI_OPTIONS:
            raise ConfigError(
                f"env.env_kwargs.{name}",
                f"envpool cannot honour {name!r} for an Atari game; it takes "
                f"{', '.join(sorted(_ATARI_OPTIONS))}; use manager 'sync'",
            )
    game = kwargs.get("game")
    task_id = _atari_task_id(game)
    if config.noop_max < 1:
        # envpool draws the no-op count from [1, noop_max] (and crashes on an empty range).
        raise ConfigError("env.noop_max", "must be at least 1 with manager 'envpool'")
    options: dict[str, Any] = {
        "frame_skip": config.frame_skip,
        "noop_max": config.noop_max,
        "img_height": config.screen_size,
        "img_width": config.screen_size,
        "stack_num": frame_stack_of(config),
        "gray_scale": True,
        "use_inter_area_resize": True,  # AtariPreprocessing resizes with INTER_AREA too
        "use_fire_reset": True,  # envpool presses FIRE only in games that have it
        "episodic_life": training and atari_train_option(config, config.episodic_life),
        "reward_clip": training and atari_train_option(config, config.clip_rewards),
        "zero_discount_on_life_loss": False,
        "repeat_action_probability": _float_option(
            kwargs.get("repeat_action_probability", 0.25), "repeat_action_probability"
        ),
        "full_action_space": _bool_option(
            kwargs.get("full_action_space", False), "full_action_space"
        ),
        "max_episode_steps": _atari_step_limit(config, spec, kwargs),
    }
    for name in ("mode", "difficulty"):
        value = kwargs.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"env.env_kwargs.{name}", f"must be an integer, not {value!r}")
            options[name] = value
    return EnvpoolTask(task_id, options)


def _atari_task_id(game: Any) -> str:
    """envpool's id of an ale_py game ("space_invaders" -> "SpaceInvaders-v5"), if
    envpool has it (its registry names each ROM this way)."""
    if isinstance(game, str):
        task_id = "".join(part.capitalize() for part in game.split("_")) + "-v5"
        if task_id in _envpool_ids():
            return task_id
    raise ConfigError("env.manager", f"envpool has no Atari game {game!r}; use manager 'sync'")


def _atari_step_limit(
    config: EnvConfig, spec: gym.envs.registration.EnvSpec, kwargs: Mapping[str, Any]
) -> int:
    """envpool's limit in agent steps from gymnasium's limits in frames: ale_py's
    `max_num_frames_per_episode`, and `max_episode_steps`, which for Atari counts frames
    too (`sync` makes the env with frameskip=1)."""
    limits_frames = [
        value
        for value in (
            kwargs.get("max_num_frames_per_episode"),
            config.env_kwargs.get("max_episode_steps", spec.max_episode_steps),
        )
        if value is not None
    ]
    for value in limits_frames:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                "env.env_kwargs", f"a frame limit must be a positive integer, not {value!r}"
            )
    if not limits_frames:
        return NO_STEP_LIMIT
    return min(NO_STEP_LIMIT, math.ceil(min(limits_frames) / config.frame_skip))


def _mujoco_task(config: EnvConfig, spec: gym.envs.registration.EnvSpec) -> EnvpoolTask:
    task_id = config.env_id
    if frame_stack_of(config) != 1:
        raise ConfigError(
            "env.frame_stack", "the envpool manager stacks frames of Atari games only"
        )
    defaults = envpool.make_spec(task_id).config._asdict()
    options: dict[str, Any] = {}
    limit = config.env_kwargs.get("max_episode_steps", spec.max_episode_steps)
    options["max_episode_steps"] = NO_STEP_LIMIT if limit is None else int(limit)
    for name, value in config.env_kwargs.items():
        if name in _MUJOCO_IGNORED_KWARGS or name == "max_episode_steps":
            continue
        if name == "render_mode" and value is None:
            continue
        if name in _MUJOCO_RESERVED_OPTIONS or name not in defaults:
            raise ConfigError(
                f"env.env_kwargs.{name}",
                f"envpool's {task_id} cannot honour {name!r}; use manager 'sync'",
            )
        options[name] = _like(defaults[name], value, name)
    return EnvpoolTask(task_id, options)


def _like(default: Any, value: Any, name: str) -> Any:
    """`value` as the type of envpool's default for option `name`."""
    if isinstance(default, bool):
        return _bool_option(value, name)
    if isinstance(default, float):
        return _float_option(value, name)
    if isinstance(default, int) and not isinstance(value, bool) and isinstance(value, int):
        return value
    raise ConfigError(
        f"env.env_kwargs.{name}", f"must be a {type(default).__name__} for envpool, not {value!r}"
    )


def _float_option(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"env.env_kwargs.{name}", f"must be a number, not {value!r}")
    return float(value)


def _bool_option(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"env.env_kwargs.{name}", f"must be true or false, not {value!r}")
    return value


def envpool_spaces(task: EnvpoolTask) -> Spaces:
    """The spaces envpool's task has, with its observations as this adapter delivers
    them (uint8 stays uint8, other numbers become float32)."""
    spec = envpool.make_spec(task.task_id, **task.options)
    return spaces_from(
        spec.gymnasium_observation_space,
        spec.gymnasium_action_space,
        "env.manager",
        f"envpool's {task.task_id}",
    )


def same_spaces(a: Spaces, b: Spaces) -> bool:
    """Equal spaces; action bounds compared as float32 (gymnasium keeps them so)."""
    if (a.obs_shape, a.obs_dtype, a.action_space, a.action_shape) != (
        b.obs_shape,
        b.obs_dtype,
        b.action_space,
        b.action_shape,
    ):
        return False
    if a.action_bounds is None or b.action_bounds is None:
        return a.action_bounds is b.action_bounds
    return all(
        np.array_equal(np.float32(x), np.float32(y))
        for x, y in zip(a.action_bounds, b.action_bounds, strict=True)
    )


class EnvpoolVector:
    """envpool's thread pool as a `VectorEnvAdapter`, with same-step autoreset.

    One pool of `num_envs` envs stepped together (envpool's sync mode: every step
    returns every env), on min(num_envs, CPUs) threads.
    """

    def __init__(self, config: EnvConfig, num_envs: int, *, training: bool = True) -> None:
        """Check that envpool plays `config` as `sync` would; the pool itself is made by
        `reset`, which fixes its seeds.

        Raises:
            ConfigError: the config is refused (as by `sync`), envpool has no such env
                (`env.manager`), cannot honour one of its options (that field), or its
                spaces differ from those of `sync` (`env.manager`).
        """
        self.num_envs = num_envs
        # env.num_workers: envpool's threads (a double-buffered collector's halves
        # share the CPUs); by default one per CPU.
        self.num_threads = min(num_envs, config.num_workers or usable_cpus())
        self.task = envpool_task(config, training=training)
        # The spaces `sync` plays (its own checks alone: the envpool manager's would
        # compare both the training and the evaluation task again).
        expected = env_spaces(dataclasses.replace(config, manager="sync"))
        actual = envpool_spaces(self.task)
        if not same_spaces(expected, actual):
            raise ConfigError(
                "env.manager",
                f"envpool's {self.task.task_id} gives {actual}, but '{config.env_id}' gives "
                f"{expected} with manager 'sync'; use manager 'sync'",
            )
        self._obs_dtype = np.uint8 if actual.obs_dtype == "uint8" else np.float32
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._pool: Any = None

    def reset(self, seed: int) -> np.ndarray:
        """Make a new pool seeded with `seed` (env i gets seed + i) and reset all envs."""
        self.close()
        self._pool = envpool.make(
            self.task.task_id,
            env_type="gymnasium",
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            num_threads=self.num_threads,
            seed=int(seed) % (_INT32_LIMIT - self.num_envs),
            **self.task.options,
        )
        obs, info = self._pool.reset()
        return self._in_env_order(obs, info["env_id"])

    def step(self, actions: np.ndarray) -> VectorStep:
        if self._pool is None:
            raise RuntimeError("step before reset")
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions))
        ids = info["env_id"]
        if not np.array_equal(ids, self._all_ids):  # a sync pool keeps order; be sure
            order = np.argsort(ids)
            obs, reward = obs[order], reward[order]
            terminated, truncated = terminated[order], truncated[order]
        obs = obs.astype(self._obs_dtype, copy=False)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        ended = terminated | truncated
        final_obs = obs
        if ended.any():
            # envpool would reset these on the next step, ignoring their actions; reset
            # them now and show their next episode's first observation instead.
            first_obs, first_info = self._pool.reset(np.flatnonzero(ended).astype(np.int32))
            obs = obs.copy()
            obs[first_info["env_id"]] = first_obs
        return VectorStep(obs, reward.astype(np.float64), terminated, truncated, final_obs)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):  # closing frees threads; nothing to report
                pool.close()

    def _in_env_order(self, obs: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.empty((self.num_envs, *obs.shape[1:]), self._obs_dtype)
        out[ids] = obs
        return out
