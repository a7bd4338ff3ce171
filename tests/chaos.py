"""Seeded random faults against a real local cluster: the randomized durability check
that `tests/integration/test_chaos.py` runs for one seed and `bench/chaos.py` for many.

One round: start a coordinator, 3 collectors and a learner; submit a DQN job and kill
the coordinator at once; then, until the job ends, inject a fault every 0.5-1.5 s into
each role in turn, the job's buffer process among them (kill -9, SIGTERM, SIGSTOP past
the lease, or the coordinator and the learner killed together; the buffer process is
killed with SIGKILL or SIGTERM and its coordinator restarts it), restarting whatever
died; kill the coordinator again right
after the job ends. Throughout, the acknowledged counters read from the REST API must
never go down; at the end the job must have succeeded exactly once, its summary must
be unchanged by the last restart, and no service may have answered a 500.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.config import deep_merge
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from drover.local import LocalCluster, Service
from jobconfig import load_config_file
from tests.helpers import buffer_processes

ROOT = Path(__file__).resolve().parents[1]
# A goal above the example's 195, so the job outlasts a round of faults in every role.
CONFIG = deep_merge(
    load_config_file(ROOT / "examples" / "cartpole_dqn.yaml"),
    {"env": {"stop_value": 300}, "policy": {"learn": {"checkpoint_every_iters": 100}}},
)
LEASE_S = 3.0
ENV = {
    "DROVER_HEARTBEAT_INTERVAL_S": "0.5",
    "DROVER_LEASE_TIMEOUT_S": str(LEASE_S),
    "DROVER_SCHEDULER_PERIOD_S": "0.2",
    "DROVER_SNAPSHOT_PERIOD_S": "1",
    "DROVER_ORPHAN_GRACE_S": "2",
}


@dataclass
class ChaosResult:
    seed: int
    faults: list[str] = field(default_factory=list)
    restarts: int = 0
    phase: str = ""
    #: "job ... succeeded" lines in the coordinator's log, across its restarts.
    successes: int = 0
    #: Largest drop seen in acknowledged inserts / env steps (0: never went down).
    inserts_lost: int = 0
    env_steps_lost: int = 0
    server_errors: int = 0
    summary_unchanged: bool = False
    wall_s: float = 0.0


class _Watch:
    """The highest acknowledged counters seen, and the largest drop below them."""

    def __init__(self, cluster: LocalCluster, job_id: str, result: ChaosResult) -> None:
        self.cluster, self.job_id, self.result = cluster, job_id, result
        self.inserts = self.env_steps = 0
        self.phase = "running"

    def read(self) -> None:
        try:
            status = self.cluster.client.job(self.job_id)
            inserts = int(self.cluster.client.buffer_stats(self.job_id)["inserts"])
        except (ApiError, ServiceUnavailable):
            return  # the coordinator is down or restarting: nothing acknowledged now
        self.phase = status.phase
        if status.phase != "running":
            return  # a finished job's buffer is released
        self.result.inserts_lost = max(self.result.inserts_lost, self.inserts - inserts)
        self.result.env_steps_lost = max(
            self.result.env_steps_lost, self.env_steps - status.env_steps
        )
        self.inserts = max(self.inserts, inserts)
        self.env_steps = max(self.env_steps, status.env_steps)


def _kill(service: Service, signum: int) -> None:
    if service.alive():
        assert service.process is not None
        os.kill(service.process.pid, signum)


def _restart_dead(cluster: LocalCluster) -> None:
    cluster.supervise(max_restarts=1000)
    if cluster.coordinator.alive():
        cluster.wait_ready(30)


#: Stands for the job's buffer process among the roles hit in turn.
BUFFER = "buffer"


def _buffer_fault(cluster: LocalCluster, rng: random.Random, result: ChaosResult) -> None:
    """The job's buffer process killed (its coordinator starts it again)."""
    coordinator = cluster.coordinator.process
    pids = list(buffer_processes(coordinator.pid).values()) if coordinator else []
    if not pids:
        result.faults.append("no buffer process to kill (restarting)")
        return
    signum = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    result.faults.append(f"{'kill -9' if signum == signal.SIGKILL else 'SIGTERM'} buffer")


def _fault(
    cluster: LocalCluster, victim: Service | str, rng: random.Random, result: ChaosResult
) -> None:
    if victim == BUFFER:
        _buffer_fault(cluster, rng, result)
        return
    assert isinstance(victim, Service)
    kind = rng.choice(["kill", "kill", "term", "stop", "coordinator+learner"])
    if kind == "coordinator+learner":
        for service in (cluster.coordinator, *cluster.learners):
            _kill(service, signal.SIGKILL)
            service.wait(5)
        result.faults.append("kill -9 coordinator and learner")
        return
    if kind == "kill":
        _kill(victim, signal.SIGKILL)
        victim.wait(5)
        result.faults.append(f"kill -9 {victim.name}")
    elif kind == "term":
        _kill(victim, signal.SIGTERM)
        victim.wait(15)
        result.faults.append(f"SIGTERM {victim.name}")
    else:
        _kill(victim, signal.SIGSTOP)
        # Resumed past its lease, while the round goes on.
        threading.Timer(LEASE_S + 1.0, _kill, (victim, signal.SIGCONT)).start()
        result.faults.append(f"SIGSTOP {victim.name} {LEASE_S + 1.0:.0f}s")


def chaos_round(run_dir: Path, seed: int, *, max_faults: int = 8, deadline_s: float = 300.0):
    """One seeded round (see the module's docstring); returns what it measured."""
    rng = random.Random(seed)
    result = ChaosResult(seed=seed)
    started = time.monotonic()
    config = deep_merge(CONFIG, {"system": {"seed": seed}})
    with LocalCluster(run_dir, num_collectors=3, extra_env=ENV) as cluster:
        cluster.wait_for_workers()
        job_id = cluster.client.submit_job(config).job_id
        _kill(cluster.coordinator, signal.SIGKILL)  # right after the 201
        cluster.coordinator.wait(5)
        result.faults.append("kill -9 coordinator right after submit")
        _restart_dead(cluster)
        watch = _Watch(cluster, job_id, result)
        # Every role in turn, in a seeded order, so a short job still sees each one hit.
        roles: list[Service | str] = [
            cluster.coordinator,
            *cluster.collectors,
            *cluster.learners,
            BUFFER,
        ]
        rng.shuffle(roles)
        next_fault_s = time.monotonic() + rng.uniform(0.5, 1.5)
        while watch.phase == "running":
            if time.monotonic() - started > deadline_s:
                raise TimeoutError(f"seed {seed}: the job did not end in {deadline_s}s")
            injected = len(result.faults) - 1
            if injected < max_faults and time.monotonic() >= next_fault_s:
                _fault(cluster, roles[injected % len(roles)], rng, result)
                next_fault_s = time.monotonic() + rng.uniform(0.5, 1.5)
            _restart_dead(cluster)
            watch.read()
            time.sleep(0.05)
        summary = cluster.shared_dir / job_id / "summary.json"
        written = summary.read_bytes() if summary.exists() else b""
        _kill(cluster.coordinator, signal.SIGKILL)  # right after the end
        cluster.coordinator.wait(5)
        result.faults.append("kill -9 coordinator right after the end")
        _restart_dead(cluster)
        time.sleep(2.0)
        result.phase = cluster.client.job(job_id).phase
        result.summary_unchanged = bool(written) and summary.read_bytes() == written
        result.restarts = sum(s.restarts for s in cluster.services)
        logs = {s.name: s.log_path.read_text(errors="replace") for s in cluster.services}
    result.successes = len(re.findall(rf"job {job_id} succeeded", logs["coordinator"]))
    result.server_errors = sum(text.count("unhandled error") for text in logs.values())
    result.wall_s = time.monotonic() - started
    return result
