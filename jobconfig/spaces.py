"""The model's sizes and action space, filled in from the job's env and checked
against its algorithm (ConfigError naming the key when they do not fit)."""

from __future__ import annotations

import dataclasses
import json

from common.config import ConfigError, EnvConfig, JobConfig, obs_shape_of
from common.envs import Spaces, env_spaces
from jobconfig.resolve import algorithm_of

_SPACE_NAMES = {"discrete": "discrete", "continuous": "continuous (Box)"}


def with_spaces(
    config: JobConfig,
    obs_shape: int | tuple[int, ...],
    action_shape: int,
    action_space: str = "discrete",
    action_bounds: tuple[list[float], list[float]] | None = None,
    obs_dtype: str = "float32",
    action_mask: bool = False,
) -> JobConfig:
    """The config with the model's input and output sizes filled in (or checked).

    A vector's shape is kept as an int (DI-engine's way), any other as a list."""
    shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
    model = config.policy.model
    given_shape = model.obs_shape
    if given_shape is not None and obs_shape_of(model) != shape:
        raise ConfigError(
            "policy.model.obs_shape",
            f"{given_shape} does not match the environment's {list(shape)}",
        )
    if model.action_shape is not None and model.action_shape != action_shape:
        raise ConfigError(
            "policy.model.action_shape",
            f"{model.action_shape} does not match the environment's {action_shape}",
        )
    algorithm = algorithm_of(config)
    if action_space not in algorithm.action_spaces:
        needs = " or ".join(_SPACE_NAMES[space] for space in sorted(algorithm.action_spaces))
        raise ConfigError("env.env_id", f"{algorithm.name.upper()} needs {needs} actions")
    if len(shape) > 1 and not algorithm.image_obs:
        raise ConfigError(
            "env.env_id",
            f"{algorithm.name.upper()} takes vector observations, and this env's are "
            f"{list(shape)} (image observations: dqn, ppo or impala)",
        )
    encoder = model.encoder
    if len(shape) == 1 and encoder not in ("auto", "mlp"):
        raise ConfigError(
            "policy.model.encoder",
            f"{encoder} needs image observations, not a vector of {shape[0]}",
        )
    if len(shape) == 3 and encoder == "mlp":
        raise ConfigError(
            "policy.model.encoder", f"mlp takes vectors; the observations are images {list(shape)}"
        )
    if len(shape) == 3 and encoder in ("nature_cnn", "impala_resnet") and min(shape[1:]) < 36:
        raise ConfigError(
            "policy.model.encoder",
            f"{encoder} needs images of 36 pixels or more a side, not {list(shape)} (use conv)",
        )
    low, high = action_bounds if action_bounds is not None else (None, None)
    model = dataclasses.replace(
        model,
        obs_shape=shape[0] if len(shape) == 1 else list(shape),
        obs_dtype=obs_dtype,  # type: ignore[arg-type]
        action_shape=action_shape,
        action_space=action_space,  # type: ignore[arg-type]
        action_mask=action_mask,
        action_low=low,
        action_high=high,
    )
    policy = dataclasses.replace(config.policy, model=model)
    return dataclasses.replace(config, policy=policy)


def fit_to_env(config: JobConfig, spaces: Spaces | None = None) -> JobConfig:
    """The config with its model's sizes and action space filled in from its env's
    spaces, checked against the algorithm (ConfigError naming the key when they do
    not fit). Makes the env once, or not at all given its `spaces`."""
    spaces = env_spaces(config.env) if spaces is None else spaces
    return with_spaces(
        config,
        spaces.obs_shape,
        spaces.action_shape,
        spaces.action_space,
        spaces.action_bounds,
        spaces.obs_dtype,
        spaces.action_mask,
    )


def known_env_spaces(env: EnvConfig, known: dict[str, Spaces] | None) -> Spaces | None:
    """The spaces of `env` made before, kept in `known` by its section; made now and
    kept there when they were not (None without `known`: `fit_to_env` makes them)."""
    if known is None:
        return None
    key = json.dumps(dataclasses.asdict(env), sort_keys=True, default=str)
    if key not in known:
        known[key] = env_spaces(env)
    return known[key]
