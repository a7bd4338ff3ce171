"""Seeded random faults against a real local cluster: the randomized durability check
that `tests/integration/test_chaos.py` runs for one seed and `bench/chaos.py` for many.

One round: start a coordinator, 3 collectors and a learner; submit a DQN job and kill
the coordinator at once; then, until the job ends, inject a fault every 0.5-1.5 s into
each role in turn, the job's buffer process among them (kill -9, SIGTERM, SIGSTOP past
the lease, or the coordinator and the learner killed together; the buffer process is
killed with SIGKILL or SIGTERM and its coordinator restarts it), restarting whatever
died; kill the coordinator again right after the job ends. With a `FaultVolume` as the
shared root (a tmpfs served through the slow volume: root and FUSE), the volume is a
role too: full for 3-8 s, or slow (50-200 ms a call) for 5 s; a round may end on it,
full for good past the job's grace (`stays_full`: the job must fail naming it). Throughout, the
acknowledged counters read from the REST API must never go down, and the policy
pointer must never take a version of an older learn lease than the one before (a
stale write accepted); at the end the job must have succeeded exactly once, its
summary must be unchanged by the last restart, and no service may have answered a 500.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common.config import deep_merge
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from drover.local import LocalCluster, Service
from jobconfig import load_config_file
from tests.helpers import buffer_processes, fill, tmpfs
from tests.slow_volume import set_latency, slow_volume

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
    # The round's bad collector is a test double (tests/black_hole.py).
    "PYTHONPATH": str(ROOT),
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
    #: Policy versions the pointer took from an older learn lease than its previous
    #: version's (a write of a learner whose lease was taken over).
    stale_accepted: int = 0
    summary_unchanged: bool = False
    wall_s: float = 0.0
    #: The job's reason at its end (a round whose volume stays full: it names the volume).
    reason: str = ""
    #: How long that job ran on after its volume filled for good (its grace, and a margin).
    full_to_end_s: float | None = None

    @property
    def as_expected(self) -> bool:
        """The round's verdict: ended once as it should (succeeded; failed naming the
        volume if it stayed full past the grace), nothing acknowledged lost, no 500, no
        stale write taken, its summary kept."""
        if self.stays_full:
            ended = self.phase == "failed" and "shared volume" in self.reason
        else:
            ended = self.phase == "succeeded"
        return (
            ended
            and self.successes == 1
            and self.inserts_lost == self.env_steps_lost == 0
            and self.server_errors == self.stale_accepted == 0
            and self.summary_unchanged
        )

    @property
    def stays_full(self) -> bool:
        return any(fault.startswith(STAYS_FULL) for fault in self.faults)


@dataclass
class FaultVolume:
    """A shared root that faults fill and slow: `root` serves `backing`, a tmpfs."""

    root: Path
    backing: Path

    def full_for(self, seconds: float) -> None:
        """No room on the volume from now, for `seconds`."""
        filler = self.backing / "filler"
        fill(filler)
        threading.Timer(seconds, filler.unlink, kwargs={"missing_ok": True}).start()

    def slow_for(self, seconds: float, latency_s: float) -> None:
        """Every fsync and read waits `latency_s` from now, for `seconds`."""
        set_latency(self.root, latency_s)
        threading.Timer(seconds, self._fast_again).start()

    def _fast_again(self) -> None:
        """No added latency any more, if the volume is still mounted (a round that
        ended sooner unmounted it)."""
        with contextlib.suppress(KeyError, OSError):
            set_latency(self.root, 0.0)


@contextlib.contextmanager
def fault_volume(folder: Path, size: str = "256m") -> Iterator[FaultVolume]:
    """A `FaultVolume` of `size` under `folder` for the block (skipped where a tmpfs or
    FUSE cannot be mounted: they need root)."""
    with (
        tmpfs(folder / "backing", size) as backing,
        slow_volume(folder / "root", backing, 0.0) as root,
    ):
        yield FaultVolume(root=root, backing=backing)


class _Watch:
    """The highest acknowledged counters seen, and the largest drop below them."""

    def __init__(self, cluster: LocalCluster, job_id: str, result: ChaosResult) -> None:
        self.cluster, self.job_id, self.result = cluster, job_id, result
        self.inserts = self.env_steps = 0
        self.phase = "running"
        #: The newest (version, epoch) the policy pointer named.
        self.pointer = (0, 0)

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
        try:
            ref = self.cluster.client.latest_policy(self.job_id)
        except (ApiError, ServiceUnavailable):
            return
        if ref is not None and ref.version > self.pointer[0]:
            if ref.epoch < self.pointer[1]:
                self.result.stale_accepted += 1
            self.pointer = (ref.version, ref.epoch)


def _kill(service: Service, signum: int) -> None:
    if service.alive():
        assert service.process is not None
        os.kill(service.process.pid, signum)


def _restart_dead(cluster: LocalCluster) -> None:
    cluster.supervise(max_restarts=1000)
    if cluster.coordinator.alive():
        cluster.wait_ready(30)


#: Stand for the job's buffer process and the shared volume among the roles hit in turn.
BUFFER = "buffer"
VOLUME = "volume"
#: The last fault of a round that ends on a full volume: full past the job's grace.
STAYS_FULL = "volume full past the grace"
#: That round's job fails this long after its volume fills without progress (longer
#: than the random fills before it, 3-8 s, so those only pause it).
STAYS_FULL_GRACE_S = 10


def _volume_fault(volume: FaultVolume, rng: random.Random, result: ChaosResult) -> None:
    if rng.random() < 0.5:
        seconds = rng.uniform(3.0, 8.0)
        volume.full_for(seconds)
        result.faults.append(f"volume full {seconds:.0f}s")
    else:
        latency_s = rng.choice([0.05, 0.1, 0.2])
        volume.slow_for(5.0, latency_s)
        result.faults.append(f"volume slow ({latency_s * 1000:.0f} ms a call) 5s")


def _buffer_fault(cluster: LocalCluster, rng: random.Random, result: ChaosResult) -> None:
    """The job's buffer process killed (its coordinator starts it again), or frozen for
    a few seconds (its job's status says so; nothing else waits on it)."""
    coordinator = cluster.coordinator.process
    pids = list(buffer_processes(coordinator.pid).values()) if coordinator else []
    if not pids:
        result.faults.append("no buffer process to hit (restarting)")
        return
    signum = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    if signum == signal.SIGSTOP:
        frozen_s = rng.uniform(2.0, 6.0)
        for pid in pids:
            threading.Timer(frozen_s, _resume, (pid,)).start()
        result.faults.append(f"SIGSTOP buffer {frozen_s:.0f}s")
        return
    result.faults.append(f"{'kill -9' if signum == signal.SIGKILL else 'SIGTERM'} buffer")


def _resume(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _fault(
    cluster: LocalCluster,
    victim: Service | str,
    rng: random.Random,
    result: ChaosResult,
    volume: FaultVolume | None = None,
) -> None:
    if victim == BUFFER:
        _buffer_fault(cluster, rng, result)
        return
    if victim == VOLUME:
        assert volume is not None
        _volume_fault(volume, rng, result)
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


def chaos_round(
    run_dir: Path,
    seed: int,
    *,
    max_faults: int = 8,
    deadline_s: float = 300.0,
    volume: FaultVolume | None = None,
    stays_full: bool = False,
):
    """One seeded round (see the module's docstring); returns what it measured. With
    `volume`, the job's shared root is on it (the logs stay in `run_dir`); with
    `stays_full`, the last fault fills it for good: the job must fail naming it within
    its grace (and a margin), and its end be recorded when room comes back."""
    rng = random.Random(seed)
    result = ChaosResult(seed=seed)
    started = time.monotonic()
    config = deep_merge(CONFIG, {"system": {"seed": seed}})
    if stays_full:
        assert volume is not None, "a volume that stays full needs a FaultVolume"
        # No goal: only the volume ends it.
        config = deep_merge(
            config,
            {
                "env": {"stop_value": None},
                "system": {"storage_grace_s": STAYS_FULL_GRACE_S, "max_env_step": 10**8},
            },
        )
    filled_at: float | None = None
    shared = run_dir if volume is None else volume.root / run_dir.name
    with LocalCluster(shared, num_collectors=3, extra_env=ENV, logs_at=run_dir / "logs") as cluster:
        cluster.wait_for_workers()
        collectors = list(cluster.collectors)  # the fault victims: not the double below
        # Beside them all round, a collector that takes tasks and runs none.
        cluster.add_collector("tests.black_hole")
        result.faults.append("a collector that takes tasks and runs none")
        job_id = cluster.client.submit_job(config).job_id
        _kill(cluster.coordinator, signal.SIGKILL)  # right after the 201
        cluster.coordinator.wait(5)
        result.faults.append("kill -9 coordinator right after submit")
        _restart_dead(cluster)
        watch = _Watch(cluster, job_id, result)
        # Every role in turn, in a seeded order, so a short job still sees each one hit.
        roles: list[Service | str] = [
            cluster.coordinator,
            *collectors,
            *cluster.learners,
            BUFFER,
            *([VOLUME] if volume is not None else []),
        ]
        rng.shuffle(roles)
        next_fault_s = time.monotonic() + rng.uniform(0.5, 1.5)
        while watch.phase == "running":
            if time.monotonic() - started > deadline_s:
                raise TimeoutError(f"seed {seed}: the job did not end in {deadline_s}s")
            injected = len(result.faults) - 2  # past the bad collector and the first kill
            if injected < max_faults and time.monotonic() >= next_fault_s:
                _fault(cluster, roles[injected % len(roles)], rng, result, volume)
                next_fault_s = time.monotonic() + rng.uniform(0.5, 1.5)
            elif stays_full and filled_at is None and injected >= max_faults:
                assert volume is not None
                time.sleep(8.0)  # the random fills before it are over
                fill(volume.backing / "filler-for-good")
                filled_at = time.monotonic()
                result.faults.append(f"{STAYS_FULL} ({STAYS_FULL_GRACE_S}s)")
            elif filled_at is not None and time.monotonic() - filled_at > 3 * STAYS_FULL_GRACE_S:
                raise TimeoutError(
                    f"seed {seed}: the job ran on {3 * STAYS_FULL_GRACE_S}s into a full volume"
                )
            _restart_dead(cluster)
            watch.read()
            time.sleep(0.05)
        if filled_at is not None:
            assert volume is not None
            result.full_to_end_s = time.monotonic() - filled_at
            result.reason = cluster.client.job(job_id).reason
            (volume.backing / "filler-for-good").unlink()  # room again: the end is kept
            time.sleep(3.0)
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
    ended = "failed" if stays_full else "succeeded"
    result.successes = len(re.findall(rf"job {job_id} {ended}", logs["coordinator"]))
    result.server_errors = sum(text.count("unhandled error") for text in logs.values())
    result.wall_s = time.monotonic() - started
    return result
