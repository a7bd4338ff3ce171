"""A local cluster: coordinator, collectors and a learner as processes on 127.0.0.1.

`drover run` uses it; so do the integration tests. Each service is the same
`python -m services.<name>` that compose and Kubernetes start, configured by the
same `DROVER_*` variables. With `fork_server` (what `drover run` asks for), the
collectors and learners are forked from one process that imported torch and the
services' modules once (drover/forkserver.py) instead of each starting python anew.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

from common.http_client import ServiceUnavailable
from drover.forkserver import ForkedProcess, ForkServer, become_subreaper, server_env
from services.buffer.client import BufferData
from services.coordinator.client import CoordinatorClient

#: The services a fork server may start: the slaves that import torch. A learner
#: group is torchrun's, and the coordinator imports neither torch nor the slaves.
FORKABLE_MODULES = ("services.collector", "services.learner")


#: Where the kernel picks the local ports of outgoing connections when it cannot read
#: its setting (Linux's default).
EPHEMERAL_PORTS = (32768, 60999)
#: How many ports below the ephemeral range `free_port` picks from.
PORTS_BELOW_EPHEMERAL = 10000


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel gives outgoing connections their local ports from."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_PORTS


def new_run_dir(runs_dir: str | Path, name: str) -> Path:
    """A run folder of its own for a run named `name`: `<runs_dir>/<name>-<date-time>`
    (what `drover run`, `sweep` and `tune` make, and `drover logs` finds the newest of)."""
    return Path(runs_dir) / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a service to bind a moment later. It lies below
    the ephemeral range: a port of that range (what binding port 0 gives) can go to an
    outgoing connection between the pick and the service's bind."""
    low = ephemeral_ports()[0]
    first = max(1024, low - PORTS_BELOW_EPHEMERAL)
    if low - first >= 100:
        for _ in range(100):
            port = random.randrange(first, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_args(ranks: int, max_restarts: int) -> list[str]:
    """torchrun's options for a learner group of `ranks` processes on this machine
    (`--standalone`: its own rendezvous on a free local port)."""
    return [
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(ranks),
        "--max-restarts",
        str(max_restarts),
    ]


@dataclass
class Service:
    name: str
    module: str
    port: int
    log_path: Path
    env: dict[str, str]
    cwd: Path | None = None
    #: Arguments after `python -m module`.
    args: list[str] = field(default_factory=list)
    #: Where to fork it from, if anywhere (then `env` has to add nothing the fork
    #: server's imports read: only the service's DROVER_* settings differ).
    fork_server: ForkServer | None = None
    process: subprocess.Popen | ForkedProcess | None = None
    restarts: int = 0
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        if self.fork_server is not None and self.module in FORKABLE_MODULES and not self.args:
            try:
                self.process = self.fork_server.spawn(
                    self.module, self.args, self.env, self.cwd or Path.cwd(), self.log_path
                )
                return
            except OSError as exc:  # the server is gone: a fresh python does the same
                self._log.write(f"drover: {exc}; starting python -m {self.module}\n".encode())
                self._log.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            env=self.env,
            cwd=self.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # Its own session: Ctrl-C reaches only the launcher, which then stops the
            # services in order instead of all at once.
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signum)

    def wait(self, timeout_s: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        self.signal(signal.SIGTERM)
        if not self.wait(timeout_s):
            self.signal(signal.SIGKILL)
            self.wait(5.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalCluster:
    """Start with `start()`, use `client`, end with `stop()` (or use `with`)."""

    run_dir: Path
    num_collectors: int = 2
    num_learners: int = 1
    #: Ranks of each learner: above 1, each learner is a learner group that torchrun
    #: starts (services/learner/aggregator.py), restarting it up to
    #: `learner_max_restarts` times when a rank dies or hangs.
    learner_ranks: int = 1
    learner_max_restarts: int = 10
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: What collectors and learners register with: they never hold the cluster token.
    registration_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Fork the collectors and learners from one process that imported what they
    #: import (drover/forkserver.py): they start sooner and share those pages. Where
    #: that cannot be done (not Linux), each starts python anew as without it.
    fork_server: bool = False
    #: A fork server started already (`drover run` starts it before its own imports:
    #: drover/__main__.py), used when `fork_server` is set; stopped by `stop`.
    started_fork_server: ForkServer | None = None
    services: list[Service] = field(default_factory=list)
    #: Where the services' logs go (None: `run_dir`/logs); elsewhere, they outlive a
    #: shared volume that is full or slow (the fault tests').
    logs_at: Path | None = None

    def __post_init__(self) -> None:
        self.run_dir = self.run_dir.resolve()
        self.shared_dir = self.run_dir
        self.log_dir = (self.logs_at or self.run_dir / "logs").resolve()
        coordinator_port = free_port()
        self.coordinator_url = f"http://127.0.0.1:{coordinator_port}"
        self.coordinator = self._service("coordinator", "services.coordinator", coordinator_port)
        self.collectors = [
            self._service(f"collector-{i}", "services.collector", free_port())
            for i in range(self.num_collectors)
        ]
        self.learners = [self._learner(i) for i in range(self.num_learners)]
        self.client = CoordinatorClient(self.coordinator_url, self.token, timeout_s=10.0)
        #: An operator's data calls (inserts, samples, priorities) through the
        #: coordinator's routes, which pass them on to the job's buffer process.
        self.data = BufferData(self.coordinator_url, self.token, timeout_s=10.0)
        self._fork_server: ForkServer | None = None

    @property
    def dashboard_url(self) -> str:
        """The coordinator's dashboard, signed in: the token in the URL's fragment, which
        a browser never sends to a server (the page reads it: dashboard/app.js)."""
        return f"{self.coordinator_url}/#token={self.token}"

    def _common_env(self) -> dict[str, str]:
        """What every service's environment holds, its own port and secrets aside: the
        fork server's (the launcher's without its secrets, nothing in the working
        directory, the shared root, importable) and the cluster's settings."""
        return {
            **server_env(os.environ),
            "DROVER_HOST": "127.0.0.1",
            "DROVER_COORDINATOR_URL": getattr(self, "coordinator_url", ""),
            "DROVER_SHARED_DIR": str(self.shared_dir),
            **self.extra_env,
        }

    def _service(self, name: str, module: str, port: int) -> Service:
        env = {
            **self._common_env(),
            "DROVER_PORT": str(port),
            "DROVER_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            "DROVER_REGISTRATION_TOKEN": self.registration_token,
            **self.extra_env,
        }
        if module == "services.coordinator":
            env["DROVER_TOKEN"] = self.token
        # Services run in the shared root, as they would in a container whose volume is
        # its working directory: what workers write there must never become code.
        service = Service(name, module, port, self.log_dir / f"{name}.log", env, self.shared_dir)
        self.services.append(service)
        return service

    def _learner(self, index: int) -> Service:
        service = self._service(f"learner-{index}", "services.learner", free_port())
        if self.learner_ranks > 1:
            # `drover learner --nproc N`, which becomes torchrun (same pid).
            service.module = "drover.cli"
            service.args = ["learner", "--nproc", str(self.learner_ranks)]
            service.args += ["--max-restarts", str(self.learner_max_restarts)]
        return service

    def start(self, *, ready_timeout_s: float = 60.0) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Start everything at once: slaves retry registration until the coordinator
        # answers, and their torch import (or the fork server's) overlaps the
        # coordinator's start.
        self.coordinator.start()
        started, self.started_fork_server = self.started_fork_server, None
        if self.fork_server and become_subreaper():
            if started is not None:
                self._fork_server = started
            else:
                self._fork_server = ForkServer(
                    self._common_env(), self.shared_dir, self.log_dir / "forkserver.log"
                )
        elif started is not None:
            started.discard()
        # Learners first: the first policy version, which the collectors wait for,
        # is theirs.
        for service in [*self.learners, *self.collectors]:
            service.fork_server = self._fork_server
            service.start()
        self.wait_ready(ready_timeout_s)

    def add_collector(self, module: str = "services.collector") -> Service:
        """Start one more collector while the cluster runs (it joins at once);
        `module`: another implementation of one (a fault bench's double)."""
        service = self._service(f"collector-{len(self.collectors)}", module, free_port())
        service.fork_server = self._fork_server
        self.collectors.append(service)
        service.start()
        return service

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.coordinator.alive():
                raise RuntimeError(
                    f"the coordinator exited at start:\n{self.coordinator.log_tail()}"
                )
            try:
                self.client.call("GET", "/healthz", timeout_s=1.0)
                return
            except ServiceUnavailable:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the coordinator did not answer within {timeout_s}s:\n"
                        f"{self.coordinator.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def wait_for_workers(self, timeout_s: float = 60.0) -> None:
        """Wait until every collector and learner started here has registered."""
        wanted = {"collector": len(self.collectors), "learner": len(self.learners)}
        deadline = time.monotonic() + timeout_s
        while True:
            roles = [w.role for w in self.client.workers()]
            if all(roles.count(role) >= n for role, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {roles} registered within {timeout_s}s, wanted {wanted}")
            time.sleep(0.1)

    def dead_services(self) -> list[Service]:
        return [s for s in self.services if s.process is not None and not s.alive()]

    def supervise(self, *, max_restarts: int = 3) -> list[str]:
        """Restart every service that exited; returns what happened, a line each.

        A restarted coordinator restores its jobs from the shared root, a restarted
        learner resumes from the newest checkpoint, a restarted collector simply
        registers again: what a cluster's restart policy does, done locally.

        Raises:
            RuntimeError: a service exited more than `max_restarts` times.
        """
        events = []
        for service in self.dead_services():
            code = service.process.returncode if service.process else None
            if service.restarts >= max_restarts:
                raise RuntimeError(
                    f"{service.name} exited (code {code}) after {service.restarts} restarts; "
                    f"its log ends:\n{service.log_tail()}"
                )
            service.restarts += 1
            service.stop(timeout_s=0)  # close its log before reopening it
            service.start()
            events.append(
                f"{service.name} exited (code {code}); restarted "
                f"({service.restarts}/{max_restarts})"
            )
        return events

    def stop(self) -> None:
        """Slaves first (they leave the coordinator), then the coordinator. The fork
        server is told to end first, and ends while they stop."""
        if self._fork_server is not None:
            self._fork_server.end()
        slaves = [s for s in self.services if s is not self.coordinator]
        for service in slaves:
            service.signal(signal.SIGTERM)
        for service in slaves:
            service.stop()
        self.coordinator.stop()
        if self.started_fork_server is not None:  # never started
            self.started_fork_server.discard()
            self.started_fork_server = None
        if self._fork_server is not None:
            self._fork_server.close()
            self._fork_server = None
        self.client.close()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
