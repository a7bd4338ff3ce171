"""Environment factory shared by the coordinator (to check spaces) and collectors.

A job's `env.env_id` and `env.env_kwargs` come from a REST client, and collectors read
them back from the shared store; neither may name code to run. gymnasium itself would
import the module named before `:` in an id such as `module:Env-v0`, so every env is
checked by `check_env` before `gymnasium.make` sees it: the id must already be in
gymnasium's registry, and the kwargs must be ones the env accepts, with JSON values.

What the registry holds is the operator's choice: gymnasium's own envs, plus the envs
registered by the modules listed in `DROVER_ENV_MODULES`, imported once when a service
starts (`setup_env_registry`), plus those of the env packages drover depends on (Atari,
MiniGrid), imported the first time an id is not found without them, so a process
whose jobs never name one of their envs never loads them. Usage in a service's
`__main__.py`::

    try:
        settings = Settings.from_env()
        setup_env_registry()  # DROVER_ENV_MODULES=ale_py,minigrid
    except SettingsError as exc:
        ...  # print it and exit with status 2
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import ENV_ID_RE, load_env_creator

from common.config import ConfigError, EnvConfig
from common.settings import SettingsError

log = logging.getLogger(__name__)

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


#: Env packages drover depends on, whose envs are registered without being listed
#: (Atari and MiniGrid); one that is not installed is left out. They are imported the
#: first time an env id is not in the registry without them (`registered_spec`): an
#: import costs a process tens of MB (pygame comes with MiniGrid) that a job on
#: gymnasium's own envs has no use for.
BUILTIN_ENV_MODULES = ("ale_py", "minigrid")


def setup_env_registry(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Import the operator's env modules (`DROVER_ENV_MODULES`); every service entry
    point calls this once at start, next to reading its settings. Idempotent. The
    built-in env packages are imported when an id first needs them.

    Returns:
        The module names that were imported.

    Raises:
        SettingsError: `DROVER_ENV_MODULES` is malformed or names a module that
            cannot be imported.
    """
    names = env_modules_from_env(os.environ if environ is None else environ)
    load_env_modules(names)
    return names


def load_builtin_env_modules() -> tuple[str, ...]:
    """Import the installed built-in env packages (once a process; then a no-op), so
    that their envs are registered. Returns their names."""
    builtin = tuple(name for name in BUILTIN_ENV_MODULES if importlib.util.find_spec(name))
    try:
        load_env_modules(builtin)
    except SettingsError as exc:  # installed but broken: their envs stay unknown
        log.warning("built-in env packages: %s", exc)
    return builtin


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec | None:
    """The registry's spec for `env_id`, the built-in env packages imported first
    when it is not there without them; None if it is not registered at all."""
    spec = gym.envs.registry.get(env_id)
    if spec is None:
        load_builtin_env_modules()
        spec = gym.envs.registry.get(env_id)
    return spec


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
    spec = registered_spec(env_id)
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
        raise creation_error(config, exc) from None


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


def creation_error(config: EnvConfig, exc: Exception) -> ConfigError:
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
