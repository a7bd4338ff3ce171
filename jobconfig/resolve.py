"""Raw config in, `JobConfig` out: the algorithm's defaults merged, the `policy`
section validated by the algorithm's own config class, unknown keys warned about
(errors unless `strict: false`), and the checks that span several keys.

The algorithm's config class is its registry entry's `config` (a subclass of
`common.config.PolicyConfig` whose `type` is a Literal of its name): `policy` is a
union of those classes, discriminated by `policy.type`, resolved here from the
registry as it is now (so an algorithm a test adds to it is read the same way).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from algorithms.base import Algorithm
from algorithms.registry import ALGORITHMS
from common.config import ConfigError, JobConfig, PolicyConfig, check_shape, deep_merge

#: How alike an unknown key and a known one must be to suggest it: a typo, not a
#: different word that shares a part (`rho_clip_ratio` is not `clip_ratio`).
SUGGEST_CUTOFF = 0.85
#: The sections that make a config an experiment, and what runs one.
EXPERIMENT_SECTIONS = {
    "sweep": "drover sweep (or POST /api/v1/experiments)",
    "pbt": "drover sweep (or POST /api/v1/experiments)",
    "tune": "drover tune",
}


def algorithm_of(config: JobConfig) -> Algorithm:
    """The registry's entry for the job's `policy.type`."""
    return ALGORITHMS[config.policy.type]


def _unknown_algorithm(name: object) -> str:
    return f"unknown algorithm '{name}' (known: {', '.join(sorted(ALGORITHMS))})"


def _policy_class(algo: Any) -> type[PolicyConfig]:
    if not isinstance(algo, str) or algo not in ALGORITHMS:
        raise ConfigError("policy.type", _unknown_algorithm(algo))
    return ALGORITHMS[algo].config


@cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    """Built once per class: building a schema costs ~50 ms, more than all else a job
    submission or a restored record needs."""
    return TypeAdapter(cls)


def _validated(data: dict[str, Any]) -> JobConfig:
    """`data` (merged, known keys only) as a JobConfig whose policy is its algorithm's
    class. Raises ConfigError naming the first invalid field."""
    policy = data.get("policy", {})
    if not isinstance(policy, dict):
        raise ConfigError("policy", "must be a mapping")
    cls = _policy_class(policy.get("type", "dqn"))
    return _validate(JobConfig, {**data, "policy": _validate(cls, policy, "policy.")}, "")


def _validate(cls: type, data: dict[str, Any], prefix: str) -> Any:
    try:
        return _adapter(cls).validate_python(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        path = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{prefix}{path}" if path else prefix.rstrip("."), first["msg"]) from None


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
    for section, verb in EXPERIMENT_SECTIONS.items():
        if section in raw:
            raise ConfigError(
                section, f"an experiment's section, not a job's: run the file with {verb}"
            )
    policy = raw.get("policy", {})
    algo = policy.get("type", "dqn") if isinstance(policy, dict) else "dqn"
    cls = _policy_class(algo)
    merged = deep_merge(dict(ALGORITHMS[algo].defaults), raw)
    known, unknown, ignored = _split_unknown(_job_schema(cls), merged, "", algo)
    if unknown and merged.get("strict", True) is not False:
        field_path, _, message = unknown[0].partition(": ")
        more = f"; {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise ConfigError(
            field_path, f"{message}{more} (strict: false makes unknown keys warnings)"
        )
    known.setdefault("policy", {})["type"] = algo
    config = _validated(known)
    check_consistency(config)
    config.policy.check()
    return config, unknown + ignored


def from_resolved(data: dict[str, Any]) -> JobConfig:
    """Read back a config written by `common.config.to_dict` (the job's `job.json`)."""
    return _validated(data)


def read_job_config(store: Any, job_id: str) -> JobConfig:
    """The job's resolved config, as the coordinator wrote it to `<job_id>/job.json`.

    Args:
        store: the `common.storage.SharedStore` of the shared root.
    """
    return from_resolved(store.read_json(f"{store.job_dir(job_id)}/job.json"))


# --- unknown keys ----------------------------------------------------------------------


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def section_type(annotation: Any) -> type | None:
    """The config-section dataclass inside an annotation such as `X | None` (a class:
    an Annotated bound such as `MaxLen(64)` is a dataclass instance, not a section)."""
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


@dataclasses.dataclass(frozen=True)
class _Schema:
    """A section's keys: key -> its sub-section's schema, or None for a value."""

    keys: dict[str, _Schema | None]


@cache
def _schema_of(cls: type, policy: type | None = None) -> _Schema:
    """The key tree of a section class; for JobConfig, `policy` is the algorithm's."""
    keys: dict[str, _Schema | None] = {}
    for name, hint in _hints(cls).items():
        sub = section_type(hint)
        if cls is JobConfig and name == "policy":
            sub = policy
        keys[name] = _schema_of(sub) if sub is not None else None
    return _Schema(keys)


def _job_schema(policy: type) -> _Schema:
    return _schema_of(JobConfig, policy)


def _split_unknown(
    schema: _Schema, data: dict[str, Any], prefix: str, algo: str
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Drop the keys the job's schema does not know. Returns the rest, a warning for
    each unknown key, and one for each key only other algorithms read (valid, and
    ignored: never an error, even when strict)."""
    known: dict[str, Any] = {}
    unknown: list[str] = []
    ignored: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in schema.keys:
            if _other_users(path, algo):
                # Each leaf on its own: another algorithm may have the section (`eps`)
                # but not every key in it.
                for leaf in _leaf_paths(value, path):
                    users = _other_users(leaf, algo)
                    if users:
                        verb = "does" if len(users) == 1 else "do"
                        ignored.append(
                            f"{leaf}: ignored, {algo} does not use it "
                            f"({' and '.join(users)} {verb})"
                        )
                    else:
                        name = leaf.rsplit(".", 1)[-1]
                        unknown.append(f"{leaf}: unknown key{_did_you_mean(name, schema)}")
            else:
                unknown.append(f"{path}: unknown key{_did_you_mean(str(key), schema)}")
            continue
        sub = schema.keys[key]
        if sub is not None and isinstance(value, dict):
            value, sub_unknown, sub_ignored = _split_unknown(sub, value, f"{path}.", algo)
            unknown.extend(sub_unknown)
            ignored.extend(sub_ignored)
        known[key] = value
    return known, unknown, ignored


def unknown_key(path: str, algo: str) -> str | None:
    """Why the dotted `path` is no key of an `algo` job's config (with what it may be a
    typo of), or None when it is one."""
    schema = _job_schema(_policy_class(algo))
    if _has_path(schema, path):
        return None
    node: _Schema = schema
    *parents, name = path.split(".")
    for part in parents:
        sub = node.keys.get(part)
        if sub is None:
            break
        node = sub
    return f"no such key in a {algo} job's config{_did_you_mean(name, node)}"


def _other_users(path: str, algo: str) -> list[str]:
    """The other algorithms whose schema has `path`."""
    return sorted(
        name
        for name, spec in ALGORITHMS.items()
        if name != algo and _has_path(_job_schema(spec.config), path)
    )


def _has_path(schema: _Schema, path: str) -> bool:
    node: _Schema | None = schema
    for key in path.split("."):
        if node is None or key not in node.keys:
            return False
        node = node.keys[key]
    return True


def _leaf_paths(data: Any, path: str) -> list[str]:
    if not isinstance(data, dict) or not data:
        return [path]
    return [p for key, value in data.items() for p in _leaf_paths(value, f"{path}.{key}")]


def _did_you_mean(key: str, schema: _Schema) -> str:
    """Where a key drover knows elsewhere lives, or the key it is a typo of here."""
    from jobconfig.di_engine import RENAMED

    if key in RENAMED:
        return f" (DI-engine's name: drover has {RENAMED[key]})"
    elsewhere = _schema_paths().get(key)
    if elsewhere:
        return f" (drover has it as {' and '.join(elsewhere)})"
    close = difflib.get_close_matches(key, list(schema.keys), n=1, cutoff=SUGGEST_CUTOFF)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _schema_paths() -> dict[str, tuple[str, ...]]:
    """Every key of every algorithm's schema by its name: name -> its dotted paths."""
    paths: dict[str, set[str]] = {}
    for spec in ALGORITHMS.values():
        stack: list[tuple[_Schema, str]] = [(_job_schema(spec.config), "")]
        while stack:
            schema, prefix = stack.pop()
            for name, sub in schema.keys.items():
                paths.setdefault(name, set()).add(f"{prefix}{name}")
                if sub is not None:
                    stack.append((sub, f"{prefix}{name}."))
    return {name: tuple(sorted(found)) for name, found in paths.items()}


# --- checks across keys ----------------------------------------------------------------


def min_error_buffer(config: JobConfig) -> float:
    """The smallest rate-limiter error buffer that cannot deadlock.

    A sample request takes `batch_size * num_batches` items and an insert adds
    `n_sample`. When the sampler is blocked an insert must fit, and vice versa, which
    holds when the band is at least as wide as one request plus one insert's credit.
    """
    learn = config.policy.learn
    spi = config.policy.other.replay_buffer.samples_per_insert or 0.0
    return (learn.batch_size * learn.num_batches + spi * config.policy.collect.n_sample) / 2


def error_buffer_of(config: JobConfig) -> float:
    """The rate limiter's error buffer: the job's, or twice the least that cannot
    deadlock (room for a request and an insert on either side)."""
    return config.policy.other.replay_buffer.error_buffer or 2 * min_error_buffer(config)


def insert_rows_bound(config: JobConfig) -> int | None:
    """The most items one insert may carry and still always get through the rate
    limiter; None when the job has no ratio (any insert does).

    The sampler waits once sampling a request would put it more than the error buffer
    ahead, so the limiter is never further behind the inserts than
    `error_buffer - batch_size * num_batches`; an insert of k items goes through from
    there when its credit `samples_per_insert * k` fits in what remains of the band.
    Before `min_size_to_sample` items are in, nothing samples at all: an insert that
    crosses that size starts the band from zero, so its credit must fit in the error
    buffer alone (else it and the sampler both wait, until the orphaned-segment scan
    indexes its files).
    """
    spi = config.policy.other.replay_buffer.samples_per_insert
    if spi is None:
        return None
    learn = config.policy.learn
    error_buffer = error_buffer_of(config)
    room = min(2 * error_buffer - learn.batch_size * learn.num_batches, error_buffer)
    return max(1, int(room / spi))


def sequence_length_of(config: JobConfig) -> int | None:
    """The rows of each sampled item when items are episodes or sequences (the learner
    gathers them as `[items, rows]` batches); None when an item is one row."""
    buffer = config.policy.other.replay_buffer
    return None if buffer.item == "transition" else buffer.sequence_length


def _check_sequences(config: JobConfig) -> None:
    """Episode and sequence items: what the buffer, the collectors and the learner
    can serve (ConfigError naming the key)."""
    buffer = config.policy.other.replay_buffer
    key = "policy.other.replay_buffer"
    if buffer.item == "transition":
        if buffer.sequence_length > 1:
            raise ConfigError(
                f"{key}.sequence_length",
                "sequences are sampled from episode or sequence items: set item",
            )
        if buffer.overlap:
            raise ConfigError(f"{key}.overlap", "only sequence items overlap: set item: sequence")
        return
    algorithm = algorithm_of(config)
    if algorithm.recurrent and config.env.double_buffer:
        raise ConfigError(
            "env.double_buffer",
            f"{config.policy.type}'s actor keeps a state per env: its envs step together",
        )
    unit = algorithm.collect_unit
    if unit != "transitions":
        raise ConfigError(
            f"{key}.item",
            f"{buffer.item} items are cut from the episodes the transitions loop records "
            f"(dqn, r2d2, ...); {config.policy.type} collects {unit}",
        )
    if buffer.sequence_length > buffer.replay_buffer_size:
        raise ConfigError(
            f"{key}.sequence_length",
            f"{buffer.sequence_length} is longer than the whole buffer "
            f"(replay_buffer_size {buffer.replay_buffer_size})",
        )
    if buffer.item == "sequence" and buffer.overlap >= buffer.sequence_length:
        raise ConfigError(
            f"{key}.overlap",
            f"{buffer.overlap} must be below sequence_length {buffer.sequence_length}",
        )
    if buffer.item == "episode" and buffer.overlap:
        raise ConfigError(f"{key}.overlap", "only sequence items overlap: set item: sequence")


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
    _check_sequences(config)
    normalize = getattr(config.policy, "normalize", None)  # PPO's
    if normalize is not None and normalize.reward and config.system.workflow != "sync":
        raise ConfigError(
            "policy.normalize.reward",
            "rewards are scaled in the sync workflow's rounds, not in the "
            f"{config.system.workflow} workflow's",
        )
    if buffer.type == "fifo" and learn.batch_size * learn.num_batches > buffer.replay_buffer_size:
        raise ConfigError(
            "policy.learn.num_batches",
            f"a fifo buffer of {buffer.replay_buffer_size} items can never serve "
            f"{learn.num_batches} batches of {learn.batch_size}",
        )
