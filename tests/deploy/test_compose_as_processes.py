"""docker-compose.yml runs as local processes: each service's command and environment
(its `${VAR:-default}` values as compose fills them), the `shared` volume as a folder,
the `coordinator` host name pointed at a 127.0.0.1 port, each replica on its own
port. The one-shot `submit` service must exit 0: its training job succeeded. The
image's working directory (/app) is this checkout. Traffic stays on 127.0.0.1."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from drover.local import free_port
from tests.helpers import stop_all, wait_for_success

pytestmark = [pytest.mark.processes, pytest.mark.learning]

ROOT = Path(__file__).resolve().parents[2]
JOB_DEADLINE_S = 240


def interpolate(value: str) -> str:
    """Compose's `${NAME:-default}`, with nothing set in the environment."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), value)


def test_the_compose_file_trains_the_job_when_run_as_processes(tmp_path):
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    shared = tmp_path / "shared"
    shared.mkdir()
    coordinator_port = free_port()
    processes = []
    submit = None
    try:
        for name, service in services.items():
            replicas = service.get("deploy", {}).get("replicas", 1)
            for replica in range(replicas):
                env = {k: v for k, v in os.environ.items() if not k.startswith("DROVER_")}
                env.update({k: interpolate(str(v)) for k, v in service["environment"].items()})
                assert env["DROVER_SHARED_DIR"] == "/shared"  # the volume's mount point
                env["DROVER_SHARED_DIR"] = str(shared)
                env["DROVER_COORDINATOR_URL"] = env["DROVER_COORDINATOR_URL"].replace(
                    "http://coordinator:8000", f"http://127.0.0.1:{coordinator_port}"
                )
                if "DROVER_PORT" in env:
                    port = coordinator_port if name == "coordinator" else free_port()
                    env["DROVER_PORT"] = str(port)
                    env["DROVER_HOST"] = "127.0.0.1"  # the container's own address
                if "DROVER_BUFFER_ADVERTISE_HOST" in env:
                    # The coordinator's name on compose's network, and its own ports
                    # there: here, this host and any free port.
                    assert env["DROVER_BUFFER_ADVERTISE_HOST"] == "coordinator"
                    env["DROVER_BUFFER_ADVERTISE_HOST"] = "127.0.0.1"
                    env.pop("DROVER_BUFFER_PORTS")
                env["PYTHONSAFEPATH"] = "1"
                command = [interpolate(part) for part in service["command"]]
                process = subprocess.Popen(
                    [sys.executable, "-m", "drover.cli", *command],  # ENTRYPOINT drover
                    env=env,
                    cwd=ROOT if name == "submit" else shared,  # WORKDIR /app for submit
                    stdout=open(tmp_path / f"{name}-{replica}.log", "wb"),  # noqa: SIM115
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                if name == "submit":
                    submit = process
                else:
                    processes.append(process)
        assert submit is not None, "no submit service"
        wait_for_success(submit, "the submit service", tmp_path, JOB_DEADLINE_S)
    finally:
        stop_all(processes, submit)
