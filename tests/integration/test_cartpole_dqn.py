"""Real processes on 127.0.0.1 with a temporary shared dir: DQN learns CartPole."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import ApiError
from drover.local import LocalCluster
from jobconfig import load_config_file
from services.slave.client import SlaveClient
from tests.helpers import (
    DEADLINE_S,
    EXAMPLE,
    ROOT,
    descendants,
    running,
    wait_for_end,
    wait_until,
    with_command,
)

pytestmark = pytest.mark.processes

#: A learner's feeder process's command line holds this.
FEEDER = "services.learner.feeder"


def drover(*args, timeout_s=DEADLINE_S):
    return subprocess.run(
        [sys.executable, "-m", "drover.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "120"},
    )


@pytest.mark.learning
def test_dqn_cartpole_reaches_195_through_the_services(tmp_path):
    config = load_config_file(EXAMPLE)
    with LocalCluster(tmp_path / "run", num_collectors=2) as cluster:
        created = cluster.client.submit_job(config, name="it")
        status = wait_for_end(cluster, created.job_id, DEADLINE_S)
        assert status.phase == "succeeded", status
        assert status.last_eval is not None and status.last_eval.return_mean >= 195
        assert status.last_eval.episodes == 10
        assert status.best_eval_return >= 195
        # both collectors and the learner took part
        workers = cluster.client.workers()
        assert sorted(w.role for w in workers) == ["collector", "collector", "learner"]
        metrics = cluster.client.metrics(created.job_id)
        assert metrics["buffer"]["inserts"] > 0 and metrics["evals"]
        # the best policy is kept and served
        best = cluster.client.policy_bytes(created.job_id, status.best_policy_version)
        assert len(best) > 1000
        for collector in cluster.collectors:
            # Collectors never hold the cluster token: their routes take only the secret
            # each gave the coordinator. Health is public.
            client = SlaveClient(collector.url, cluster.token)
            with pytest.raises(ApiError) as refused:
                client.status()
            assert refused.value.status == 401
            assert client.call("GET", "/healthz") == {"ok": True, "reason": "ok"}
        job_dir = cluster.run_dir / created.job_id
        assert (job_dir / "summary.json").is_file()
        assert metrics["buffer"]["released_segments"] > 0
    # SIGTERM stops every process cleanly and promptly
    for service in cluster.services:
        assert service.process.returncode == 0, (service.name, service.log_tail())
    # the learner checkpointed on its way out
    assert list((job_dir / "checkpoints").glob("learner-*.safetensors"))
    # step data goes with the job: no segment (or temp) file is left, late writes included
    assert not [p for p in (job_dir / "segments").rglob("*") if p.is_file()]


@pytest.mark.learning
def test_drover_run_cli_end_to_end(tmp_path):
    started = time.monotonic()
    proc = drover("run", EXAMPLE, "--runs-dir", tmp_path)
    wall_s = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "succeeded" in proc.stderr
    # One line with the dashboard's address, signed in (the token in its fragment).
    (dashboard,) = [line for line in proc.stderr.splitlines() if "drover: dashboard " in line]
    assert re.fullmatch(r"drover: dashboard http://127\.0\.0\.1:\d+/#token=[\w-]{43}", dashboard)
    run_dirs = list(tmp_path.glob("cartpole_dqn-*"))
    assert len(run_dirs) == 1
    assert sorted(p.name for p in (run_dirs[0] / "logs").iterdir()) == [
        "collector-0.log",
        "collector-1.log",
        "coordinator.log",
        "forkserver.log",
        "learner-0.log",
    ]
    assert wall_s < DEADLINE_S


def holding_files_under(root: Path) -> list[int]:
    """Processes (this one aside) with a file under `root` open."""
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        if pid == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:  # exited while we looked, or not ours to read
            continue
        if any(target.startswith(f"{root}/") for target in targets):
            found.append(pid)
    return found


@pytest.mark.parametrize(
    ("signum", "when"),
    [
        (signal.SIGTERM, "submitted"),  # the job is running
        (signal.SIGTERM, "run folder"),  # the services are starting
        (signal.SIGHUP, "submitted"),
    ],
)
def test_drover_run_stops_the_job_and_every_process_it_started_on_sigterm(tmp_path, signum, when):
    """`timeout`, a CI runner's cancel or a closed terminal: the launcher stops the job
    and every service (forked ones and the learner's feeder included) before it exits,
    as for Ctrl-C, instead of leaving them running."""
    config = tmp_path / "endless.yaml"
    config.write_text(EXAMPLE.read_text().replace("stop_value: 195 ", "stop_value: 100000 "))
    assert "stop_value: 100000" in config.read_text()
    log = tmp_path / "drover.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "drover", "run", str(config), "--runs-dir", str(tmp_path)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "120"},
        )
    try:
        wait_until(lambda: when in log.read_text(), timeout_s=120)
        if when == "submitted":  # every service up, and the learner's feeder too
            wait_until(
                lambda: with_command(descendants(proc.pid), FEEDER), timeout_s=120, what="a feeder"
            )
        started = descendants(proc.pid)
        assert started
        proc.send_signal(signum)
        assert proc.wait(timeout=60) != 0
        left = [pid for pid in started | descendants(proc.pid) if running(pid)]
        assert not left, (left, log.read_text()[-3000:])
        # and none it started after the signal (a service forked while it came): every
        # service writes its log under tmp_path
        wait_until(
            lambda: not holding_files_under(tmp_path),
            timeout_s=15,
            what=lambda: (
                f"processes holding files under {tmp_path}: {holding_files_under(tmp_path)}"
            ),
        )
        text = log.read_text()
        assert f"drover: {signal.Signals(signum).name}; stopping the job and every service" in text
        if when == "submitted":
            assert "stopped by request" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("policy:\n  learn:\n    batch_size: -3\n", "policy.learn.batch_size"),
        ("env: [1, 2]\n", "env"),
        ("strict: true\nenv:\n  stop_vaule: 3\n", "did you mean 'stop_value'"),
    ],
)
def test_drover_run_refuses_bad_configs_before_starting_anything(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    proc = drover("run", path, "--runs-dir", tmp_path / "r", timeout_s=60)
    assert proc.returncode == 2
    assert "drover: error:" in proc.stderr and message in proc.stderr
    assert not (tmp_path / "r").exists()


def test_drover_run_stops_before_starting_anything_for_a_job_that_would_be_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env:\n  env_id: NoSuchEnv-v0\n")
    proc = drover("run", path, "--runs-dir", tmp_path / "r", timeout_s=120)
    assert proc.returncode != 0
    assert "env.env_id: no registered env 'NoSuchEnv-v0'" in proc.stderr
    assert not (tmp_path / "r").exists()  # no run folder: no process was started
