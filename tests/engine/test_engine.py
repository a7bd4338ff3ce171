"""The images, `docker compose up` and `drover run --backend docker` on a real Docker
engine (make test-engine; deselected from make test)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
import requests

from tests.engine.conftest import ROOT, docker

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

PROJECT = "drover-engine-test"
TOKEN = "drover-dev-token"  # docker-compose.yml's default


def compose(engine: dict[str, str], *args: str, timeout_s: float = 300, check: bool = True):
    cli = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
    return subprocess.run(
        [*cli, "-p", PROJECT, "-f", str(ROOT / "docker-compose.yml"), *args],
        env=engine,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
        cwd=ROOT,
    )


def project_containers(engine: dict[str, str]) -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return docker(engine, "ps", "-aq", "--filter", label).stdout.split()


def test_the_images_are_lean_and_the_coordinator_has_no_torch(engine, images):
    sizes = {
        tag: int(docker(engine, "image", "inspect", "-f", "{{.Size}}", tag).stdout)
        for tag in images
    }
    print(f"\nbuild seconds {images}; sizes MB { {t: s // 10**6 for t, s in sizes.items()} }")
    probe = "import importlib.util as u; print([m for m in {mods} if u.find_spec(m)])"
    absent = docker(
        engine,
        *("run", "--rm", "--entrypoint", "python", "drover-coordinator:latest", "-c"),
        probe.format(mods=("torch", "matplotlib", "playwright", "pytest")),
    )
    assert absent.stdout.strip() == "[]", absent.stdout
    worker = docker(
        engine,
        *("run", "--rm", "--entrypoint", "python", "drover:latest", "-c"),
        "import torch, importlib.metadata as m; print(torch.__version__, "
        "sorted(d.metadata['Name'] for d in m.distributions() if 'nvidia' in d.metadata['Name']))",
    )
    version, cuda_packages = worker.stdout.strip().split(" ", 1)
    assert version.startswith("2.13.0") and "+cu" not in version and cuda_packages == "[]"
    assert sizes["drover-coordinator:latest"] < sizes["drover:latest"]


def wait_for_running_job(timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            jobs = requests.get(
                "http://127.0.0.1:8000/api/v1/jobs",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=5,
            ).json()["jobs"]
            running = [j for j in jobs if j["phase"] == "running" and j["env_steps"] > 0]
            if running:
                return running[0]["job_id"]
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(1)
    raise AssertionError("no job ran on the compose cluster in time")


def test_compose_up_trains_the_default_job_through_a_collector_kill_and_a_coordinator_restart(
    engine, images
):
    compose(engine, "down", "-v", check=False)
    try:
        up = compose(engine, "up", "-d", "--no-build", timeout_s=600)
        assert up.returncode == 0, up.stderr
        wait_for_running_job(300)
        # A collector killed: compose's restart policy, or the coordinator handing its
        # task to the other one; either way the job goes on.
        (collector, *_) = compose(engine, "ps", "-q", "collector").stdout.split()
        docker(engine, "kill", collector)
        # The coordinator restarted mid-job resumes it (durable state on the volume).
        (coordinator,) = compose(engine, "ps", "-q", "coordinator").stdout.split()
        docker(engine, "restart", coordinator, timeout_s=120)
        (submit,) = compose(engine, "ps", "-q", "submit").stdout.split()
        exit_code = docker(engine, "wait", submit, timeout_s=1800).stdout.strip()
        assert exit_code == "0", docker(engine, "logs", "--tail", "50", submit).stderr
        # The results are in the named volume.
        summary = docker(
            engine,
            *("run", "--rm", "-v", f"{PROJECT}_shared:/shared", "--entrypoint", "sh"),
            *("drover:latest", "-c", "cat /shared/*/summary.json"),
        )
        assert json.loads(summary.stdout)["phase"] == "succeeded"
    finally:
        down = compose(engine, "down", check=False)
        assert project_containers(engine) == [], down.stderr
        compose(engine, "down", "-v", check=False)


def test_drover_run_with_the_docker_backend_trains_and_tears_down(engine, images):
    before = set(docker(engine, "network", "ls", "-q").stdout.split())
    proc = subprocess.run(
        [sys.executable, "-m", "drover.cli", "run", str(ROOT / "examples" / "cartpole_dqn.yaml")]
        + ["--backend", "docker", "--timeout-s", "1200"],
        env=engine,
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert docker(engine, "ps", "-aq", "--filter", "name=drover-").stdout.split() == []
    assert set(docker(engine, "network", "ls", "-q").stdout.split()) <= before
