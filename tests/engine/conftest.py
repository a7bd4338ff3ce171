"""A real Docker engine for tests/engine (make test-engine): the one DOCKER_HOST
reaches, or a private dockerd started here (root, Debian's docker.io) and stopped at
the end with every container it ran; and the images, built once (the engine's layer
cache and the base image stay between runs on one machine)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
#: The private engine: its state stays (the image cache), its socket is its own.
DATA_ROOT = Path("/var/lib/drover-engine")
EXEC_ROOT = Path("/run/drover-engine")
SOCKET = Path("/run/drover-engine.sock")
#: Where no registry is reachable, the base comes from Debian's packages.
BASE_IMAGE = os.environ.get("DROVER_BASE_IMAGE", "drover-base:bookworm")
#: A folder of wheels holding the CPU torch (the development machines have one).
TORCH_WHEELS = Path(os.environ.get("DROVER_TORCH_WHEELS", "/opt/wheels"))


def docker(env: dict[str, str], *args: str, timeout_s: float = 60, check: bool = True):
    return subprocess.run(
        ["docker", *args], env=env, capture_output=True, text=True, timeout=timeout_s, check=check
    )


def reachable(env: dict[str, str]) -> bool:
    try:
        return docker(env, "info", timeout_s=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def engine() -> Iterator[dict[str, str]]:
    """The environment (DOCKER_HOST) of a reachable engine."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    if shutil.which("docker") is None:
        pytest.fail("make test-engine needs the docker client (apt-get install docker.io)")
    if reachable(env):
        yield env
        return
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.fail(
            "no Docker engine is reachable and none can be started here: starting one "
            "needs root and dockerd (apt-get install docker.io)"
        )
    env["DOCKER_HOST"] = f"unix://{SOCKET}"
    DATA_ROOT.mkdir(parents=True, exist_ok=True)
    log = open(DATA_ROOT.parent / "drover-engine.log", "ab")  # noqa: SIM115
    # The storage driver is dockerd's choice: overlay2 where the kernel mounts overlays
    # (here: layers are diffs, a container starts at once), else vfs (a full copy of
    # the image per layer and per container: tens of GB for these images). No iptables
    # or default bridge: compose's and the backend's own networks are all the tests use.
    daemon = subprocess.Popen(
        [
            "dockerd",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--data-root={DATA_ROOT}",
            f"--exec-root={EXEC_ROOT}",
            f"--host=unix://{SOCKET}",
            f"--pidfile={EXEC_ROOT}.pid",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def answering() -> bool:
            if daemon.poll() is not None:
                pytest.fail(f"dockerd exited at start (its log: {log.name})")
            return reachable(env)

        wait_until(answering, 60, f"dockerd to answer (its log: {log.name})", max_interval_s=0.5)
        yield env
    finally:
        # Leave nothing running: the containers this engine holds, then the engine.
        ids = docker(env, "ps", "-aq", check=False).stdout.split()
        if ids:
            docker(env, "rm", "-f", *ids, timeout_s=120, check=False)
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)
        log.close()


#: The wheel server's port: the URL is a build argument, part of the layer cache's key,
#: so it stays the same from run to run.
WHEELS_PORT = 18765


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@functools.cache
def _wheel_server(folder: str) -> str:
    """A URL serving `folder` (pip's --find-links), on 127.0.0.1 for this session."""
    handler = functools.partial(_QuietHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEELS_PORT), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture(scope="session")
def images(engine: dict[str, str]) -> dict[str, float]:
    """drover:latest and drover-coordinator:latest, built (from the layer cache when
    nothing changed); returns each build's seconds."""
    if docker(engine, "image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        subprocess.run(
            [str(ROOT / "deploy" / "docker" / "base-image.sh"), BASE_IMAGE],
            env=engine,
            check=True,
            timeout=900,
        )
    args = ["--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    if any(TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl")):
        args += ["--build-arg", f"TORCH_FIND_LINKS={_wheel_server(str(TORCH_WHEELS))}"]
    seconds = {}
    for tag, target in (("drover:latest", "worker"), ("drover-coordinator:latest", "coordinator")):
        started = time.monotonic()
        proc = docker(
            engine,
            "build",
            *args,
            "--target",
            target,
            "-t",
            tag,
            "-f",
            str(ROOT / "deploy" / "docker" / "Dockerfile"),
            str(ROOT),
            timeout_s=3600,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        seconds[tag] = time.monotonic() - started
    # The images an earlier build tagged: the cache keeps what the new ones share.
    docker(engine, "image", "prune", "-f", timeout_s=600, check=False)
    return seconds
