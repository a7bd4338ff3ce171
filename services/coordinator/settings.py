"""Coordinator settings, from `DROVER_*` environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.http import ServerLimits
from common.settings import env_float, env_int, env_str, read_secret, read_token


@dataclass(frozen=True, kw_only=True)
class CoordinatorSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    shared_dir: Path = Path("runs")
    token: str
    heartbeat_interval_s: float = 1.0
    lease_timeout_s: float = 10.0
    scheduler_period_s: float = 0.5
    max_buffer_items: int = 10_000_000
    threads: int = 32
    snapshot_period_s: float = 2.0
    orphan_grace_s: float = 30.0
    #: A secret that may only register workers (slaves can then run without the
    #: cluster token); empty: workers register with the cluster token.
    registration_token: str = ""
    #: Hosts workers may advertise (names, IPs, CIDRs); empty: any valid host.
    worker_hosts: tuple[str, ...] = ()
    max_workers: int = 1024
    #: Idle or half-sent connections are closed after this long.
    channel_timeout_s: float = 30.0
    connection_limit: int = 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CoordinatorSettings:
        env = os.environ if env is None else env
        return cls(
            host=env_str(env, "DROVER_HOST", "127.0.0.1"),
            port=env_int(env, "DROVER_PORT", 8000),
            shared_dir=Path(env_str(env, "DROVER_SHARED_DIR", "runs")),
            token=read_token(env),
            heartbeat_interval_s=env_float(env, "DROVER_HEARTBEAT_INTERVAL_S", 1.0),
            lease_timeout_s=env_float(env, "DROVER_LEASE_TIMEOUT_S", 10.0),
            scheduler_period_s=env_float(env, "DROVER_SCHEDULER_PERIOD_S", 0.5),
            max_buffer_items=env_int(env, "DROVER_MAX_BUFFER_ITEMS", 10_000_000),
            threads=env_int(env, "DROVER_THREADS", 32),
            snapshot_period_s=env_float(env, "DROVER_SNAPSHOT_PERIOD_S", 2.0),
            orphan_grace_s=env_float(env, "DROVER_ORPHAN_GRACE_S", 30.0),
            registration_token=read_secret(env, "DROVER_REGISTRATION_TOKEN"),
            worker_hosts=tuple(
                h.strip() for h in env.get("DROVER_WORKER_HOSTS", "").split(",") if h.strip()
            ),
            max_workers=env_int(env, "DROVER_MAX_WORKERS", 1024),
            channel_timeout_s=env_float(env, "DROVER_CHANNEL_TIMEOUT_S", 30.0),
            connection_limit=env_int(env, "DROVER_CONNECTION_LIMIT", 1000),
        )

    def server_limits(self) -> ServerLimits:
        return ServerLimits(
            threads=self.threads,
            connection_limit=self.connection_limit,
            channel_timeout_s=self.channel_timeout_s,
            cleanup_interval_s=min(5.0, self.channel_timeout_s / 2),
        )
