"""Coordinator settings, from `DROVER_*` environment variables.

Every field of `CoordinatorLimits` is settable as `DROVER_<FIELD>` (upper case), e.g.
`DROVER_LEASE_TIMEOUT_S=3` or `DROVER_WORKER_HOSTS=10.0.0.0/8,collector-0`; the
docs/operator.md's table lists them all.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.http_server import ServerLimits
from common.settings import (
    SettingsError,
    env_duration_s,
    env_float,
    env_int,
    env_str,
    read_secret,
    read_token,
)
from services.coordinator.buffers import BufferProcessSettings
from services.coordinator.state import CoordinatorLimits

#: Limits given as a duration (`90m`, `12h`, `7d`, or seconds), by their variable.
DURATION_VARIABLES = {"ended_job_retention_s": "DROVER_ENDED_JOB_RETENTION"}


def limit_variable(name: str) -> str:
    """The environment variable of a `CoordinatorLimits` field."""
    return DURATION_VARIABLES.get(name, f"DROVER_{name.upper()}")


def buffers_from_env(env: Mapping[str, str]) -> BufferProcessSettings:
    """How the coordinator runs buffer processes, from its environment."""
    old = env.get("DROVER_BUFFER_PROCESSES", "1").strip().lower()
    if old not in ("1", "true", "yes"):
        # The coordinator that hosted every buffer itself is gone: said, not ignored.
        raise SettingsError(
            f"DROVER_BUFFER_PROCESSES={old!r}: every job's buffer runs in processes of "
            "its own now (unset it)"
        )
    ports = None
    raw = env.get("DROVER_BUFFER_PORTS", "").strip()
    if raw:
        first, _, last = raw.partition("-")
        try:
            ports = (int(first), int(last or first))
        except ValueError:
            raise SettingsError(f"DROVER_BUFFER_PORTS={raw!r}: a range such as 8300-8399") from None
        if not 0 < ports[0] <= ports[1] < 65536:
            raise SettingsError(f"DROVER_BUFFER_PORTS={raw!r}: a range such as 8300-8399")
    return BufferProcessSettings(
        bind_host=env_str(env, "DROVER_HOST", "127.0.0.1"),
        advertise_host=env.get("DROVER_BUFFER_ADVERTISE_HOST", "").strip(),
        ports=ports,
        shared_dir=Path(env_str(env, "DROVER_SHARED_DIR", "runs")),
        token=read_token(env),
        metrics_token=read_secret(env, "DROVER_METRICS_TOKEN"),
        max_restarts=env_int(env, "DROVER_BUFFER_MAX_RESTARTS", 5),
        restart_window_s=env_float(env, "DROVER_BUFFER_RESTART_WINDOW_S", 60.0),
    )


def limits_from_env(env: Mapping[str, str]) -> CoordinatorLimits:
    """`CoordinatorLimits` with each field read from its variable when set."""
    values: dict[str, object] = {}
    for spec in dataclasses.fields(CoordinatorLimits):
        name, default = limit_variable(spec.name), spec.default
        if not env.get(name):
            continue
        if isinstance(default, tuple):
            values[spec.name] = tuple(h.strip() for h in env[name].split(",") if h.strip())
        elif spec.name in DURATION_VARIABLES:
            values[spec.name] = env_duration_s(env, name, default)
        elif isinstance(default, int):
            values[spec.name] = env_int(env, name, default)
        else:
            values[spec.name] = env_float(env, name, default)
        if isinstance(values[spec.name], int | float) and values[spec.name] < 0:  # type: ignore[operator]
            raise SettingsError(f"{name}={env[name]!r} must not be negative")
    return CoordinatorLimits(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class CoordinatorSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    shared_dir: Path = Path("runs")
    token: str
    #: A secret that may only register workers (slaves can then run without the
    #: cluster token); empty: workers register with the cluster token.
    registration_token: str = ""
    #: A secret that may only read `/metrics` (a Prometheus server's); empty: only the
    #: cluster token reads them.
    metrics_token: str = ""
    scheduler_period_s: float = 0.5
    threads: int = 32
    snapshot_period_s: float = 2.0
    #: Idle or half-sent connections are closed after this long.
    channel_timeout_s: float = 30.0
    connection_limit: int = 1000
    #: What workers and jobs may ask of this coordinator (leases, sizes, bounds).
    limits: CoordinatorLimits = field(default_factory=CoordinatorLimits)
    #: How each job's buffer runs in processes of its own (services/coordinator/
    #: buffers.py): `DROVER_BUFFER_ADVERTISE_HOST` (how workers reach them; the
    #: coordinator's host), `DROVER_BUFFER_PORTS` (a range, `8300-8399`; any free port
    #: when unset). None: on this coordinator's host, root and tokens.
    buffers: BufferProcessSettings | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CoordinatorSettings:
        env = os.environ if env is None else env
        return cls(
            host=env_str(env, "DROVER_HOST", "127.0.0.1"),
            port=env_int(env, "DROVER_PORT", 8000),
            shared_dir=Path(env_str(env, "DROVER_SHARED_DIR", "runs")),
            token=read_token(env),
            registration_token=read_secret(env, "DROVER_REGISTRATION_TOKEN"),
            metrics_token=read_secret(env, "DROVER_METRICS_TOKEN"),
            scheduler_period_s=env_float(env, "DROVER_SCHEDULER_PERIOD_S", 0.5),
            threads=env_int(env, "DROVER_THREADS", 32),
            snapshot_period_s=env_float(env, "DROVER_SNAPSHOT_PERIOD_S", 2.0),
            channel_timeout_s=env_float(env, "DROVER_CHANNEL_TIMEOUT_S", 30.0),
            connection_limit=env_int(env, "DROVER_CONNECTION_LIMIT", 1000),
            limits=limits_from_env(env),
            buffers=buffers_from_env(env),
        )

    def buffer_processes(self) -> BufferProcessSettings:
        """How the coordinator runs each job's buffer (`buffers`, or its defaults)."""
        if self.buffers is not None:
            return self.buffers
        return BufferProcessSettings(
            bind_host=self.host,
            shared_dir=self.shared_dir,
            token=self.token,
            metrics_token=self.metrics_token,
        )

    def server_limits(self) -> ServerLimits:
        return ServerLimits(
            threads=self.threads,
            connection_limit=self.connection_limit,
            channel_timeout_s=self.channel_timeout_s,
            cleanup_interval_s=min(5.0, self.channel_timeout_s / 2),
        )
