"""Environment factory shared by the coordinator (to check spaces) and collectors.

A job's `env.env_id` and `env.env_kwargs` come from a REST client, and collectors read
them back from the shared store; neither may name code to run. gymnasium itself would
import the module named before `:` in an id such as `module:Env-v0`, so every env is
checked by `check_env` before `gymnasium.make` sees it: the id must already be in
gymnasium's registry, and the kwargs must be ones the env accepts, with JSON values.

What the registry holds is the operator's choice: gymnasium's own envs, plus the envs
registered by the modules listed in `DROVER_ENV_MODULES`, imported once when a service
starts (`setup_env_registry`). Usage in a service's `__main__.py`::

    try:
        settings = Settings.from_env()
        setup_env_registry()  # DROVER_ENV_MODULES=ale_py,minigrid
    except SettingsError as exc:
        ...  # print it and exit with status 2
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import ENV_ID_RE, load_env_creator
from gymnasium.vector import AutoresetMode

from common.config import ConfigError, EnvConfig, JobConfig, with_spaces
from common.settings import SettingsError

#: Comma-separated Python modules to import at start; importing one registers its envs.
ENV_MODULES_VAR = "DROVER_ENV_MODULES"

# A dotted module name, nothing else: no paths, no relative imports, no `module:attr`.
_MODULE_NAME_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")

MAX_ENV_ID_CHARS = 200
MAX_EPISODE_STEPS = 10_000_000
# How deep lists and dicts may nest inside one kwarg value; env options are flat in
# practice, and the bound keeps a hostile body from building deep structures.
MAX_KWARG_NESTING = 4


def _check_max_episode_steps(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, not {value!r}"
    if not 1 <= value <= MAX_EPISODE_STEPS:
        return f"must be in [1, {MAX_EPISODE_STEPS}], not {value}"
    return None


def _check_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, not {value!r}"


# Keywords that `gymnasium.make` takes itself, with the check for each value. Only the
# ones the installed `make` has are accepted (`autoreset` and `apply_api_compatibility`
# were removed in gymnasium 1.0).
_MAKE_KWARG_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "max_episode_steps": _check_max_episode_steps,
    "disable_env_checker": _check_bool,
    "autoreset": _check_bool,
    "apply_api_compatibility": _check_bool,
}

# Keywords that `gymnasium.make_vec` or `make` bind to their own parameters: drover
# sets them, a job must not.
_RESERVED_KWARGS = {
    "id": "the env is chosen by env.env_id",
    "num_envs": "the number of envs is set by env.collector_env_num / env.evaluator_env_num",
    "vectorization_mode": "drover chooses how envs are vectorized",
    "vector_kwargs": "drover chooses how envs are vectorized",
    "wrappers": "wrappers cannot be named in a job config",
}


# --- the registry: operator modules ----------------------------------------------------


def env_modules_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The module names listed in `DROVER_ENV_MODULES` (empty when it is unset).

    Raises:
        SettingsError: an entry is not a dotted Python module name.
    """
    raw = environ.get(ENV_MODULES_VAR, "")
    names = tuple(part.strip() for part in raw.split(",") if part.strip())
    for name in names:
        if not _MODULE_NAME_RE.fullmatch(name):
            raise SettingsError(
                f"{ENV_MODULES_VAR}: {name!r} is not a Python module name "
                "(expected names like 'ale_py,minigrid')"
            )
    return names


def load_env_modules(names: Iterable[str]) -> None:
    """Import each module so that it registers its envs with gymnasium.

    Python imports a module once per process, so calling this again is harmless.

    Raises:
        SettingsError: a module cannot be imported; the message names the variable,
            since these names come from the operator's `DROVER_ENV_MODULES`.
    """
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken env package is the operator's to fix
            raise SettingsError(
                f"{ENV_MODULES_VAR}: cannot import {name!r}: {type(exc).__name__}: {exc}"
            ) from None


#: Env packages drover depends on, whose envs are registered at start without being
#: listed (Atari and MiniGrid); one that is not installed is left out.
BUILTIN_ENV_MODULES = ("ale_py", "minigrid")


def setup_env_registry(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Import the built-in env packages and the operator's env modules; every service
    entry point calls this once at start, next to reading its settings. Idempotent.

    Returns:
        The module names that were imported.

    Raises:
        SettingsError: `DROVER_ENV_MODULES` is malformed or names a module that
            cannot be imported.
    """
    builtin = tuple(name for name in BUILTIN_ENV_MODULES if importlib.util.find_spec(name))
    names = env_modules_from_env(os.environ if environ is None else environ)
    load_env_modules(builtin + names)
    return builtin + names


# --- checking an env config ------------------------------------------------------------


def check_env(config: EnvConfig) -> None:
    """Refuse an env config that names code or that gymnasium could not make.

    Loads the registered entry point (code that gymnasium or the operator registered,
    never a module named by the config) to learn the constructor's keywords.

    Raises:
        ConfigError: on `env.env_id` or `env.env_kwargs[.<name>]`, saying what to fix.
    """
    spec = _registered_spec(config.env_id)
    kwargs = _checked_kwargs_shape(config.env_kwargs)
    make_params = _make_params()
    for name, value in kwargs.items():
        if name in make_params:
            problem = _MAKE_KWARG_CHECKS[name](value)
            if problem:
                raise ConfigError(f"env.env_kwargs.{name}", problem)
    creator = _load_creator(config, spec)
    if "render_mode" in kwargs:
        _check_render_mode(config.env_id, creator, kwargs["render_mode"])
    accepted = _constructor_keywords(creator)
    if accepted is None:  # takes **kwargs, or its signature is unknown
        return
    for name in kwargs:
        if name not in make_params and name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted | make_params), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(sorted(accepted | make_params)) or "none"
            raise ConfigError(
                f"env.env_kwargs.{name}",
                f"'{config.env_id}' takes no keyword {name!r}{hint}; it takes: {known}",
            )


def _registered_spec(env_id: Any) -> gym.envs.registration.EnvSpec:
    if not isinstance(env_id, str) or not env_id:
        raise ConfigError("env.env_id", "must be a registered env id such as 'CartPole-v1'")
    if ":" in env_id:
        raise ConfigError(
            "env.env_id",
            f"{env_id!r} names a module to import; give a registered env id such as "
            f"'CartPole-v1' (the operator adds env packages with {ENV_MODULES_VAR})",
        )
    if len(env_id) > MAX_ENV_ID_CHARS or not ENV_ID_RE.fullmatch(env_id):
        raise ConfigError("env.env_id", f"{env_id[:MAX_ENV_ID_CHARS]!r} is not a gymnasium env id")
    spec = gym.envs.registry.get(env_id)
    if spec is None:
        close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            "env.env_id",
            f"no registered env {env_id!r}{hint} (the operator adds env packages "
            f"with {ENV_MODULES_VAR})",
        )
    return spec


def _checked_kwargs_shape(env_kwargs: Any) -> dict[str, Any]:
    """The kwargs as a dict, if their names are keywords and their values are JSON."""
    if not isinstance(env_kwargs, Mapping):
        raise ConfigError("env.env_kwargs", "must be a mapping of keyword to value")
    for name, value in env_kwargs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError("env.env_kwargs", f"{name!r} is not a keyword name")
        if name in _RESERVED_KWARGS:
            raise ConfigError(f"env.env_kwargs.{name}", _RESERVED_KWARGS[name])
        _check_json_value(value, f"env.env_kwargs.{name}", depth=0)
    return dict(env_kwargs)


def _check_json_value(value: Any, field: str, depth: int) -> None:
    if value is None or isinstance(value, bool | int | float | str):
        return
    if depth >= MAX_KWARG_NESTING:
        raise ConfigError(field, f"nests lists or dicts deeper than {MAX_KWARG_NESTING}")
    if isinstance(value, list | tuple):
        for item in value:
            _check_json_value(item, field, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(field, f"has a non-string key {key!r}")
            _check_json_value(item, field, depth + 1)
        return
    raise ConfigError(field, f"must be a JSON value, not {type(value).__name__}")


def _make_params() -> set[str]:
    """The checked keywords that the installed `gymnasium.make` takes itself."""
    return set(inspect.signature(gym.make).parameters) & set(_MAKE_KWARG_CHECKS)


def _load_creator(config: EnvConfig, spec: gym.envs.registration.EnvSpec) -> Callable[..., Any]:
    entry_point = spec.entry_point
    if entry_point is None:
        raise ConfigError("env.env_id", f"'{config.env_id}' is registered without an entry point")
    if callable(entry_point):
        return entry_point
    try:
        return load_env_creator(entry_point)
    except Exception as exc:
        raise _creation_error(config, exc) from None


HEADLESS_RENDER_MODES = ("rgb_array", "ansi")


def _check_render_mode(env_id: str, creator: Any, render_mode: Any) -> None:
    if render_mode is None:
        return
    if not isinstance(render_mode, str):
        raise ConfigError(
            "env.env_kwargs.render_mode", f"must be null or a string, not {render_mode!r}"
        )
    if render_mode not in HEADLESS_RENDER_MODES:
        # Services run headless: a window ("human") on a coordinator or collector
        # would fail or stall it.
        raise ConfigError(
            "env.env_kwargs.render_mode",
            f"must be null or one of {', '.join(map(repr, HEADLESS_RENDER_MODES))}, "
            f"not {render_mode!r}",
        )
    metadata = getattr(creator, "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, Mapping) else None
    if modes is not None and render_mode not in modes:
        raise ConfigError(
            "env.env_kwargs.render_mode",
            f"'{env_id}' renders as {', '.join(map(repr, modes)) or 'nothing'}, "
            f"not {render_mode!r}",
        )


def _constructor_keywords(creator: Any) -> set[str] | None:
    """The keywords the env's constructor takes; None when it takes any (`**kwargs`) or
    its signature cannot be read (then `gymnasium.make` reports a bad keyword)."""
    try:
        signature = inspect.signature(creator)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def _creation_error(config: EnvConfig, exc: Exception) -> ConfigError:
    """What went wrong in loading or making an env, as a config error the client can act
    on: a missing package names the env, a bad argument names the kwargs."""
    env_id = config.env_id
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return ConfigError(
            "env.env_id", f"'{env_id}' needs a package that is not installed: {exc.name}"
        )
    if isinstance(exc, gym.error.DependencyNotInstalled):
        return ConfigError(
            "env.env_id", f"'{env_id}' needs a package that is not installed ({exc})"
        )
    if isinstance(exc, ImportError):
        return ConfigError("env.env_id", f"'{env_id}' cannot be loaded: {exc}")
    if config.env_kwargs and isinstance(exc, TypeError | ValueError | AssertionError):
        return ConfigError(
            "env.env_kwargs", f"'{env_id}' refused these kwargs: {type(exc).__name__}: {exc}"
        )
    return ConfigError("env.env_id", f"cannot make '{env_id}': {type(exc).__name__}: {exc}")


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


def is_atari(config: EnvConfig) -> bool:
    spec = gym.envs.registry.get(config.env_id)
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


def make_one_env(config: EnvConfig, *, training: bool) -> gym.Env:
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
    atari = is_atari(config)
    if atari:
        kwargs["frameskip"] = 1  # frames are skipped (and max-pooled) by the wrapper
    try:
        env: gym.Env = gym.make(config.env_id, **kwargs)
    except Exception as exc:
        raise _creation_error(config, exc) from None
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

    @property
    def ended(self) -> np.ndarray:
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


#: The kinds of environment, by `env.adapter`. One today (stepped by any of
#: `ENV_MANAGERS`); room for multi-agent games, each an `EnvAdapter` here.
ENV_ADAPTERS: dict[str, EnvAdapter] = {
    "gymnasium": Gymnasium(),
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


def fit_to_env(config: JobConfig) -> JobConfig:
    """The config with its model's sizes and action space filled in from its env's
    spaces, checked against the algorithm (ConfigError naming the key when they do
    not fit). Makes the env once."""
    spaces = env_spaces(config.env)
    return with_spaces(
        config,
        spaces.obs_shape,
        spaces.action_shape,
        spaces.action_space,
        spaces.action_bounds,
        spaces.obs_dtype,
    )
