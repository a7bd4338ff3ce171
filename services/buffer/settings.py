"""A buffer process's settings, from `DROVER_*` environment variables: the coordinator
that starts it sets them (buffers.py there)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from common.config import ReplayBufferConfig
from common.http_server import ServerLimits
from common.settings import SettingsError, env_float, env_int, env_str, read_secret, read_token
from services.buffer.host import ShardLimits

#: The variable that holds the job's buffer: its settings, error buffer and seed.
SPEC_VARIABLE = "DROVER_BUFFER_SPEC"
#: Set to 1 for a spare process: started before its job, it reads the variables that
#: name the job (`JOB_VARIABLES`) as one JSON line on its standard input.
SPARE_VARIABLE = "DROVER_BUFFER_SPARE"
JOB_VARIABLES = frozenset({"DROVER_BUFFER_JOB", SPEC_VARIABLE, "DROVER_PORT"})


def job_env(env: Mapping[str, str], line: str) -> dict[str, str]:
    """A spare process's environment once its job came: `env` and the JSON object
    `line` of `JOB_VARIABLES` (strings).

    Raises:
        SettingsError: not such an object.
    """
    try:
        given = json.loads(line)
    except ValueError as exc:
        raise SettingsError(f"a spare buffer process's job is not JSON: {exc}") from None
    if (
        not isinstance(given, dict)
        or set(given) != JOB_VARIABLES
        or not all(isinstance(v, str) for v in given.values())
    ):
        raise SettingsError(f"a spare buffer process's job names {sorted(JOB_VARIABLES)}")
    return {**env, **given}


@dataclass(frozen=True, kw_only=True)
class BufferSettings:
    host: str = "127.0.0.1"
    port: int = 8300
    shared_dir: Path = Path("runs")
    #: The cluster token: the coordinator calls with it, and task credentials are
    #: checked with a key derived from it.
    token: str
    metrics_token: str = ""
    job_id: str
    shard: int = 0
    config: ReplayBufferConfig
    error_buffer: float
    seed: int = 0
    snapshot_period_s: float = 2.0
    threads: int = 16
    limits: ShardLimits = field(default_factory=ShardLimits)
    #: How long a task credential is accepted after it was signed (the coordinator's
    #: `DROVER_CREDENTIAL_TTL_S`; each heartbeat of its worker renews it).
    credential_ttl_s: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BufferSettings:
        env = os.environ if env is None else env
        spec = buffer_spec(env_str(env, SPEC_VARIABLE, ""))
        return cls(
            host=env_str(env, "DROVER_HOST", "127.0.0.1"),
            port=env_int(env, "DROVER_PORT", 8300),
            shared_dir=Path(env_str(env, "DROVER_SHARED_DIR", "runs")),
            token=read_token(env),
            metrics_token=read_secret(env, "DROVER_METRICS_TOKEN"),
            job_id=env_str(env, "DROVER_BUFFER_JOB"),
            shard=int(spec["shard"]),
            config=spec["config"],
            error_buffer=float(spec["error_buffer"]),
            seed=int(spec["seed"]),
            snapshot_period_s=env_float(env, "DROVER_SNAPSHOT_PERIOD_S", 2.0),
            threads=env_int(env, "DROVER_BUFFER_THREADS", 16),
            credential_ttl_s=env_float(env, "DROVER_CREDENTIAL_TTL_S", 120.0),
            limits=ShardLimits(
                max_concurrent_inserts=env_int(env, "DROVER_MAX_CONCURRENT_INSERTS", 4),
                max_waiting_samples=env_int(env, "DROVER_MAX_WAITING_SAMPLES_PER_JOB", 4),
                max_waiting_inserts=env_int(env, "DROVER_MAX_WAITING_INSERTS", 6),
                orphan_grace_s=env_float(env, "DROVER_ORPHAN_GRACE_S", 30.0),
            ),
        )

    def __post_init__(self) -> None:
        waiting = self.limits.max_waiting_inserts + self.limits.max_waiting_samples
        if self.limits.max_waiting_inserts == 0 or self.threads <= waiting:
            # Waiting requests hold their threads: with none left over, a learner's
            # sample (what lets waiting inserts go) would queue behind them.
            raise SettingsError(
                f"DROVER_BUFFER_THREADS={self.threads} must exceed DROVER_MAX_WAITING_INSERTS "
                f"({self.limits.max_waiting_inserts}, at least 1) plus "
                f"DROVER_MAX_WAITING_SAMPLES_PER_JOB ({self.limits.max_waiting_samples})"
            )

    def server_limits(self) -> ServerLimits:
        return ServerLimits(threads=self.threads)


def spec_json(config: ReplayBufferConfig, error_buffer: float, seed: int, shard: int = 0) -> str:
    """What `DROVER_BUFFER_SPEC` holds: the job's buffer settings as the coordinator
    resolved them (its workflow's `replay`), the limiter's error buffer, the seed, and
    which of the job's `config.shards` this process serves."""
    return json.dumps(
        {
            "config": TypeAdapter(ReplayBufferConfig).dump_python(config, mode="json"),
            "error_buffer": error_buffer,
            "seed": seed,
            "shard": shard,
        }
    )


def buffer_spec(raw: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
        return {
            "config": TypeAdapter(ReplayBufferConfig).validate_python(data["config"]),
            "error_buffer": data["error_buffer"],
            "seed": data["seed"],
            "shard": data.get("shard", 0),
        }
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        raise SettingsError(f"{SPEC_VARIABLE} is not a buffer spec: {exc}") from None
