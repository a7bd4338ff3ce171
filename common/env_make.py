"""One environment as the agent sees it: made through the env guard
(common/env_guard.py), with Atari's preprocessing, frame stacking and the observation
layouts drover trains on (channels first, uint8 images kept uint8), and its spaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from common.config import ConfigError, EnvConfig
from common.env_guard import check_env, creation_error, registered_spec

# --- what the agent sees ----------------------------------------------------------------

#: The ale_py entry point: envs made from it get Atari preprocessing.
ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
#: A channels-last image's last axis (gray, RGB, RGBA).
_CHANNELS_LAST = (1, 3, 4)


@dataclass(frozen=True)
class Spaces:
    """What a job's model is built for: the observation's shape (channels first for
    images) and dtype as the envs deliver them, and the action space."""

    obs_shape: tuple[int, ...]
    action_shape: int
    action_space: str  # "discrete" | "continuous"
    action_bounds: tuple[list[float], list[float]] | None = None
    obs_dtype: str = "float32"  # "float32" | "uint8"
    #: The env gives a legal-action mask with each observation (two-player games): the
    #: model's logits for the masked-out actions must never be chosen.
    action_mask: bool = False
    #: Seats that take turns in one env: 1 for a single-agent env, 2 for a two-player
    #: game (common/games.py), whose observation is the seat to move's view.
    players: int = 1


def is_atari(config: EnvConfig) -> bool:
    spec = registered_spec(config.env_id)
    return spec is not None and spec.entry_point == ATARI_ENTRY_POINT


def frame_stack_of(config: EnvConfig) -> int:
    if config.frame_stack is not None:
        return config.frame_stack
    return 4 if is_atari(config) else 1


def atari_train_option(config: EnvConfig, value: bool | None) -> bool:
    return is_atari(config) if value is None else value


class EpisodicLife(gym.Wrapper):
    """Ends a training episode when a life is lost (as DQN's Nature paper trains), but
    resets the game only when it is really over: after a lost life, `reset` takes one
    no-op step and play goes on from there."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._lives = 0
        self._game_over = True

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self._game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op itself ended the game
                obs, info = self.env.reset(**kwargs)
        self._game_over = False
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after each reset, for the games that wait for it to start (an
    agent would otherwise have to learn to press it before anything happens)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        for action in (1, 2):  # FIRE, then the second action some games need as well
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def _observation_layout(
    space: gym.Space, env_id: str
) -> tuple[Callable[[Any], np.ndarray], gym.spaces.Box]:
    """How an env's observation becomes the array the model takes, and that array's
    space: vectors stay vectors, a Discrete becomes a one-hot vector, a Dict of flat
    parts one concatenated vector, a gray image gets a channel axis, and a
    channels-last image becomes channels first. uint8 stays uint8.

    Raises:
        ConfigError: the space is none of these (the message says what is supported).
    """
    if isinstance(space, gym.spaces.Discrete):
        n = int(space.n)
        eye = np.eye(n, dtype=np.float32)
        start = int(space.start)
        return (lambda obs: eye[int(obs) - start]), gym.spaces.Box(0.0, 1.0, (n,), np.float32)
    if isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):
        parts = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space)
        for key, part in parts:
            flat = isinstance(part, gym.spaces.Discrete) or (
                isinstance(part, gym.spaces.Box) and len(part.shape) <= 1
            )
            if not flat:
                raise ConfigError(
                    "env.obs_key",
                    f"'{env_id}' has a {type(space).__name__} observation whose part "
                    f"{key!r} is {part}: it is taken whole only when its parts are vectors "
                    "or Discrete; a Dict's env.obs_key can pick one part",
                )
        flat_space = gym.spaces.flatten_space(space)
        size = int(flat_space.shape[0])
        return (
            lambda obs: gym.spaces.flatten(space, obs).astype(np.float32, copy=False)
        ), gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(
            "env.env_id",
            f"'{env_id}' observes {type(space).__name__}; supported: Box (vectors and "
            "images), Discrete, and Dict or Tuple of those (env.obs_key picks a Dict's part)",
        )
    dtype = np.uint8 if space.dtype == np.uint8 else np.float32
    shape = tuple(int(d) for d in space.shape)
    if len(shape) <= 1:  # a vector (a scalar Box: a vector of one)
        size = shape[0] if shape else 1
        return (lambda obs: np.asarray(obs, dtype).reshape(size)), _box(space, (size,), dtype)
    if len(shape) == 2:
        box = _box(space, (1, *shape), dtype)
        return (lambda obs: np.asarray(obs, dtype)[None]), box
    if len(shape) == 3:
        if shape[-1] in _CHANNELS_LAST and shape[0] not in _CHANNELS_LAST:
            h, w, c = shape
            return (
                lambda obs: np.ascontiguousarray(np.moveaxis(np.asarray(obs, dtype), -1, 0))
            ), _box(space, (c, h, w), dtype)
        return (lambda obs: np.asarray(obs, dtype)), _box(space, shape, dtype)
    raise ConfigError(
        "env.env_id",
        f"'{env_id}' observes a Box of shape {list(shape)}; supported: vectors and images "
        "of 2 or 3 axes",
    )


def _box(space: gym.spaces.Box, shape: tuple[int, ...], dtype: type) -> gym.spaces.Box:
    if dtype == np.uint8:
        return gym.spaces.Box(0, 255, shape, np.uint8)
    return gym.spaces.Box(-np.inf, np.inf, shape, np.float32)


def make_one_env(config: EnvConfig, *, training: bool, render_mode: str | None = None) -> gym.Env:
    """One env as a job's model sees it: Atari preprocessing for ale_py envs (episodic
    life and reward clipping only when `training`), `env.obs_key`, the observation
    layout of `_observation_layout`, then `env.frame_stack`.

    The config is checked first (a collector reads it from the shared store, which
    must not be able to name code either).

    Raises:
        ConfigError: the env config is refused, or the env cannot be made or observed.
    """
    check_env(config)
    kwargs = dict(config.env_kwargs)
    if render_mode is not None:  # watching it play (common/video.py)
        kwargs["render_mode"] = render_mode
    atari = is_atari(config)
    if atari:
        kwargs["frameskip"] = 1  # frames are skipped (and max-pooled) by the wrapper
    try:
        env: gym.Env = gym.make(config.env_id, **kwargs)
    except Exception as exc:
        raise creation_error(config, exc) from None
    try:
        if atari:
            env = _atari_wrappers(env, config, training)
        if config.obs_key is not None:
            space = env.observation_space
            if not isinstance(space, gym.spaces.Dict) or config.obs_key not in space.spaces:
                keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else []
                raise ConfigError(
                    "env.obs_key",
                    f"'{config.env_id}' has no observation part {config.obs_key!r}"
                    + (f" (it has {', '.join(map(repr, keys))})" if keys else " (not a Dict)"),
                )
            key = config.obs_key
            env = gym.wrappers.TransformObservation(env, lambda obs: obs[key], space.spaces[key])
        layout, box = _observation_layout(env.observation_space, config.env_id)
        env = gym.wrappers.TransformObservation(env, layout, box)
        if config.observation_filter is not None:
            env, box = _filtered(env, box, config.observation_filter)
        stack = frame_stack_of(config)
        if stack > 1:
            if len(box.shape) == 3 and box.shape[0] == 1:
                # Gray frames stack along their channel axis: [stack, H, W].
                env = gym.wrappers.TransformObservation(
                    env, lambda obs: obs[0], _box(box, box.shape[1:], box.dtype.type)
                )
            env = gym.wrappers.FrameStackObservation(env, stack)
            if len(box.shape) == 1:
                # Vectors: [stack, n] -> one vector of stack * n.
                size = stack * box.shape[0]
                env = gym.wrappers.TransformObservation(
                    env,
                    lambda obs: np.asarray(obs).reshape(size),
                    _box(box, (size,), box.dtype.type),
                )
            elif len(box.shape) == 3 and box.shape[0] > 1:
                # Colour frames: [stack, C, H, W] -> [stack * C, H, W].
                c, h, w = box.shape
                env = gym.wrappers.TransformObservation(
                    env,
                    lambda obs: np.asarray(obs).reshape(stack * c, h, w),
                    _box(box, (stack * c, h, w), box.dtype.type),
                )
    except BaseException:
        with contextlib.suppress(Exception):
            env.close()
        raise
    return env


def _filtered(env: gym.Env, box: gym.spaces.Box, keep: list[int]) -> tuple[gym.Env, gym.spaces.Box]:
    """Only the `keep` entries of a vector observation (a partially observed task:
    CartPole's positions without their velocities).

    Raises:
        ConfigError: on `env.observation_filter`, for images, an entry past the
            vector's end, or one named twice.
    """
    if len(box.shape) != 1:
        raise ConfigError(
            "env.observation_filter", f"filters vectors; the observations are {list(box.shape)}"
        )
    size = box.shape[0]
    if max(keep) >= size or len(set(keep)) != len(keep):
        raise ConfigError(
            "env.observation_filter",
            f"{keep} must name distinct entries of the observation's {size} (0 to {size - 1})",
        )
    index = np.asarray(keep, dtype=np.intp)
    filtered = _box(box, (len(keep),), box.dtype.type)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[index], filtered), filtered


def _atari_wrappers(env: gym.Env, config: EnvConfig, training: bool) -> gym.Env:
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=config.noop_max,
        frame_skip=config.frame_skip,
        screen_size=config.screen_size,
        grayscale_obs=True,
        scale_obs=False,  # uint8 end to end: the network scales
    )
    if training and atari_train_option(config, config.episodic_life):
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    if training and atari_train_option(config, config.clip_rewards):
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return env


def spaces_of(env: gym.Env, config: EnvConfig) -> Spaces:
    """The `Spaces` of an env made by `make_one_env`."""
    return spaces_from(env.observation_space, env.action_space, "env.env_id", f"'{config.env_id}'")


def spaces_from(obs: gym.Space, act: gym.Space, field: str, what: str) -> Spaces:
    """`Spaces` of a Box observation as the envs deliver it (uint8 stays uint8, other
    numbers become float32) and a Discrete or flat Box action space.

    Raises:
        ConfigError: on `field`, naming `what`, for any other space.
    """
    if not isinstance(obs, gym.spaces.Box):
        raise ConfigError(field, f"{what} observes {obs}, not a Box")
    shape = tuple(int(d) for d in obs.shape)
    dtype = "uint8" if obs.dtype == np.uint8 else "float32"
    if isinstance(act, gym.spaces.Discrete):
        return Spaces(shape, int(act.n), "discrete", obs_dtype=dtype)
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        bounds = (act.low.astype(float).tolist(), act.high.astype(float).tolist())
        return Spaces(shape, int(act.shape[0]), "continuous", bounds, obs_dtype=dtype)
    raise ConfigError(field, f"{what} acts in {act}; supported: Discrete and flat Box actions")
