"""A soak: one coordinator kept busy for minutes while jobs come and go and it is
killed and restarted, watched for memory, errors and lost data.

    python bench/soak.py [--minutes 10] [--collectors 8] [--learners 2] [--kills 2]
        [--buffer-items 1000000] [--insert-rate 5] [--churn-s 3] [--gang]

A coordinator (`python -m services.coordinator`, a temporary shared root) gets one DQN
CartPole job per learner, each with a prioritized buffer of `--buffer-items` items and
its share of the collectors. Simulated workers, one thread each, act as the slaves
do: they register with the registration secret and their own slave secret, take the
task the coordinator sends them (a small HTTP server answers `POST /v1/tasks` and
`DELETE /v1/tasks/<id>` for all of them), heartbeat, and when the coordinator forgets
them (a restart) register again and take whatever task comes next.

- a collector writes 64-row segments of its job's schema into its own folder
  (`SharedStore.write_segment`, the `SegmentRef` in the header) and inserts each one:
  as fast as it can until its job's buffer has been filled, then `--insert-rate` a
  second, so what is watched is a full buffer's steady state (evictions included); a
  segment counts as acknowledged when an insert of it is answered 200 (accepted, or a
  duplicate of one indexed before);
- a learner samples 8 batches of 64 in a closed loop, acknowledging its holds, and
  sends a priority for every key.

Every `--churn-s` seconds a small job is submitted and the one before it stopped, so
jobs end all along and the coordinator's ended-job retention (`DROVER_MAX_ENDED_JOBS`)
forgets them. With `--gang`, the main DQN jobs share the collectors by weight, and a
sync PPO job whose rounds need 2 collectors at once runs beside them on a learner of
its own: it holds its 2 in turns with the others (services/coordinator/sharing.py),
and every main job must have progressed in every minute (none starves, nothing
deadlocks). A simulated worker told to release its task ends it after its current
insert or sample and reports it complete, as a real one does.

`--kills` times, evenly spread, the coordinator is killed with SIGKILL and started
again on the same root; before each kill the segments acknowledged so far are
counted, and after the restart each main job's env steps must reach them (what was
acknowledged is durable: the index's snapshot, then the files found on disk).
`--buffer-kills` times, evenly spread between those, one main job's buffer process
(each job's replay is served by one, beside the coordinator) is killed with SIGKILL;
the coordinator starts it again, and that job's env steps must reach what was
acknowledged the same way.

The resident set (VmRSS) of the coordinator and the main jobs' buffer processes
together is read every 5 s (a kill of either starts a new life). Printed: a line a minute,
then the checks: RSS after warm-up (`--warmup-s` into each of the coordinator's
lives, and past the buffers' filling) within `--rss-growth-mb` in each life, no error
(a 5xx, an unexpected 4xx; the documented back-pressure answers and a coordinator
that is down or forgot its workers during a restart are counted apart), nothing
acknowledged lost. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import random
import secrets
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import (  # noqa: E402
    BATCH_SIZE,
    NUM_BATCHES,
    SEGMENT_ROWS,
    segment_ref,
    split,
    task_columns,
)
from common.errors import ApiError  # noqa: E402
from common.http_client import ServiceUnavailable  # noqa: E402
from common.messages import TaskAssignment, TaskProgress, dump, parse  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from services.buffer.client import BufferData, DataClient, data_client  # noqa: E402
from services.coordinator.client import CoordinatorClient  # noqa: E402
from tests.helpers import buffer_processes  # noqa: E402

#: A rate-limited insert's and a sample long-poll's own waits (what real workers send).
INSERT_TIMEOUT_S, SAMPLE_TIMEOUT_S = 2.0, 5.0
#: The name of the small jobs that come and go.
CHURNED = "churned"
#: The coordinator is given this long to come back after a kill.
RESTART_TIMEOUT_S = 60.0
#: After a restart, the acknowledged env steps must be back within this long (the
#: index's snapshot is restored, the files written since are found and indexed).
RECOVERY_TIMEOUT_S = 60.0
RSS_PERIOD_S = 5.0


class Forgotten(Exception):
    """The coordinator does not know this worker any more (it restarted)."""


class TaskOver(Exception):
    """The task ended: its job stopped, or it was cancelled or handed to another."""


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Env steps of the segments acknowledged, by job.
    acknowledged: collections.Counter = field(default_factory=collections.Counter)
    inserts: int = 0
    samples: int = 0
    priority_updates: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    #: Documented back-pressure: 429 on inserts, 503 sample_timeout / too_many_waiting.
    back_pressure: collections.Counter = field(default_factory=collections.Counter)
    #: Requests that found the coordinator down or restarting, and workers it forgot.
    outage: int = 0
    forgotten: int = 0
    tasks_taken: collections.Counter = field(default_factory=collections.Counter)
    #: Tasks released for another job (and reported complete), by role.
    released: collections.Counter = field(default_factory=collections.Counter)

    def add(self, name: str, amount: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)

    def count(self, counter: str, key: str, amount: int = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += amount


class SimWorker:
    """A registered slave: its secret, its credential, its task, its heartbeats."""

    role = ""

    def __init__(self, soak: Soak) -> None:
        self.soak, self.tally = soak, soak.tally
        self.slave_token = secrets.token_urlsafe(32)
        self.client = CoordinatorClient(
            soak.url, "", registration_token=soak.registration_token, timeout_s=10.0
        )
        self.worker_id: str | None = None
        self.heartbeat_interval_s = 1.0
        self._lock = threading.Lock()
        self._task: TaskAssignment | None = None
        self._assigned = threading.Event()
        self._over: set[str] = set()
        #: Tasks released for another job: they end, then report complete.
        self._released: set[str] = set()
        self.forgotten = False

    # --- the slave's side of the coordinator's calls --------------------------------

    def assign(self, task: TaskAssignment) -> int:
        with self._lock:
            if self._task is not None and self._task.task_id != task.task_id:
                return 409
            self._task = task
        self._assigned.set()
        return 202

    def cancel(self, task_id: str) -> int:
        with self._lock:
            if self._task is None or self._task.task_id != task_id:
                return 404
            self._over.add(task_id)
        return 202

    def release(self, task_id: str) -> int:
        """End the task after what it is doing (an insert, a sample), then report it
        complete, as a real slave does at its next safe point."""
        with self._lock:
            if self._task is None or self._task.task_id != task_id:
                return 404
            self._released.add(task_id)
            self._over.add(task_id)
        return 202

    def check(self, task: TaskAssignment) -> None:
        """Raise when the task the worker runs has ended or the worker was forgotten."""
        if self.forgotten:
            raise Forgotten
        if task.task_id in self._over or self.soak.stop.is_set():
            raise TaskOver

    # --- its threads ----------------------------------------------------------------

    def main(self) -> None:
        while not self.soak.stop.is_set():
            if self.worker_id is None or self.forgotten:
                self._register()
                continue
            if not self._assigned.wait(0.5):
                continue
            task = self._task
            assert task is not None
            self.tally.count("tasks_taken", self.role)
            try:
                self.run(task)
            except Forgotten:
                self.tally.add("forgotten")
            except TaskOver:
                if task.task_id in self._released:
                    self._report_released(task)
            except Exception as exc:  # noqa: BLE001 - counted, and the worker goes on
                self.tally.count("errors", f"{self.role}: {type(exc).__name__}: {exc}"[:160])
                time.sleep(0.5)
            with self._lock:
                self._task = None
                self._assigned.clear()

    def _report_released(self, task: TaskAssignment) -> None:
        self.tally.count("released", self.role)
        try:
            self.client.complete_task(task.task_id, {})
        except ServiceUnavailable:
            self.tally.add("outage")
        except ApiError as exc:
            # Past its grace the coordinator cancelled it (409): nothing to report.
            if exc.status not in (401, 404, 409, 502, 503, 504):
                self.tally.count("errors", f"complete: {exc.status} {exc.code}")

    def _register(self) -> None:
        try:
            reg = self.client.register(
                self.role,
                self.soak.inbox_url,
                {"cpu_count": 1, "cuda_devices": 0},
                slave_token=self.slave_token,
            )
        except (ServiceUnavailable, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status not in (502, 503, 504):
                self.tally.count("errors", f"register: {exc.status} {exc.code}")
            self.tally.add("outage")
            time.sleep(0.5)
            return
        with self._lock:
            self._task = None
            self._assigned.clear()
        self.client.credential = reg.credential
        self.heartbeat_interval_s = reg.heartbeat_interval_s
        self.worker_id, self.forgotten = reg.worker_id, False

    def heartbeats(self) -> None:
        while not self.soak.stop.wait(self.heartbeat_interval_s * random.uniform(0.8, 1.0)):
            worker_id, task = self.worker_id, self._task
            if worker_id is None or self.forgotten:
                continue
            running = [] if task is None else [TaskProgress(task_id=task.task_id, state="running")]
            try:
                reply = self.client.heartbeat(worker_id, running)
            except ServiceUnavailable:
                self.tally.add("outage")
                continue
            except ApiError as exc:
                if exc.status in (401, 404):
                    self.forgotten = True  # a restarted coordinator: register again
                elif exc.status in (502, 503, 504):
                    self.tally.add("outage")
                else:
                    self.tally.count("errors", f"heartbeat: {exc.status} {exc.code}")
                continue
            for task_id in reply.cancel:
                self.cancel(task_id)
            for task_id in reply.release:
                self.release(task_id)

    def call(self, task: TaskAssignment, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """`fn(...)` until it is answered: back-pressure and outages are waited out;
        a forgotten worker or an ended task ends the task; anything else is an error."""
        while True:
            self.check(task)
            try:
                return fn(*args, **kw)
            except ServiceUnavailable:
                self.tally.add("outage")
                time.sleep(0.2)
            except ApiError as exc:
                if (what, exc.status) == ("insert", 429) or (what, exc.code) in (
                    ("sample", "sample_timeout"),
                    ("sample", "too_many_waiting"),
                ):
                    self.tally.count("back_pressure", f"{what} {exc.status} {exc.code}")
                    time.sleep(exc.retry_after_s or 0.0)
                elif exc.status in (502, 503, 504):
                    self.tally.add("outage")
                    time.sleep(exc.retry_after_s or 0.2)
                elif exc.status == 401:
                    raise Forgotten from None
                elif exc.status in (404, 409, 410):
                    raise TaskOver from None  # its job ended, or the task was handed on
                else:
                    self.tally.count("errors", f"{what}: {exc.status} {exc.code}: {exc}"[:160])
                    raise TaskOver from None

    def run(self, task: TaskAssignment) -> None:
        raise NotImplementedError

    def data_for(self, task: TaskAssignment) -> DataClient:
        """Where the task's data goes: its job's buffer processes (its spec's `data`,
        with the task's credential), or the coordinator."""
        access = getattr(task.spec, "data", None)
        if access is None:
            return BufferData(self.client.base_url, self.client.bearer, timeout_s=10.0)
        return data_client(access.urls, access.credential, timeout_s=10.0)


class SimCollector(SimWorker):
    role = "collector"

    def run(self, task: TaskAssignment) -> None:
        store, job_id = self.soak.store, task.job_id
        data = self.data_for(task)
        columns = task_columns(store, job_id, task.task_id)
        folder = f"{self.worker_id}.{task.task_id}"
        period_s = 1.0 / self.soak.args.insert_rate
        next_s = time.monotonic() + random.uniform(0, period_s)
        for seq in range(1 << 30):
            self.check(task)
            if self.soak.filled(job_id):
                time.sleep(max(0.0, next_s - time.monotonic()))
                next_s = max(next_s + period_s, time.monotonic() - period_s)
            else:  # fill the buffer first, so what is measured is a full buffer's life
                next_s = time.monotonic()
            ref = segment_ref(store, job_id, folder, seq)
            store.write_segment(ref.path, columns, header=dump(ref))
            reply = self.call(
                task,
                "insert",
                data.insert_segments,
                job_id,
                [ref],
                timeout_s=INSERT_TIMEOUT_S,
                task_id=task.task_id,
            )
            self.tally.add("inserts")
            if reply.accepted + reply.duplicates == 1:
                self.tally.count("acknowledged", job_id, ref.env_steps)
            else:
                self.tally.count("errors", f"insert of one segment answered {reply}")


class SimLearner(SimWorker):
    role = "learner"

    def run(self, task: TaskAssignment) -> None:
        data = self.data_for(task)
        holds: list[str] = []
        while True:
            reply = self.call(
                task,
                "sample",
                data.sample,
                task.job_id,
                batch_size=BATCH_SIZE,
                num_batches=NUM_BATCHES,
                timeout_s=SAMPLE_TIMEOUT_S,
                task_id=task.task_id,
                acknowledge=holds,
            )
            self.tally.add("samples")
            holds = [reply.hold_id] if reply.hold_id else []
            keys = [key for batch in reply.batches for key in batch.keys]
            if keys:
                priorities = [round(random.uniform(0.05, 2.0), 4) for _ in keys]
                self.call(
                    task,
                    "priorities",
                    data.update_priorities,
                    task.job_id,
                    keys,
                    priorities,
                    task_id=task.task_id,
                )
                self.tally.add("priority_updates")


def inbox_handler(workers: dict[str, SimWorker]) -> type[BaseHTTPRequestHandler]:
    class Inbox(BaseHTTPRequestHandler):
        """The slave routes the coordinator calls, for every simulated worker."""

        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _worker(self) -> SimWorker | None:
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            return workers.get(token)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            worker = self._worker()
            released = self.path.removeprefix("/v1/tasks/").removesuffix("/release")
            if worker is not None and self.path == f"/v1/tasks/{released}/release":
                self._answer(worker.release(released), {"task_id": released})
                return
            if worker is None or self.path != "/v1/tasks":
                self._answer(401 if worker is None else 404, {"error": "no"})
                return
            task = parse(TaskAssignment, body)
            self._answer(worker.assign(task), {"task_id": task.task_id})

        def do_DELETE(self) -> None:  # noqa: N802
            worker = self._worker()
            task_id = self.path.removeprefix("/v1/tasks/")
            if worker is None:
                self._answer(401, {"error": "no"})
                return
            self._answer(worker.cancel(task_id), {"task_id": task_id})

        def log_message(self, *args: Any) -> None:
            pass

    return Inbox


def gang_config() -> dict:
    """A sync PPO job whose rounds are split over 2 collectors, given whole."""
    return {
        "env": {"env_id": "CartPole-v1"},
        "policy": {
            "type": "ppo",
            "learn": {"batch_size": BATCH_SIZE},
            "collect": {"n_sample": 2 * SEGMENT_ROWS},
            "other": {"replay_buffer": {"replay_buffer_size": 100 * SEGMENT_ROWS}},
        },
        "system": {"workflow": "sync", "collector_num": 2},
    }


def job_config(args: argparse.Namespace, *, collectors: int | None, buffer_items: int) -> dict:
    return {
        "env": {"env_id": "CartPole-v1"},
        "policy": {
            "type": "dqn",
            "learn": {"batch_size": BATCH_SIZE, "num_batches": NUM_BATCHES},
            "collect": {"n_sample": SEGMENT_ROWS},
            "other": {
                "replay_buffer": {
                    "type": "prioritized",
                    "replay_buffer_size": buffer_items,
                    "min_size_to_sample": 1000,
                }
            },
        },
        "system": {"collector_num": collectors},
    }


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.tally = Tally()
        self.stop = threading.Event()
        self.cluster = LocalCluster(
            root / "shared",
            num_collectors=0,
            num_learners=0,
            extra_env={"DROVER_MAX_ENDED_JOBS": str(args.max_ended_jobs)},
        )
        self.store = SharedStore(self.cluster.shared_dir)
        self.url = self.cluster.coordinator_url
        self.registration_token = self.cluster.registration_token
        self.inbox_url = ""
        #: (seconds since the start, the coordinator's life (0, 1, ...), VmRSS in MB).
        self.rss: list[tuple[float, int, float]] = []
        self.life = 0
        self.life_started_s: list[float] = []
        self.recoveries: list[dict[str, Any]] = []
        self.buffer_kills = 0
        self.jobs_churned = 0
        self.main_jobs: list[str] = []
        #: Each main job's acknowledged env steps at each minute's line, and at the end.
        self.minutes: list[dict[str, int]] = []
        #: When every main job's buffer had been filled (seconds since the start).
        self.filled_s: float | None = None

    def filled(self, job_id: str) -> bool:
        """Whether a job's collectors have acknowledged a buffer's worth (churned
        jobs count as filled: they run at the nominal rate)."""
        if job_id not in self.main_jobs[: self.args.learners]:  # the gang's is small
            return True
        return self.tally.acknowledged[job_id] >= self.args.buffer_items

    def main_buffer_pids(self) -> dict[str, int]:
        """The buffer process of each main job, by job id."""
        process = self.cluster.coordinator.process
        if process is None:
            return {}
        serving = buffer_processes(process.pid)
        return {job_id: pid for job_id, pid in serving.items() if job_id in self.main_jobs}

    def data_plane_rss_mb(self) -> float | None:
        """VmRSS of the coordinator and the main jobs' buffer processes, summed."""
        process = self.cluster.coordinator.process
        if process is None:
            return None
        total_kb = 0
        for pid in (process.pid, *self.main_buffer_pids().values()):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total_kb += int(line.split()[1])
            except OSError:
                return None
        return total_kb / 1024

    def run(self) -> dict[str, Any]:
        args = self.args
        cluster = self.cluster
        cluster.start()
        started = time.monotonic()
        self.life_started_s.append(0.0)
        # With --gang the DQN jobs share the collectors by weight; without, each has its
        # own part of them.
        per_job = [None] * args.learners if args.gang else split(args.collectors, args.learners)
        main_jobs = self.main_jobs = [
            cluster.client.submit_job(
                job_config(args, collectors=n, buffer_items=args.buffer_items)
            ).job_id
            for n in per_job
        ]
        if args.gang:
            main_jobs.append(cluster.client.submit_job(gang_config()).job_id)
        learners = args.learners + args.gang
        workers: dict[str, SimWorker] = {}
        for role, count in ((SimCollector, args.collectors), (SimLearner, learners)):
            for _ in range(count):
                worker = role(self)
                workers[worker.slave_token] = worker
        server = ThreadingHTTPServer(("127.0.0.1", 0), inbox_handler(workers))
        server.daemon_threads = True
        self.inbox_url = f"http://127.0.0.1:{server.server_address[1]}"
        threads = [threading.Thread(target=server.serve_forever, daemon=True)]
        for worker in workers.values():
            threads.append(threading.Thread(target=worker.main, daemon=True))
            threads.append(threading.Thread(target=worker.heartbeats, daemon=True))
        threads.append(threading.Thread(target=self._churn, daemon=True))
        for thread in threads:
            thread.start()
        duration_s = args.minutes * 60
        kills_at = [duration_s * (i + 1) / (args.kills + 1) for i in range(args.kills)]
        # Halfway between the coordinator's kills (or spread evenly, when more).
        spacing_s = duration_s / max(args.kills + 1, args.buffer_kills)
        buffer_kills_at = [spacing_s * (i + 0.5) for i in range(args.buffer_kills)]
        next_rss_s, next_line_s = 0.0, 60.0
        try:
            while (now := time.monotonic() - started) < duration_s:
                if kills_at and now >= kills_at[0]:
                    kills_at.pop(0)
                    self._kill_and_restart(main_jobs, started)
                if buffer_kills_at and now >= buffer_kills_at[0]:
                    buffer_kills_at.pop(0)
                    self._kill_a_buffer(main_jobs, started)
                if self.filled_s is None and all(self.filled(j) for j in main_jobs):
                    self.filled_s = now
                    say(f"{now:6.0f} s  every main job's buffer filled")
                if now >= next_rss_s:
                    rss = self.data_plane_rss_mb()
                    if rss is not None:
                        self.rss.append((now, self.life, rss))
                    next_rss_s += RSS_PERIOD_S
                if now >= next_line_s:
                    self._say_minute(now)
                    self.minutes.append({j: self.tally.acknowledged[j] for j in main_jobs})
                    next_line_s += 60.0
                time.sleep(0.2)
            # The end closes the last minute (a shorter one when the run is not whole
            # minutes).
            self.minutes.append({j: self.tally.acknowledged[j] for j in main_jobs})
            final = self._recovered(main_jobs, dict(self.tally.acknowledged))
        finally:
            self.stop.set()
            server.shutdown()
            for thread in threads:
                thread.join(5)
            cluster.stop()
        return self._result(main_jobs, final)

    def _churn(self) -> None:
        """A small job submitted every `--churn-s`, the ones before it stopped (all of
        them: a submission whose answer a coordinator kill cut off still made a job)."""
        client = self.cluster.client
        while not self.stop.wait(self.args.churn_s):
            try:
                job_id = client.submit_job(
                    job_config(self.args, collectors=1, buffer_items=10_000), name=CHURNED
                ).job_id
                for job in client.list_jobs(phase="running"):
                    if job.name == CHURNED and job.job_id != job_id:
                        client.stop_job(job.job_id)
            except (ServiceUnavailable, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status not in (409, 502, 503, 504):
                    self.tally.count("errors", f"churn: {exc.status} {exc.code}")
                self.tally.add("outage")
                continue
            self.jobs_churned += 1

    def _kill_and_restart(self, main_jobs: list[str], started: float) -> None:
        acknowledged = dict(self.tally.acknowledged)
        coordinator = self.cluster.coordinator
        os.kill(coordinator.process.pid, signal.SIGKILL)
        coordinator.wait(10)
        self.cluster.supervise(max_restarts=self.args.kills)
        self.cluster.wait_ready(RESTART_TIMEOUT_S)
        self.life += 1
        self.life_started_s.append(time.monotonic() - started)
        self.recoveries.append(self._recovered(main_jobs, acknowledged))
        say(
            f"{self.life_started_s[-1]:6.0f} s  coordinator killed and restarted: "
            f"{self.recoveries[-1]}"
        )

    def _kill_a_buffer(self, main_jobs: list[str], started: float) -> None:
        acknowledged = dict(self.tally.acknowledged)
        pids = self.main_buffer_pids()
        job_id = main_jobs[self.buffer_kills % len(main_jobs)]
        self.buffer_kills += 1
        if job_id not in pids:
            say(f"job {job_id} has no buffer process to kill (restarting?)")
            return
        os.kill(pids[job_id], signal.SIGKILL)
        self.life += 1
        self.life_started_s.append(time.monotonic() - started)
        self.recoveries.append(self._recovered([job_id], acknowledged))
        say(
            f"{self.life_started_s[-1]:6.0f} s  the buffer process of {job_id} killed: "
            f"{self.recoveries[-1]}"
        )

    def _recovered(self, main_jobs: list[str], acknowledged: dict[str, int]) -> dict[str, Any]:
        """Wait until each main job's env steps reach what was acknowledged."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        steps: dict[str, int] = {}
        while True:
            for job_id in main_jobs:
                try:
                    steps[job_id] = self.cluster.client.job(job_id).env_steps
                except (ServiceUnavailable, ApiError):
                    steps[job_id] = -1
            if all(steps[j] >= acknowledged.get(j, 0) for j in main_jobs):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {
            "acknowledged": sum(acknowledged.get(j, 0) for j in main_jobs),
            "indexed": sum(steps.values()),
            "lost": sum(max(0, acknowledged.get(j, 0) - steps[j]) for j in main_jobs),
        }

    def _say_minute(self, now: float) -> None:
        t = self.tally
        rss = self.rss[-1][2] if self.rss else float("nan")
        say(
            f"{now:6.0f} s  RSS {rss:7.1f} MB  acknowledged {sum(t.acknowledged.values()):>10,} "
            f"env steps  samples {t.samples:>7,}  churned {self.jobs_churned:>4}  "
            f"errors {sum(t.errors.values())}  back-pressure {sum(t.back_pressure.values())}  "
            f"outage {t.outage}"
        )

    def _result(self, main_jobs: list[str], final: dict[str, Any]) -> dict[str, Any]:
        warmup_s = self.args.warmup_s
        filled_s = self.filled_s if self.filled_s is not None else float("inf")
        lives = []
        for life, start_s in enumerate(self.life_started_s):
            # A life's warm-up: its first `warmup_s`, and the buffers' filling.
            settled_s = max(start_s, filled_s) + warmup_s
            points = [mb for t, n, mb in self.rss if n == life and t >= settled_s]
            if len(points) >= 2:
                lives.append(
                    {
                        "life": life,
                        "after_warmup_mb": round(points[0], 1),
                        "max_mb": round(max(points), 1),
                        "last_mb": round(points[-1], 1),
                        "growth_mb": round(max(points) - points[0], 1),
                    }
                )
        t = self.tally
        return {
            "minutes": self.args.minutes,
            "main_jobs": main_jobs,
            "jobs_churned": self.jobs_churned,
            "filled_s": self.filled_s,
            "rss_by_life": lives,
            "recoveries": self.recoveries,
            "final": final,
            "inserts": t.inserts,
            "samples": t.samples,
            "priority_updates": t.priority_updates,
            "errors": dict(t.errors),
            "back_pressure": dict(t.back_pressure),
            "outage": t.outage,
            "forgotten": t.forgotten,
            "tasks_taken": dict(t.tasks_taken),
            "released": dict(t.released),
            "progress_by_minute": self.minutes,
        }


def checks(result: dict[str, Any], args: argparse.Namespace) -> list[tuple[str, bool]]:
    lives = result["rss_by_life"]
    lost = sum(r["lost"] for r in [*result["recoveries"], result["final"]])
    return [
        (
            f"RSS after warm-up grows by at most {args.rss_growth_mb:g} MB in each life",
            bool(lives) and all(life["growth_mb"] <= args.rss_growth_mb for life in lives),
        ),
        ("no errors", not result["errors"]),
        ("nothing acknowledged lost", lost == 0 and result["final"]["acknowledged"] > 0),
        ("the learners sampled", result["samples"] > 0),
        ("jobs came and went", result["jobs_churned"] > 0),
        (
            "every main job progressed in every minute",
            all(
                later[j] > earlier[j]
                for earlier, later in itertools.pairwise(result["progress_by_minute"])
                for j in result["main_jobs"]
            ),
        ),
        ("the buffers were filled", result["filled_s"] is not None),
    ]


def say(line: str) -> None:
    print(line, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--collectors", type=int, default=8)
    parser.add_argument("--learners", type=int, default=2, help="one main job each")
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument(
        "--buffer-kills", type=int, default=2, help="main jobs' buffer processes killed"
    )
    parser.add_argument("--buffer-items", type=int, default=1_000_000)
    parser.add_argument("--insert-rate", type=float, default=5.0, help="segments/s a collector")
    parser.add_argument("--churn-s", type=float, default=3.0)
    parser.add_argument("--max-ended-jobs", type=int, default=20)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="of each coordinator life")
    parser.add_argument("--rss-growth-mb", type=float, default=32.0)
    parser.add_argument(
        "--gang",
        action="store_true",
        help="the DQN jobs share the collectors, beside a sync PPO job needing 2 at once",
    )
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.insert_rate <= 0 or args.churn_s <= 0:
        parser.error("--minutes, --insert-rate and --churn-s must be positive")
    if args.collectors < 1 or args.learners < 1 or min(args.kills, args.buffer_kills) < 0:
        parser.error("--collectors and --learners: at least 1; --kills, --buffer-kills: at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = Soak(args, Path(tmp)).run()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    say(json.dumps(result, indent=2))
    failed = False
    for name, ok in checks(result, args):
        say(f"{'met' if ok else 'NOT met'}: {name}")
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
