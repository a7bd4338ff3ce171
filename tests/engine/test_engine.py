"""The images, `docker compose up` and `drover run --backend docker` on a real Docker
engine (make test-engine; deselected from make test)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.engine.conftest import BASE_IMAGE, ROOT, docker
from tests.helpers import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

PROJECT = "drover-engine-test"
TOKEN = "drover-dev-token"  # docker-compose.yml's defaults
METRICS_TOKEN = "drover-dev-metrics"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
#: Where the scrape config expects the metrics secret (its credentials_file).
PROMETHEUS_TOKEN_PATH = "/etc/prometheus/drover-metrics-token"


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


def running_containers(engine: dict[str, str], name_filter: str) -> list[str]:
    return docker(engine, "ps", "-q", "--filter", name_filter).stdout.split()


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


def compose_scrape_config(
    folder: Path, credentials_file: str = PROMETHEUS_TOKEN_PATH, scrape_interval_s: int = 2
) -> tuple[Path, Path]:
    """deploy/prometheus/prometheus.yml's compose jobs (Debian's Prometheus has no
    Kubernetes discovery built in), scraping every few seconds, and the metrics secret
    in a file beside it; returns (config, secret file). Each job reads the secret from
    `credentials_file`: the config's own path where the file is mounted there."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = f"{scrape_interval_s}s"
    config["global"]["scrape_timeout"] = f"{scrape_interval_s}s"
    jobs = [job for job in config["scrape_configs"] if "kubernetes_sd_configs" not in job]
    for job in jobs:
        assert job["authorization"]["credentials_file"] == PROMETHEUS_TOKEN_PATH, job
        job["authorization"]["credentials_file"] = credentials_file
    config["scrape_configs"] = jobs
    secret = folder / "drover-metrics-token"
    secret.write_text(METRICS_TOKEN)
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path, secret


def test_promtool_accepts_the_compose_jobs_of_the_scrape_config(tmp_path):
    if shutil.which("promtool") is None:
        pytest.fail("make test-engine needs promtool (apt-get install prometheus)")
    # promtool checks that the secret's file exists: here, the one written beside.
    config, _ = compose_scrape_config(tmp_path, str(tmp_path / "drover-metrics-token"))
    jobs = yaml.safe_load(config.read_text())["scrape_configs"]
    assert {job["job_name"] for job in jobs} == {
        "drover-coordinator",
        "drover-learner",
        "drover-collector",
    }
    check = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture(scope="session")
def prometheus_image(engine, tmp_path_factory) -> str:
    """An image holding the host's Prometheus (Debian's; no registry to pull one from)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("make test-engine needs prometheus (apt-get install prometheus)")
    context = tmp_path_factory.mktemp("prometheus-image")
    shutil.copy(binary, context / "prometheus")
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY prometheus /usr/local/bin/prometheus\n"
        'ENTRYPOINT ["/usr/local/bin/prometheus"]\n'
    )
    tag = "drover-test-prometheus:latest"
    docker(engine, "build", "-t", tag, str(context), timeout_s=600)
    return tag


def start_prometheus(engine: dict[str, str], image: str, folder: Path) -> str:
    """Prometheus on the compose network, scraping with the metrics secret."""
    config, secret = compose_scrape_config(folder)
    name = f"{PROJECT}-prometheus"
    docker(engine, "rm", "-f", name, check=False)
    docker(
        engine,
        *("run", "-d", "--name", name, "--network", f"{PROJECT}_default"),
        *("-v", f"{config}:/etc/prometheus/prometheus.yml:ro"),
        *("-v", f"{secret}:{PROMETHEUS_TOKEN_PATH}:ro"),
        image,
        *("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/tmp/tsdb"),
        timeout_s=300,
    )
    return name


def scrape_targets(engine: dict[str, str], prometheus: str) -> list[dict]:
    """Prometheus's active targets, read through its API from inside its container."""
    query = (
        "import urllib.request; print(urllib.request.urlopen("
        "'http://127.0.0.1:9090/api/v1/targets?state=active', timeout=5).read().decode())"
    )
    out = docker(engine, "exec", prometheus, "python3", "-c", query, check=False)
    if out.returncode != 0:
        return []
    return json.loads(out.stdout)["data"]["activeTargets"]


def wait_until_every_service_is_scraped(
    engine: dict[str, str], prometheus: str, collectors: int, timeout_s: float
) -> list[dict]:
    expected = sorted(["coordinator", "learner", *["collector"] * collectors])
    seen: list[dict] = []

    def every_service_up() -> list[dict]:
        seen[:] = scrape_targets(engine, prometheus)
        up = sorted(t["labels"].get("component", "") for t in seen if t["health"] == "up")
        return list(seen) if up == expected else []

    return wait_until(
        every_service_up,
        timeout_s,
        lambda: f"Prometheus to scrape every service (it had {seen})",
        max_interval_s=1.0,
    )


def jobs(timeout_s: float = 5) -> list[dict]:
    return requests.get(
        "http://127.0.0.1:8000/api/v1/jobs",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=timeout_s,
    ).json()["jobs"]


def wait_for_job(predicate, timeout_s: float, what: str) -> dict:
    """The first job of the compose coordinator that `predicate` accepts."""

    def first() -> dict | None:
        try:
            return next((job for job in jobs() if predicate(job)), None)
        except (requests.RequestException, KeyError, ValueError):
            return None  # restarting

    return wait_until(first, timeout_s, f"a job {what} on the compose cluster", max_interval_s=1.0)


def crash(engine: dict[str, str], container: str, timeout_s: float = 60) -> None:
    """The container's main process killed (-9) from the host, as a crash would:
    `docker kill` is an operator's stop, which no restart policy undoes. Returns once
    the engine has started it again."""
    pid = int(docker(engine, "inspect", "-f", "{{.State.Pid}}", container).stdout)
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        state = docker(engine, "inspect", "-f", "{{.RestartCount}} {{.State.Running}}", container)
        restarts, running = state.stdout.split()
        return int(restarts) >= 1 and running == "true"

    wait_until(restarted, timeout_s, f"{container} to be restarted after its process died")


def test_compose_up_trains_the_default_job_through_a_collector_crash_and_a_coordinator_restart(
    engine, images, prometheus_image, tmp_path
):
    compose(engine, "down", "-v", check=False)
    prometheus = f"{PROJECT}-prometheus"
    try:
        # No learner yet: the job cannot end before the crash and the restart.
        up = compose(engine, "up", "-d", "--no-build", "--scale", "learner=0", timeout_s=600)
        assert up.returncode == 0, up.stderr
        running = wait_for_job(lambda j: j["phase"] == "running" and j["env_steps"] > 0, 300, "ran")
        # A collector crashes: compose's restart policy starts it again.
        (collector, *_) = compose(engine, "ps", "-q", "collector").stdout.split()
        crash(engine, collector)
        # The coordinator restarted mid-job resumes it (durable state on the volume),
        # with at least the env steps it had acknowledged.
        acknowledged = wait_for_job(lambda j: j["job_id"] == running["job_id"], 30, "listed")
        (coordinator,) = compose(engine, "ps", "-q", "coordinator").stdout.split()
        docker(engine, "restart", coordinator, timeout_s=120)
        wait_for_job(
            lambda j: (
                j["job_id"] == running["job_id"]
                and j["phase"] == "running"
                and j["env_steps"] >= acknowledged["env_steps"]
            ),
            120,
            "resumed",
        )
        up = compose(engine, "up", "-d", "--no-build", "learner", timeout_s=600)
        assert up.returncode == 0, up.stderr
        # Every service scraped with the metrics secret, on the compose network.
        prometheus = start_prometheus(engine, prometheus_image, tmp_path)
        targets = wait_until_every_service_is_scraped(engine, prometheus, 2, timeout_s=120)
        assert all(t["lastError"] == "" for t in targets), targets
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
        docker(engine, "rm", "-f", prometheus, check=False)
        down = compose(engine, "down", check=False)
        assert project_containers(engine) == [], down.stderr
        compose(engine, "down", "-v", check=False)


def test_drover_run_with_the_docker_backend_trains_and_tears_down(engine, images):
    before = set(docker(engine, "network", "ls", "-q").stdout.split())
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover.cli", "run", str(ROOT / "examples" / "cartpole_dqn.yaml")]
        + ["--backend", "docker", "--timeout-s", "1200"],
        env=engine,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        # A collector crashes as soon as it runs: the backend's restart policy starts
        # it again, and the job still succeeds.
        def collector() -> list[str]:
            assert proc.poll() is None, "drover run ended before a collector ran"
            return running_containers(engine, "name=drover-.*-collector-0")

        crash(engine, wait_until(collector, 300, "a collector container")[0])
        out, _ = proc.communicate(timeout=1500)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert docker(engine, "ps", "-aq", "--filter", "name=drover-").stdout.split() == []
    assert set(docker(engine, "network", "ls", "-q").stdout.split()) <= before


#: The faults' job: the example's DQN without a goal, so it ends at its budget whatever
#: the faults cost; 1-step transitions (a segment's rows are its env steps) and a
#: checkpoint every 100 iterations (a new learner resumes from one).
FAULTS_JOB = {
    **yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()),
    "exp_name": "faults",
}
FAULTS_JOB["env"] = {**FAULTS_JOB["env"], "stop_value": None, "n_evaluator_episode": 2}
FAULTS_JOB["policy"] = {
    **FAULTS_JOB["policy"],
    "nstep": 1,
    "learn": {**FAULTS_JOB["policy"]["learn"], "checkpoint_every_iters": 100},
}
FAULTS_JOB["system"] = {**FAULTS_JOB["system"], "max_env_step": 40_000}
#: The coordinator's default lease; each partition or pause outlasts it.
LEASE_S = 10.0
NETWORK = f"{PROJECT}_default"


def api(method: str, path: str, timeout_s: float = 10, **kw) -> requests.Response:
    return requests.request(
        method,
        f"http://127.0.0.1:8000{path}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=timeout_s,
        **kw,
    )


def job_status(job_id: str) -> dict | None:
    try:
        return api("GET", f"/api/v1/jobs/{job_id}").json()
    except (requests.RequestException, ValueError):
        return None


def lease_expiries(role: str) -> float:
    text = api("GET", "/metrics").text
    prefix = f'drover_lease_expiries_total{{role="{role}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def address(engine: dict[str, str], container: str) -> str:
    template = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    return docker(engine, "inspect", "-f", template, container).stdout.strip()


def busy_workers(role: str) -> dict[str, dict]:
    """The `role` workers holding a task, by the host of their URL."""
    workers = api("GET", "/api/v1/workers").json()["workers"]
    return {
        w["url"].split("//")[1].split(":")[0]: w
        for w in workers
        if w["role"] == role and w["task_ids"]
    }


def progressed(job_id: str, past: dict, timeout_s: float, what: str) -> dict:
    """The job's status once its env steps and train iterations are past `past`'s."""

    def moved() -> dict | None:
        status = job_status(job_id)
        if status is not None and status["phase"] != "running":
            raise AssertionError(f"the job ended early: {status}")
        if status and status["env_steps"] > past["env_steps"]:
            return status if status["train_iters"] > past["train_iters"] else None
        return None

    return wait_until(moved, timeout_s, what, max_interval_s=1.0)


def in_volume(engine: dict[str, str], script: str) -> str:
    """`script` run by Python in a container holding the compose volume at /shared."""
    return docker(
        engine,
        *("run", "--rm", "-v", f"{PROJECT}_shared:/shared", "--entrypoint", "python"),
        *("drover:latest", "-c", script),
        timeout_s=120,
    ).stdout


#: Each policy file's (version, epoch), and latest.json's, of the only job.
POLICY_EPOCHS = """
import glob, json, os
from common.storage import SharedStore
store = SharedStore("/shared")
(job,) = [d for d in os.listdir("/shared") if os.path.isdir(f"/shared/{d}/policies")]
files = sorted(glob.glob(f"/shared/{job}/policies/*.safetensors"))
epochs = [
    [int(os.path.basename(f)[:8]), store.read_policy(f[len("/shared/") :]).epoch] for f in files
]
latest = json.load(open(f"/shared/{job}/policies/latest.json"))
print(json.dumps({"files": epochs, "latest": latest}))
"""


def test_partitions_and_pauses_on_the_real_engine_lose_nothing(engine, images):
    """A collector cut off from the coordinator's network past its lease, the learner
    frozen past its lease while a second one takes over (then thawed), and the
    coordinator frozen for 30 s: the job succeeds, every acknowledged insert counted,
    and the thawed learner's writes are fenced off (docs/architecture.md)."""
    compose(engine, "down", "-v", check=False)
    try:
        up = compose(
            engine,
            *("up", "-d", "--no-build", "--scale", "learner=2", "--scale", "submit=0"),
            timeout_s=600,
        )
        assert up.returncode == 0, up.stderr
        wait_until(
            lambda: len(api("GET", "/api/v1/workers").json()["workers"]) == 4,
            120,
            "2 collectors and 2 learners to register",
            max_interval_s=1.0,
        )
        submitted = api("POST", "/api/v1/jobs", json={"config": FAULTS_JOB, "name": "faults"})
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["job_id"]
        status = progressed(
            job_id, {"env_steps": 0, "train_iters": 100}, 240, "the job to train 100 iterations"
        )

        # 1. A collector cut off from the network past its lease, then back.
        collectors = compose(engine, "ps", "-q", "collector").stdout.split()
        cut = collectors[0]
        docker(engine, "network", "disconnect", NETWORK, cut)
        expired = lease_expiries("collector")
        wait_until(
            lambda: lease_expiries("collector") > expired,
            3 * LEASE_S,
            "the cut-off collector's lease to expire",
        )
        docker(engine, "network", "connect", NETWORK, cut)
        wait_until(
            lambda: address(engine, cut) in busy_workers("collector"),
            60,
            "the reconnected collector to register again and take a task",
            max_interval_s=1.0,
        )
        logs = docker(engine, "logs", cut).stderr
        assert "coordinator forgot worker" in logs, logs[-3000:]
        status = progressed(job_id, status, 120, "the job to go on after the partition")

        # 2. The learner frozen past its lease; the other takes the job over; thawed.
        learners = compose(engine, "ps", "-q", "learner").stdout.split()
        (busy,) = busy_workers("learner")
        (frozen,) = [c for c in learners if address(engine, c) == busy]
        (other,) = [c for c in learners if c != frozen]
        docker(engine, "pause", frozen)
        try:
            wait_until(
                lambda: address(engine, other) in busy_workers("learner"),
                4 * LEASE_S,
                "the other learner to take the learn task over",
                max_interval_s=1.0,
            )
            status = progressed(job_id, status, 120, "the new learner to train")
        finally:
            docker(engine, "unpause", frozen)
        # It went on from the frozen one's newest checkpoint.
        assert "resumed from learner-e" in docker(engine, "logs", other).stderr
        wait_until(
            lambda: "coordinator forgot worker" in docker(engine, "logs", frozen).stderr,
            60,
            "the thawed learner to hear its task is over",
        )
        status = progressed(job_id, status, 120, "the job to go on after the thaw")

        # 3. The coordinator frozen for 30 s under load: nobody's lease is lost for it.
        (coordinator,) = compose(engine, "ps", "-q", "coordinator").stdout.split()
        before = {role: lease_expiries(role) for role in ("collector", "learner")}
        docker(engine, "pause", coordinator)
        try:
            time.sleep(30)
        finally:
            docker(engine, "unpause", coordinator)
        status = progressed(job_id, status, 120, "the job to go on after the coordinator's pause")
        assert {role: lease_expiries(role) for role in before} == before
        assert "was stalled" in docker(engine, "logs", coordinator).stderr

        final = wait_until(
            lambda: (s := job_status(job_id)) and s["phase"] != "running" and s,
            900,
            "the job to end at its budget",
            max_interval_s=2.0,
        )
        assert final["phase"] == "succeeded", final
        buffer = api("GET", f"/api/v1/jobs/{job_id}/buffer").json()
        assert buffer["inserts"] == final["env_steps"], (buffer, final)
        # Fencing: the pointer names a version of the newest lease; the thawed learner
        # (epoch 1) wrote nothing the coordinator took after the takeover.
        layout = json.loads(in_volume(engine, POLICY_EPOCHS))
        newest = max(epoch for _, epoch in layout["files"])
        assert newest >= 2 and layout["latest"]["epoch"] == newest, layout
        print(f"\nfaults job: {final}, policy files {layout['files'][-6:]}")
    finally:
        down = compose(engine, "down", check=False)
        assert project_containers(engine) == [], down.stderr
        compose(engine, "down", "-v", check=False)


def test_a_sweep_on_the_compose_cluster_runs_every_job(engine, images):
    """An experiment submitted to the compose coordinator (`POST /api/v1/experiments`,
    what `drover sweep --url` sends): its jobs run one at a time on the compose workers
    and every one ends."""
    compose(engine, "down", "-v", check=False)
    try:
        up = compose(engine, "up", "-d", "--no-build", "--scale", "submit=0", timeout_s=600)
        assert up.returncode == 0, up.stderr
        sweep = {
            **yaml.safe_load((ROOT / "examples" / "cartpole_dqn.yaml").read_text()),
            "exp_name": "sweep",
            "env": {"env_id": "CartPole-v1", "stop_value": None, "n_evaluator_episode": 2},
            "system": {"max_env_step": 3000},
            "sweep": {"seeds": 2, "parallel": 1, "axes": {"policy.learn.learning_rate": [0.001]}},
        }
        submitted = api("POST", "/api/v1/experiments", json={"config": sweep})
        assert submitted.status_code == 201, submitted.text
        experiment_id = submitted.json()["experiment_id"]
        shown = wait_until(
            lambda: (
                (e := api("GET", f"/api/v1/experiments/{experiment_id}").json())["phase"]
                != "running"
                and e
            ),
            600,
            "the experiment's jobs to end",
            max_interval_s=2.0,
        )
        assert shown["phase"] == "ended", shown
        assert [m["phase"] for m in shown["members"]] == ["succeeded", "succeeded"], shown
    finally:
        compose(engine, "down", "-v", check=False)
        assert project_containers(engine) == []
