"""Reading service settings from `DROVER_*` environment variables.

Each service has its own frozen settings dataclass (`services/<name>/settings.py`);
these helpers read and check the variables they share, so compose and Kubernetes can
configure everything with env vars.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less the cluster token and the registration secret (and their `_FILE`
    forms): the environment of a process started for a service's own work, which is
    handed the credential it needs otherwise, or not at all."""
    return {k: v for k, v in env.items() if not k.startswith(("DROVER_TOKEN", "DROVER_REG"))}


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def env_str(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, default)
    if value is None or value == "":
        raise SettingsError(f"{name} must be set")
    return value


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


#: Seconds in each unit a duration may be given in.
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def env_duration_s(env: Mapping[str, str], name: str, default: float) -> float:
    """A duration in seconds, given as seconds (`3600`) or with a unit (`90m`, `12h`,
    `7d`)."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    scale = _DURATION_UNITS.get(raw[-1].lower())
    try:
        return float(raw[:-1]) * scale if scale is not None else float(raw)
    except ValueError:
        raise SettingsError(
            f"{name}={raw!r} is not a duration (seconds, or a number with s, m, h or d)"
        ) from None


def read_secret(env: Mapping[str, str], name: str) -> str:
    """A secret from `NAME`, or the contents of the file `NAME_FILE` (Kubernetes and
    compose secrets); empty when neither is set."""
    secret = env.get(name, "")
    path = env.get(f"{name}_FILE", "")
    if not secret and path:
        try:
            secret = Path(path).read_text().strip()
        except OSError as exc:
            raise SettingsError(f"{name}_FILE={path}: {exc.strerror}") from None
    return secret


#: Where a coordinator listens by default (`CoordinatorSettings`: 127.0.0.1:8000).
DEFAULT_COORDINATOR_URL = "http://127.0.0.1:8000"


def coordinator_url() -> str:
    """The coordinator a user's commands and client talk to unless told otherwise:
    `DROVER_COORDINATOR_URL`, else the default."""
    return os.environ.get("DROVER_COORDINATOR_URL") or DEFAULT_COORDINATOR_URL


def read_token(env: Mapping[str, str] | None = None) -> str:
    """The cluster API token: `DROVER_TOKEN`, or the contents of `DROVER_TOKEN_FILE`."""
    token = read_secret(os.environ if env is None else env, "DROVER_TOKEN")
    if not token:
        raise SettingsError("set DROVER_TOKEN or DROVER_TOKEN_FILE (the API token)")
    return token


#: Binds on every interface.
WILDCARD_HOSTS = ("0.0.0.0", "::")


def default_advertise_url(host: str, port: int) -> str:
    """Where others reach a service bound to `host`: a wildcard bind (containers,
    pods) advertises this machine's own address, which compose networks and
    Kubernetes pod networks route to."""
    if host in WILDCARD_HOSTS:
        host = socket.gethostbyname(socket.gethostname())
    return f"http://{host}:{port}"


@dataclass(frozen=True, kw_only=True)
class SlaveSettings:
    """Settings every slave (collector, learner) reads."""

    host: str
    port: int
    #: The URL the coordinator reaches this slave at: the compose service name, the
    #: pod IP on Kubernetes, 127.0.0.1 locally.
    advertise_url: str
    coordinator_url: str
    shared_dir: Path
    #: The cluster token; may be empty when a registration secret is given (then
    #: this process never holds the cluster token).
    token: str
    registration_token: str = ""
    #: A secret that may only read `/metrics` (`DROVER_METRICS_TOKEN`, a Prometheus
    #: server's); empty: only the cluster token reads them.
    metrics_token: str = ""
    #: `advertise_url` was given (`DROVER_ADVERTISE_URL`), not looked up.
    advertise_given: bool = False

    def address_now(self) -> str:
        """The URL to register with now: for a wildcard bind advertising no URL of
        its own, this machine's address looked up again (a container reconnected to
        its network may have another); else `advertise_url`."""
        if self.advertise_given or self.host not in WILDCARD_HOSTS:
            return self.advertise_url
        return default_advertise_url(self.host, self.port)

    @classmethod
    def from_env(cls, default_port: int, env: Mapping[str, str] | None = None) -> SlaveSettings:
        env = os.environ if env is None else env
        host = env_str(env, "DROVER_HOST", "127.0.0.1")
        port = env_int(env, "DROVER_PORT", default_port)
        registration = read_secret(env, "DROVER_REGISTRATION_TOKEN")
        return cls(
            host=host,
            port=port,
            advertise_url=env.get("DROVER_ADVERTISE_URL") or default_advertise_url(host, port),
            coordinator_url=env_str(env, "DROVER_COORDINATOR_URL", "http://127.0.0.1:8000"),
            shared_dir=Path(env_str(env, "DROVER_SHARED_DIR", "runs")),
            token=read_secret(env, "DROVER_TOKEN") if registration else read_token(env),
            registration_token=registration,
            metrics_token=read_secret(env, "DROVER_METRICS_TOKEN"),
            advertise_given=bool(env.get("DROVER_ADVERTISE_URL")),
        )
