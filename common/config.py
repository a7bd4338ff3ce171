"""Job configuration: DI-engine-style nested dicts in, frozen dataclasses out.

A config arrives as a nested dict (YAML, JSON, or a `.py` file's `main_config` on the
CLI). It is deep-merged over the algorithm's defaults once, here, at the boundary;
unknown keys become warnings with a did-you-mean suggestion (errors when
`strict: true`); the result is validated into `JobConfig`. After this point no
service passes raw dicts around.

Key names follow DI-engine wherever it has the same knob, so its users can bring
their configs. What differs per algorithm (defaults, action spaces, the keys it reads) comes
from its entry in `algorithms.registry`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import runpy
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from annotated_types import Ge, Gt, Le, MaxLen, MinLen
from easydict import EasyDict
from pydantic import AfterValidator, ConfigDict, TypeAdapter, ValidationError, with_config

from algorithms.base import ActionSpace, Algorithm
from algorithms.registry import ALGORITHMS

PosInt = Annotated[int, Gt(0)]
EnvManager = Literal["sync", "async", "envpool"]
ObsDtype = Literal["float32", "uint8"]
Encoder = Literal["auto", "mlp", "conv", "nature_cnn", "impala_resnet"]
PosFloat = Annotated[float, Gt(0)]
Fraction = Annotated[float, Ge(0), Le(1)]

# Configs are written by people in YAML, where `1e-3` is a string: validate in lax
# mode so such values still become numbers, but refuse any key we do not know.
CONFIG_SECTION = ConfigDict(extra="forbid")

# Upper bounds that keep one job from taking a whole machine by accident.
MAX_ENVS_PER_WORKER = 1024
MAX_BUFFER_ITEMS = 50_000_000


def section(cls: type) -> type:
    return with_config(CONFIG_SECTION)(dataclass(frozen=True, kw_only=True)(cls))


class ConfigError(ValueError):
    """An invalid config; `field` is the dotted path of the offending key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@section
class EnvConfig:
    env_id: str = "CartPole-v1"
    #: What makes the envs and reports their spaces (`ENV_ADAPTERS` in common/envs.py).
    adapter: Annotated[str, MaxLen(64)] = "gymnasium"
    #: Parallel environments in each collector's vector env.
    collector_env_num: Annotated[int, Gt(0), Le(MAX_ENVS_PER_WORKER)] = 8
    #: Parallel environments used by an evaluation task.
    evaluator_env_num: Annotated[int, Gt(0), Le(MAX_ENVS_PER_WORKER)] = 5
    #: Episodes per evaluation.
    n_evaluator_episode: Annotated[int, Gt(0), Le(10_000)] = 10
    #: Mean evaluation return at which the job has succeeded (None: never by return).
    stop_value: float | None = None
    #: Keyword arguments for `gymnasium.make`.
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: How a collector steps its envs: `sync` (one process), `async` (worker
    #: subprocesses over shared memory) or `envpool` (its C++ thread pool; Atari and
    #: MuJoCo ids). All three give the same observations and rewards.
    manager: EnvManager = "sync"
    #: `async`: worker subprocesses per vector env; `envpool`: its threads (None: one per
    #: CPU, at most one per env; half that for each half of a double-buffered collector).
    num_workers: Annotated[int, Gt(0), Le(256)] | None = None
    #: Collectors of async workflows step half their envs while the policy acts on the
    #: other half (services/collector/stepping.py): for `envpool` and `async`, whose
    #: stepping leaves the GIL free, on machines where acting and stepping do not
    #: share the same cores (a GPU policy).
    double_buffer: bool = False
    #: A Dict observation's key to train on (MiniGrid: `image`); None takes the whole
    #: Dict, which must then hold flat Box and Discrete parts only.
    obs_key: Annotated[str, MaxLen(64)] | None = None
    #: The last this many observations stacked along a new first axis (None: Atari 4,
    #: others 1).
    frame_stack: Annotated[int, Gt(0), Le(64)] | None = None
    #: Atari preprocessing (ale_py envs), as DQN's Nature paper: frames repeated per
    #: action (the max of the last two kept), up to `noop_max` random no-ops at reset,
    #: `screen_size` square grayscale frames.
    frame_skip: Annotated[int, Gt(0), Le(16)] = 4
    noop_max: Annotated[int, Ge(0), Le(1000)] = 30
    screen_size: Annotated[int, Gt(0), Le(512)] = 84
    #: Training envs end an episode when a life is lost (None: on for Atari). Evaluation
    #: always plays whole games.
    episodic_life: bool | None = None
    #: Training envs give the reward's sign (None: on for Atari). Evaluation returns are
    #: always the unclipped score.
    clip_rewards: bool | None = None


@section
class ModelConfig:
    #: Observation size (an int) or shape (a list, channels first for images); filled
    #: in from the environment when left out.
    obs_shape: PosInt | list[PosInt] | None = None
    #: Filled in from the environment: `uint8` observations (images) stay uint8 from the
    #: env to the network, which scales them to [0, 1].
    obs_dtype: ObsDtype | None = None
    #: The observation encoder: `auto` takes `mlp` for vectors, `nature_cnn` for images
    #: of 36 pixels or more a side and `conv` (3x3 convolutions) for smaller ones;
    #: `impala_resnet` is IMPALA's 15-layer ResNet. For a CNN, the last entry of
    #: `encoder_hidden_size_list` is the size of its fully connected layer.
    encoder: Encoder = "auto"
    #: Number of discrete actions, or the size of a continuous action; filled in from
    #: the environment when left out.
    action_shape: PosInt | None = None
    #: Filled in from the environment: discrete (Discrete) or continuous (Box) actions.
    action_space: ActionSpace | None = None
    #: Continuous actions: the Box's bounds (filled in from the environment).
    action_low: list[float] | None = None
    action_high: list[float] | None = None
    encoder_hidden_size_list: Annotated[list[PosInt], MinLen(1)] = field(
        default_factory=lambda: [128, 128, 64]
    )
    dueling: bool = True


@section
class LearnConfig:
    batch_size: Annotated[int, Gt(0), Le(8192)] = 64
    learning_rate: PosFloat = 1e-3
    #: Hard target-network copy every this many train iterations.
    target_update_freq: PosInt = 100
    #: Soft (Polyak) target update factor; when set it replaces the hard copy.
    target_theta: Annotated[float, Gt(0), Le(1)] | None = None
    #: Gradient-norm clip (None: no clipping).
    max_grad_norm: PosFloat | None = 10.0
    #: Batches asked for in one sample request (one HTTP round trip).
    num_batches: Annotated[int, Gt(0), Le(256)] = 8
    #: How long one sample request may wait for data before it is asked again.
    sample_timeout_s: Annotated[float, Gt(0), Le(60)] = 5.0
    #: A new policy version is written every this many train iterations.
    publish_every_iters: PosInt = 10
    #: A checkpoint (model, target, optimizer, counters) every this many iterations.
    checkpoint_every_iters: PosInt = 1000
    #: PPO: passes over each round's data, and the loss's parts.
    epoch_per_collect: Annotated[int, Gt(0), Le(1000)] = 10
    clip_ratio: Annotated[float, Gt(0), Le(1)] = 0.2
    value_weight: Annotated[float, Ge(0)] = 0.5
    entropy_weight: Annotated[float, Ge(0)] = 0.0
    #: PPO: normalize advantages within each minibatch.
    adv_norm: bool = True
    #: SAC: the entropy temperature it starts from (then tuned automatically).
    init_alpha: Annotated[float, Gt(0)] = 0.2
    #: SAC: the critics', the actor's and the temperature's own learning rates
    #: (DI-engine's keys; None: `learning_rate`).
    learning_rate_q: PosFloat | None = None
    learning_rate_policy: PosFloat | None = None
    learning_rate_alpha: PosFloat | None = None
    #: Train data-parallel on a learner group (DI-engine's key, the same meaning):
    #: each rank takes an equal share of every batch and gradients are averaged across
    #: ranks every update. `drover run` then starts one rank per CUDA device (or
    #: `--learner-ranks N`), and the coordinator gives the job the free learner with
    #: the most ranks. Any job also trains on a learner group it is given.
    multi_gpu: bool = False
    #: IMPALA: V-trace's importance-weight clips.
    rho_clip: Annotated[float, Gt(0)] = 1.0
    c_clip: Annotated[float, Gt(0)] = 1.0


@section
class CollectConfig:
    #: Transitions in one step-data segment (one file, one insert message).
    n_sample: Annotated[int, Gt(0), Le(100_000)] = 64
    #: How often a collector asks for the newest policy version.
    policy_poll_s: Annotated[float, Gt(0), Le(60)] = 0.2
    #: How long one insert may wait for the rate limiter before it is retried.
    insert_timeout_s: Annotated[float, Gt(0), Le(60)] = 2.0
    #: PPO: the GAE lambda the collectors compute advantages with.
    gae_lambda: Fraction = 0.95
    #: SAC: env steps of uniformly random actions at the start of a job.
    random_collect_size: Annotated[int, Ge(0)] = 1000
    #: IMPALA: steps in each unroll (one buffer item per env and unroll).
    unroll_len: Annotated[int, Gt(0), Le(1000)] = 32


@section
class EvaluatorConfig:
    #: Evaluate the newest policy every this many train iterations.
    eval_freq: PosInt = 200


@section
class EvalConfig:
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)


@section
class EpsConfig:
    type: Literal["exp", "linear"] = "exp"
    start: Fraction = 0.95
    end: Fraction = 0.05
    #: Env steps (of the whole job) over which epsilon decays.
    decay: PosInt = 10_000


@section
class ReplayBufferConfig:
    #: Sampler: uniform, prioritized (proportional PER), or fifo (a queue: each item
    #: sampled once, oldest first, for on-policy use).
    type: Literal["uniform", "prioritized", "fifo"] = "uniform"
    replay_buffer_size: Annotated[int, Gt(0), Le(MAX_BUFFER_ITEMS)] = 100_000
    #: Which items leave a full buffer: the oldest, the newest, or random ones.
    eviction: Literal["fifo", "lifo", "uniform"] = "fifo"
    #: What one item is: a row of a segment (a transition, or an unroll whose columns
    #: have a time axis), or a whole episode from which sub-sequences are sampled.
    item: Literal["transition", "episode"] = "transition"
    #: Episode items: rows in each sampled sub-sequence (never crossing episodes).
    sequence_length: PosInt = 1
    #: Prioritized: priority exponent, importance-weight exponent and the sampled
    #: batches over which beta rises to 1 (0: no annealing).
    alpha: Annotated[float, Ge(0), Le(1)] = 0.6
    beta: Fraction = 0.4
    beta_anneal_steps: Annotated[int, Ge(0)] = 100_000
    #: Added to |TD error| so no item's priority reaches zero.
    priority_eps: Annotated[float, Gt(0)] = 1e-6
    #: An item is retired after being sampled this many times (None: never).
    max_use: PosInt | None = None
    #: Items collected by a policy more than this many versions behind the newest are
    #: never sampled and are evicted (None: no limit).
    max_staleness: Annotated[int, Ge(0)] | None = None
    #: Sampled items per inserted item that the rate limiter keeps (None: no limit).
    samples_per_insert: PosFloat | None = None
    #: Items the buffer must hold before the first sample.
    min_size_to_sample: PosInt = 1000
    #: Allowed drift from `samples_per_insert`, in sampled items (None: derived).
    error_buffer: PosFloat | None = None


@section
class OtherConfig:
    eps: EpsConfig = field(default_factory=EpsConfig)
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)


def _unknown_algorithm(name: object) -> str:
    return f"unknown algorithm '{name}' (known: {', '.join(sorted(ALGORITHMS))})"


def _known_algorithm(name: str) -> str:
    if name not in ALGORITHMS:
        raise ValueError(_unknown_algorithm(name))
    return name


@section
class PolicyConfig:
    #: The algorithm: a name in `algorithms.registry.ALGORITHMS`.
    type: Annotated[str, AfterValidator(_known_algorithm)] = "dqn"
    #: Train and act on CUDA (DI-engine's key); `device` overrides it. Such a job runs
    #: only on workers that report CUDA devices (common/devices.py), never on CPU.
    cuda: bool = False
    device: Literal["cpu", "cuda"] | None = None
    discount_factor: Annotated[float, Gt(0), Le(1)] = 0.99
    nstep: Annotated[int, Gt(0), Le(100)] = 1
    model: ModelConfig = field(default_factory=ModelConfig)
    learn: LearnConfig = field(default_factory=LearnConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    other: OtherConfig = field(default_factory=OtherConfig)

    @property
    def torch_device(self) -> str:
        return self.device or ("cuda" if self.cuda else "cpu")


@section
class EvaluateWorkflowConfig:
    """What an `evaluate` workflow job runs."""

    #: A policy file, a learner checkpoint, or uniformly random actions.
    source: Literal["policy", "checkpoint", "random"] = "random"
    #: The policy or checkpoint file, relative to the shared root.
    path: str | None = None
    #: Episodes in all, split over the collectors (None: env.n_evaluator_episode).
    episodes: Annotated[int, Gt(0), Le(1_000_000)] | None = None


@section
class SystemConfig:
    #: A name in `WORKFLOWS` (services/coordinator/workflows/), checked there:
    #: async: collectors and learner run freely, the rate limiter keeps the replay
    #: ratio. evaluate: no training; run `evaluate.source` for its episodes and report.
    #: sync: rounds of "collect exactly n_sample with version v, train on exactly that
    #: data, publish v + 1" (on-policy: PPO).
    workflow: Annotated[str, MinLen(1), MaxLen(64)] = "async"
    #: Data collected by a policy more than this many versions behind the learner's is
    #: not trained on (an async job's bound on policy lag; None: no bound).
    max_policy_lag: Annotated[int, Ge(0)] | None = None
    evaluate: EvaluateWorkflowConfig = field(default_factory=EvaluateWorkflowConfig)
    #: Collectors given to this job (None: every free collector).
    collector_num: Annotated[int, Gt(0), Le(1024)] | None = None
    learner_num: Literal[1] = 1
    #: The job ends after this many env steps (None: no limit).
    max_env_step: PosInt | None = None
    #: The job ends after this many train iterations (None: no limit).
    max_train_iter: PosInt | None = None
    #: Seeds every task's RNGs (each task gets its own, derived from it).
    seed: Annotated[int, Ge(0), Le(2**31 - 1)] = 0
    #: torch threads per process; 1 keeps many processes from fighting over cores.
    torch_num_threads: Annotated[int, Gt(0), Le(256)] = 1


@section
class JobConfig:
    exp_name: str = "drover"
    #: Unknown keys are errors instead of warnings.
    strict: bool = False
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    system: SystemConfig = field(default_factory=SystemConfig)


def algorithm_of(config: JobConfig) -> Algorithm:
    """The registry's entry for the job's `policy.type`."""
    return ALGORITHMS[config.policy.type]


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new dict: `override` merged into `base`, recursing into nested dicts."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _section_type(annotation: Any) -> type | None:
    """The config-section dataclass inside an annotation such as `X | None`."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _split_unknown(cls: type, data: dict[str, Any], prefix: str) -> tuple[dict, list[str]]:
    """Drop keys `cls` does not know; return the rest and a warning for each."""
    hints = _hints(cls)
    known: dict[str, Any] = {}
    warnings: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in hints:
            warnings.append(f"{path}: unknown key{_did_you_mean(str(key), hints)}")
            continue
        sub = _section_type(hints[key])
        if sub is not None and isinstance(value, dict):
            value, sub_warnings = _split_unknown(sub, value, f"{path}.")
            warnings.extend(sub_warnings)
        known[key] = value
    return known, warnings


#: How alike an unknown key and a known one must be to suggest it: a typo, not a
#: different word that shares a part (`rho_clip_ratio` is not `clip_ratio`).
SUGGEST_CUTOFF = 0.85


def _did_you_mean(key: str, hints: dict[str, Any]) -> str:
    """Where a key drover knows elsewhere lives, or the key it is a typo of here."""
    from common.di_engine import RENAMED  # it reads this module's ConfigError

    if key in RENAMED:
        return f" (DI-engine's name: drover has {RENAMED[key]})"
    elsewhere = _schema_paths().get(key)
    if elsewhere:
        return f" (drover has it as {' and '.join(elsewhere)})"
    close = difflib.get_close_matches(key, list(hints), n=1, cutoff=SUGGEST_CUTOFF)
    return f" (did you mean '{close[0]}'?)" if close else ""


@cache
def _schema_paths() -> dict[str, tuple[str, ...]]:
    """Every key of the schema by its name: name -> its dotted paths."""
    paths: dict[str, list[str]] = {}
    stack: list[tuple[type, str]] = [(JobConfig, "")]
    while stack:
        cls, prefix = stack.pop()
        for name, hint in _hints(cls).items():
            paths.setdefault(name, []).append(f"{prefix}{name}")
            sub = _section_type(hint)
            if isinstance(sub, type):  # a section (not a validator's dataclass)
                stack.append((sub, f"{prefix}{name}."))
    return {name: tuple(sorted(found)) for name, found in paths.items()}


MAX_CONFIG_DEPTH = 12
MAX_CONFIG_ITEMS = 10_000


def check_shape(raw: Any) -> None:
    """Refuse configs nested too deep or too large to be a real job's.

    Raises:
        ConfigError: naming the path where the limit was crossed.
    """
    items = 0
    stack: list[tuple[Any, str, int]] = [(raw, "config", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(path, f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        children = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, list)
            else ()
        )
        for key, child in children:
            items += 1
            if items > MAX_CONFIG_ITEMS:
                raise ConfigError("config", f"more than {MAX_CONFIG_ITEMS} keys and items")
            stack.append((child, f"{path}.{key}", depth + 1))


@cache
def _job_config_adapter() -> TypeAdapter[JobConfig]:
    """Built once: building the schema costs ~50 ms, more than all else a job
    submission or a restored record needs."""
    return TypeAdapter(JobConfig)


def resolve_job_config(raw: Any) -> tuple[JobConfig, list[str]]:
    """Merge `raw` over its algorithm's defaults and validate it.

    Returns:
        The frozen config and the warnings about unknown keys.

    Raises:
        ConfigError: naming the first invalid field.
    """
    if not isinstance(raw, dict):
        raise ConfigError("config", "must be a mapping of sections (env, policy, system)")
    check_shape(raw)
    policy = raw.get("policy", {})
    algo = policy.get("type", "dqn") if isinstance(policy, dict) else "dqn"
    if not isinstance(algo, str) or algo not in ALGORITHMS:
        raise ConfigError("policy.type", _unknown_algorithm(algo))
    merged = EasyDict(deep_merge(dict(ALGORITHMS[algo].defaults), raw))
    known_keys, warnings = _split_unknown(JobConfig, _plain(merged), "")
    if warnings and merged.get("strict") is True:
        field_path, _, message = warnings[0].partition(": ")
        raise ConfigError(field_path, message)
    try:
        config = _job_config_adapter().validate_python(known_keys)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ConfigError(".".join(str(p) for p in first["loc"]), first["msg"]) from None
    check_consistency(config)
    return config, warnings + _ignored_by(algo, raw)


def _ignored_by(algo: str, raw: dict[str, Any]) -> list[str]:
    """A warning for each key the job sets that belongs to other algorithms only
    (PPO's clip_ratio in a DQN job): it is valid, and it changes nothing."""
    owners: dict[str, list[str]] = {}
    for name, spec in ALGORITHMS.items():
        for key in spec.config_keys:
            owners.setdefault(key, []).append(name)
    mine = ALGORITHMS[algo].config_keys
    warnings = []
    for path in _leaf_paths(raw, ""):
        key = next((k for k in owners if path == k or path.startswith(f"{k}.")), None)
        if key is not None and key not in mine:
            users = sorted(owners[key])
            verb = "does" if len(users) == 1 else "do"
            warnings.append(
                f"{path}: ignored, {algo} does not use it ({' and '.join(users)} {verb})"
            )
    return warnings


def _leaf_paths(data: Any, prefix: str) -> list[str]:
    if not isinstance(data, dict):
        return [prefix.rstrip(".")]
    return [p for key, value in data.items() for p in _leaf_paths(value, f"{prefix}{key}.")]


def _plain(value: Any) -> Any:
    """EasyDict -> plain dicts and lists (EasyDict turns lists of dicts into its own)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def min_error_buffer(config: JobConfig) -> float:
    """The smallest rate-limiter error buffer that cannot deadlock.

    A sample request takes `batch_size * num_batches` items and an insert adds
    `n_sample`. When the sampler is blocked an insert must fit, and vice versa, which
    holds when the band is at least as wide as one request plus one insert's credit.
    """
    learn = config.policy.learn
    spi = config.policy.other.replay_buffer.samples_per_insert or 0.0
    return (learn.batch_size * learn.num_batches + spi * config.policy.collect.n_sample) / 2


def check_consistency(config: JobConfig) -> None:
    """Checks that span several keys. Raises ConfigError naming the keys."""
    buffer = config.policy.other.replay_buffer
    learn = config.policy.learn
    if buffer.min_size_to_sample > buffer.replay_buffer_size:
        raise ConfigError(
            "policy.other.replay_buffer.min_size_to_sample",
            f"{buffer.min_size_to_sample} exceeds replay_buffer_size "
            f"{buffer.replay_buffer_size}: the buffer could never be sampled",
        )
    if learn.batch_size > buffer.replay_buffer_size:
        raise ConfigError(
            "policy.learn.batch_size",
            f"{learn.batch_size} exceeds replay_buffer_size {buffer.replay_buffer_size}",
        )
    if buffer.samples_per_insert is not None and buffer.error_buffer is not None:
        needed = min_error_buffer(config)
        if buffer.error_buffer < needed:
            raise ConfigError(
                "policy.other.replay_buffer.error_buffer",
                f"{buffer.error_buffer} can deadlock with samples_per_insert="
                f"{buffer.samples_per_insert}, batch_size*num_batches="
                f"{learn.batch_size * learn.num_batches} and n_sample="
                f"{config.policy.collect.n_sample}; it must be at least {needed}",
            )
    if buffer.type == "fifo" and (buffer.samples_per_insert or 0) > 1:
        raise ConfigError(
            "policy.other.replay_buffer.samples_per_insert",
            f"{buffer.samples_per_insert} can never be reached: a fifo buffer hands out "
            "each item once (at most 1 sample per insert)",
        )
    if buffer.sequence_length > 1 and buffer.item != "episode":
        raise ConfigError(
            "policy.other.replay_buffer.sequence_length",
            "sub-sequences are sampled from episode items: set item: episode",
        )
    if buffer.type == "fifo" and learn.batch_size * learn.num_batches > buffer.replay_buffer_size:
        raise ConfigError(
            "policy.learn.num_batches",
            f"a fifo buffer of {buffer.replay_buffer_size} items can never serve "
            f"{learn.num_batches} batches of {learn.batch_size}",
        )
    eps = config.policy.other.eps
    if eps.end > eps.start:
        raise ConfigError("policy.other.eps.end", f"{eps.end} is above start {eps.start}")


_SPACE_NAMES = {"discrete": "discrete", "continuous": "continuous (Box)"}


def with_spaces(
    config: JobConfig,
    obs_shape: int | tuple[int, ...],
    action_shape: int,
    action_space: str = "discrete",
    action_bounds: tuple[list[float], list[float]] | None = None,
    obs_dtype: str = "float32",
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
        action_low=low,
        action_high=high,
    )
    policy = dataclasses.replace(config.policy, model=model)
    return dataclasses.replace(config, policy=policy)


def obs_shape_of(model: ModelConfig) -> tuple[int, ...]:
    """The model's observation shape as a tuple (a vector's too)."""
    if model.obs_shape is None:
        raise ValueError("policy.model.obs_shape must be filled in from the env first")
    shape = model.obs_shape
    return (shape,) if isinstance(shape, int) else tuple(shape)


def to_dict(config: JobConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_resolved(data: dict[str, Any]) -> JobConfig:
    """Read back a config written by `to_dict` (the job's `job.json`)."""
    return _job_config_adapter().validate_python(data)


def read_job_config(store: Any, job_id: str) -> JobConfig:
    """The job's resolved config, as the coordinator wrote it to `<job_id>/job.json`.

    Args:
        store: the `common.storage.SharedStore` of the shared root.
    """
    return from_resolved(store.read_json(f"{store.job_dir(job_id)}/job.json"))


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML, JSON or Python config file into a plain dict (`load_config`
    without its notes)."""
    return load_config(path)[0]


def load_config(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """Read a YAML, JSON or Python config file into a plain dict, and a note for each
    DI-engine key it translated.

    A Python file is DI-engine's shape: `main_config`, and `create_config` naming the
    algorithm and the env (common/di_engine.py maps both, or refuses them). Python
    configs run code, so only the local CLI reads them; the REST API takes data.
    """
    from common.di_engine import from_di_engine  # it reads this module's ConfigError

    path = Path(path)
    create: Any = None
    if not path.is_file():
        raise ConfigError("config", f"no such file: {path}")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        data = yaml.safe_load(path.read_text())
    elif suffix == ".json":
        data = json.loads(path.read_text())
    elif suffix == ".py":
        names = runpy.run_path(str(path), run_name="drover_config")
        data, create = names.get("main_config"), names.get("create_config")
        if data is None:
            raise ConfigError("config", f"{path} defines no main_config")
    else:
        raise ConfigError("config", f"{path}: use .yaml, .yml, .json or .py")
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} does not hold a mapping")
    if create is not None and not isinstance(create, dict):
        raise ConfigError("create_config", f"{path}: create_config is not a mapping")
    if suffix != ".py":
        return _plain(data), []
    return from_di_engine(_plain(data), _plain(create) if create is not None else None)
