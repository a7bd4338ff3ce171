"""The coordinator's logic: jobs, workers and their leases, tasks, the replay buffers,
the policy pointer, evaluation and stop conditions. No Flask, no sockets.

All state lives in memory behind one lock. The scheduler thread (scheduler.py) asks
`plan()` what to assign and reports back with `dispatched()` / `dispatch_failed()`;
the blocking buffer calls (long-poll samples, rate-limited inserts) run outside the
lock so one waiting learner never holds up the rest.
"""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import secrets
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common.config import (
    ConfigError,
    JobConfig,
    from_resolved,
    min_error_buffer,
    resolve_job_config,
    to_dict,
    with_spaces,
)
from common.envs import env_spaces
from common.errors import ApiError, bad_request, conflict, not_found
from common.http import Caller
from common.messages import (
    MAX_SAMPLE_ITEMS,
    TERMINAL_PHASES,
    EvalResult,
    EvalSummary,
    Heartbeat,
    InsertReply,
    JobCreated,
    JobMetrics,
    JobStatus,
    JobSubmit,
    MessageError,
    PolicyRef,
    PriorityUpdate,
    Registered,
    SampleReply,
    SampleRequest,
    SegmentInsert,
    SegmentRef,
    TaskAssignment,
    WorkerInfo,
    WorkerRegistration,
    dump,
    new_id,
    parse,
)
from common.storage import CorruptFileError, PathError, SharedStore, sha256_hex
from services.buffer.core import BufferClosed, BufferStats, ReplayBuffer
from services.coordinator.snapshot import (
    as_record,
    eval_from,
    policy_from,
    read_job_record,
    read_job_snapshot,
    state_path,
    write_job_record,
    write_job_snapshot,
)
from services.coordinator.urls import check_worker_url
from services.coordinator.workflows import WORKFLOWS, Workflow

log = logging.getLogger(__name__)


class TaskState(StrEnum):
    """A task's life: planned, confirmed by its worker, then ended one way."""

    ASSIGNING = "assigning"  # planned; the scheduler is sending it
    RUNNING = "running"  # its worker took it (or reports it)
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its job ended
    LOST = "lost"  # its worker went away, or never took it: it is planned again


ACTIVE = frozenset({TaskState.ASSIGNING, TaskState.RUNNING})


@dataclass(frozen=True, kw_only=True)
class CoordinatorLimits:
    """What one job may ask of this coordinator."""

    heartbeat_interval_s: float = 1.0
    lease_timeout_s: float = 10.0
    max_buffer_items: int = 10_000_000
    max_envs_per_task: int = 256
    max_collectors_per_job: int = 256
    #: A job fails after this many failed tasks (a crash loop, not a blip).
    max_task_failures: int = 5
    #: Policy versions kept on disk besides the best one and those being evaluated.
    keep_policies: int = 10
    metrics_period_s: float = 1.0
    #: After a job ends, its segments folder is removed this much later.
    segment_sweep_delay_s: float = 5.0
    #: A segment file no insert has claimed for this long is indexed (or deleted when
    #: stale or unreadable): what a collector killed between write and insert leaves.
    orphan_grace_s: float = 30.0
    #: A worker that refused or missed an assignment gets none for this long.
    dispatch_backoff_s: float = 1.0
    #: Sample long-polls allowed to wait at once; more are answered 503 at once, so
    #: slow or many clients can never hold every server thread.
    max_waiting_samples: int = 16
    #: ... and at most this many for one job, so one job's empty buffer cannot starve
    #: the learners of the others.
    max_waiting_samples_per_job: int = 4
    #: Collectors waiting at once for a newer policy version (each holds a server
    #: thread); past it they are answered at once and poll instead.
    max_waiting_policy_polls: int = 8
    #: Registered workers at once (each costs memory and scheduling time).
    max_workers: int = 1024
    #: Hosts (names, IPs, CIDRs) workers may advertise; empty: any valid host.
    worker_hosts: tuple[str, ...] = ()
    #: A task not confirmed by its worker this long after it was planned is lost (a
    #: dispatch that never completed), so it is planned again.
    assigning_timeout_s: float = 30.0
    #: A worker that failed this many assignments in a row is dropped: its URL does
    #: not answer, and it should register again when it does.
    max_dispatch_failures: int = 3
    orphan_sweep_period_s: float = 10.0
    metrics_points: int = 3600


@dataclass
class Task:
    task_id: str
    job_id: str
    kind: str
    spec: dict[str, Any]
    worker_id: str
    state: TaskState = TaskState.ASSIGNING
    planned_at_s: float = 0.0
    #: The scheduling pass that planned it.
    planned_in_pass: int = 0

    def assignment(self) -> TaskAssignment:
        return TaskAssignment(
            task_id=self.task_id,
            job_id=self.job_id,
            kind=self.kind,
            spec=self.spec,  # type: ignore[arg-type]
        )


@dataclass
class Worker:
    worker_id: str
    role: str
    url: str
    resources: dict[str, Any]
    last_heartbeat_s: float
    secret: str = ""
    #: What the coordinator sends to this worker's routes (the worker's own secret).
    slave_token: str = ""
    task_ids: set[str] = field(default_factory=set)
    #: After a failed assignment, no new one before this time (no retry storm).
    not_before_s: float = float("-inf")
    #: Assignments in a row this worker failed to take.
    dispatch_failures: int = 0
    progress: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class Job:
    job_id: str
    name: str
    config: JobConfig
    buffer: ReplayBuffer
    started_at: float
    phase: str = "running"
    reason: str = ""
    finished_at: float | None = None
    env_steps: int = 0
    train_iters: int = 0
    policy: PolicyRef | None = None
    policy_versions: list[int] = field(default_factory=list)
    #: The segments folder was removed after the job ended (late writes included).
    segments_swept: bool = False
    #: A snapshot was written after the job ended (no more are needed).
    final_snapshot: bool = False
    #: The job's terminal phase is on disk (record.json): its segments may go.
    terminal_durable: bool = False
    #: (phase, reason, finished_at) of an end being written to disk: the job takes no
    #: more data or tasks, and shows the phase once it is durable.
    ending: tuple[str, str, float] | None = None
    #: The evaluate workflow: per-episode results so far, and episodes handed out.
    evaluation: list[dict[str, Any]] = field(default_factory=list)
    evaluation_assigned: int = 0
    #: Segment files a learner reported unusable (their rows were skipped).
    unusable_segments: set[str] = field(default_factory=set)
    last_orphan_sweep_s: float = float("-inf")
    evals: list[EvalSummary] = field(default_factory=list)
    best_eval: EvalSummary | None = None
    #: Train iteration of the newest policy sent for evaluation.
    eval_requested_iter: int = 0
    tasks_created: int = 0
    task_failures: int = 0
    episode_returns: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=100)
    )
    metrics: collections.deque = field(default_factory=collections.deque)

    @property
    def running(self) -> bool:
        """Takes data and tasks: running, and not ending."""
        return self.phase == "running" and self.ending is None


@dataclass(frozen=True)
class Dispatch:
    """One call the scheduler must make to a slave."""

    url: str
    #: The worker's own secret for its routes (never the cluster token).
    auth: str
    worker_id: str
    task: TaskAssignment | None = None  # assign this task
    cancel_task_id: str | None = None  # or cancel this one


class _DeferredDeletes:
    """The buffer's segment files: a file released while the coordinator's lock is held
    is deleted once the lock is let go."""

    def __init__(self, store: SharedStore, defer: Callable[[Callable[[], Any]], None]) -> None:
        self._store = store
        self._defer = defer

    def delete(self, rel: str) -> bool:
        self._defer(lambda: self._store.delete(rel))
        return True

    def write_bytes(self, rel: str, data: bytes) -> Any:
        return self._store.write_bytes(rel, data)

    def read_bytes(self, rel: str) -> bytes:
        return self._store.read_bytes(rel)


class Coordinator:
    """Jobs, workers, tasks. Thread-safe; every public method takes the lock."""

    def __init__(
        self,
        store: SharedStore,
        limits: CoordinatorLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.limits = limits or CoordinatorLimits()
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.RLock()
        #: Per thread: how deep in `_changing` it is, and the disk work it deferred.
        self._local = threading.local()
        self._changed = threading.Condition(self._lock)
        self._dirty = False
        self.jobs: dict[str, Job] = {}
        self.workers: dict[str, Worker] = {}
        self.tasks: dict[str, Task] = {}
        self._cancels: list[Dispatch] = []
        self._last_metrics_s = float("-inf")
        self._snapshot_lock = threading.Lock()
        self._snapshot_gen = 0
        self._closing = False
        self._waiting_samples = 0
        self._waiting_by_job: collections.Counter[str] = collections.Counter()
        self._waiting_policy_polls = 0
        self._pass = 0

    # --- the lock and what waits for it ----------------------------------------------

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the lock for a change of state. Disk work the change needs (`_defer`)
        runs after the lock is released, in order, in this thread: before the caller
        answers, and never while another request waits for the lock."""
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._local.effects = []
        self._local.depth = depth + 1
        try:
            with self._lock:
                yield
        finally:
            self._local.depth = depth
            if depth == 0:
                effects, self._local.effects = self._local.effects, []
                for effect in effects:
                    try:
                        effect()
                    except Exception:
                        log.exception("deferred disk work failed")

    def _defer(self, effect: Callable[[], Any]) -> None:
        """Run `effect` once the current change releases the lock (now, outside one)."""
        if getattr(self._local, "depth", 0):
            self._local.effects.append(effect)
        else:
            effect()

    # --- jobs ----------------------------------------------------------------------

    def submit_job(self, submit: JobSubmit) -> JobCreated:
        try:
            config, warnings = resolve_job_config(submit.config)
            spaces = env_spaces(config.env)
            config = with_spaces(
                config,
                spaces.obs_shape,
                spaces.action_shape,
                spaces.action_space,
                spaces.action_bounds,
            )
        except ConfigError as exc:
            raise bad_request(f"config.{exc.field}", exc.message) from None
        self._check_limits(config)
        self._workflow(config).admit(config, self)
        job_id = new_id("job")
        self.store.write_json(f"{job_id}/job.json", to_dict(config))
        job = Job(
            job_id=job_id,
            name=submit.name or config.exp_name,
            config=config,
            buffer=self._new_buffer(job_id, config),
            started_at=self._wall(),
        )
        for warning in warnings:
            log.warning("job %s config: %s", job_id, warning)
        # Durable before it is answered: a coordinator that dies right after the 201
        # finds the job again.
        write_job_record(self.store, job_id, self._job_record(job))
        with self._changing():
            self.jobs[job_id] = job
            self._notify()
        log.info("job %s (%s) submitted: %s", job_id, job.name, config.env.env_id)
        return JobCreated(job_id=job_id, phase=job.phase, warnings=warnings)

    @staticmethod
    def _workflow(config: JobConfig) -> Workflow:
        return WORKFLOWS[config.system.workflow]

    def _new_buffer(self, job_id: str, config: JobConfig) -> ReplayBuffer:
        replay = self._workflow(config).replay(config)
        error_buffer = replay.error_buffer or 2 * min_error_buffer(config)
        return ReplayBuffer(
            job_id,
            replay,
            _DeferredDeletes(self.store, self._defer),
            error_buffer=error_buffer,
            seed=config.system.seed,
        )

    def _check_limits(self, config: JobConfig) -> None:
        collectors = config.system.collector_num
        if collectors is not None and collectors > self.limits.max_collectors_per_job:
            raise bad_request(
                "config.system.collector_num",
                f"{collectors} exceeds this coordinator's limit of "
                f"{self.limits.max_collectors_per_job}",
            )
        for key in ("collector_env_num", "evaluator_env_num"):
            value = getattr(config.env, key)
            if value > self.limits.max_envs_per_task:
                raise bad_request(
                    f"config.env.{key}",
                    f"{value} exceeds this coordinator's limit of {self.limits.max_envs_per_task}",
                )

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise not_found(f"job {job_id}")
        return job

    def _running_job(self, job_id: str) -> Job:
        self._raise_if_closing()
        job = self._job(job_id)
        if not job.running:
            phase, reason = job.ending[:2] if job.ending else (job.phase, job.reason)
            raise conflict("job_finished", f"job {job_id} is {phase}: {reason}")
        return job

    def stop_job(self, job_id: str) -> JobStatus:
        with self._changing():
            job = self._job(job_id)
            if job.running:
                self._finish(job, "stopped", "stopped by request")
        # The end is on disk now (the change's deferred work ran): answer with it.
        return self.job_status(job_id)

    def _finish(self, job: Job, phase: str, reason: str) -> None:
        """End a job: stop its data and its tasks now; its new phase shows once it is
        on disk (`_complete_end`, run when the lock is let go), and its step data is
        deleted only after that."""
        if not job.running:
            return  # already ending
        job.ending = (phase, reason, self._wall())
        job.buffer.close()  # no more data in or out, whatever follows
        for task in self.tasks.values():
            if task.job_id == job.job_id and task.state in ACTIVE:
                worker = self.workers.get(task.worker_id)
                self._end_task(task, TaskState.CANCELLED)
                if worker is not None:
                    self._cancels.append(self._cancel_dispatch(worker, task.task_id))
        record = {**self._job_record(job), "phase": phase, "reason": reason}
        record["finished_at"] = job.ending[2]
        self._defer(lambda: self._complete_end(job, record))
        log.info("job %s %s: %s", job.job_id, phase, reason)
        self._notify()

    def _complete_end(self, job: Job, record: dict[str, Any]) -> None:
        """Write the ending job's record; then show its end; then delete its segments.

        Nobody sees a job as ended before its end is on disk, so a coordinator killed
        at any moment never brings back as running a job it reported as ended. When
        the record cannot be written, the job stays ending and the snapshot thread
        tries again.
        """
        try:
            write_job_record(self.store, job.job_id, record)
        except OSError as exc:
            log.error("job %s: cannot record its end yet (%s); will retry", job.job_id, exc)
            return
        with self._changing():
            if job.terminal_durable or job.ending is None:
                return
            job.phase, job.reason, job.finished_at = job.ending
            job.terminal_durable = True
            summary = dump(self._status(job))
            self._notify()
        self.store.write_json(f"{job.job_id}/summary.json", summary)
        # Step data is only for training: a finished job keeps policies, checkpoints,
        # evaluations and logs, not segments.
        try:
            job.buffer.release_all()
        except Exception:
            log.exception("job %s: releasing its segments failed", job.job_id)

    def job_status(self, job_id: str) -> JobStatus:
        with self._changing():
            return self._status(self._job(job_id))

    def list_jobs(self) -> list[JobStatus]:
        with self._changing():
            return [self._status(j) for j in self.jobs.values()]

    def _status(self, job: Job) -> JobStatus:
        return JobStatus(
            job_id=job.job_id,
            name=job.name,
            phase=job.phase,
            algo=job.config.policy.type,
            env_id=job.config.env.env_id,
            env_steps=job.env_steps,
            train_iters=job.train_iters,
            policy_version=job.policy.version if job.policy else 0,
            last_eval=job.evals[-1] if job.evals else None,
            best_eval_return=job.best_eval.return_mean if job.best_eval else None,
            best_policy_version=job.best_eval.policy_version if job.best_eval else None,
            stop_value=job.config.env.stop_value,
            reason=job.reason,
            started_at=job.started_at,
            finished_at=job.finished_at,
        )

    def job_metrics(self, job_id: str) -> JobMetrics:
        with self._changing():
            job = self._job(job_id)
            points, evals = list(job.metrics), list(job.evals)
            unusable = sorted(job.unusable_segments)
        # The buffer's stats take its own lock, never the coordinator's.
        return JobMetrics(
            job_id=job_id,
            points=points,
            evals=evals,
            buffer=dump(job.buffer.stats()),
            unusable_segments=unusable,
        )

    def buffer_sizes(self) -> dict[str, int]:
        """Each job's buffer size (cheap: no stats are computed)."""
        with self._changing():
            return {job_id: job.buffer.size for job_id, job in self.jobs.items()}

    # --- workers -------------------------------------------------------------------

    def register_worker(self, reg: WorkerRegistration) -> Registered:
        worker = Worker(
            worker_id=new_id(reg.role),
            role=reg.role,
            url=check_worker_url(reg.url, self.limits.worker_hosts),
            resources=reg.resources,
            last_heartbeat_s=self._clock(),
            secret=secrets.token_urlsafe(32),
            slave_token=reg.slave_token,
        )
        with self._changing():
            if len(self.workers) >= self.limits.max_workers:
                raise ApiError(
                    503,
                    "too_many_workers",
                    f"this coordinator has its limit of {self.limits.max_workers} workers",
                    retry_after_s=self.limits.lease_timeout_s,
                )
            self.workers[worker.worker_id] = worker
            self._notify()
        log.info("worker %s registered at %s", worker.worker_id, worker.url)
        return Registered(
            worker_id=worker.worker_id,
            heartbeat_interval_s=self.limits.heartbeat_interval_s,
            lease_timeout_s=self.limits.lease_timeout_s,
            credential=f"{worker.worker_id}.{worker.secret}",
        )

    def worker_for_credential(self, credential: str) -> Caller | None:
        """The worker a credential belongs to (None if it is no live worker's)."""
        worker_id, _, secret = credential.rpartition(".")
        with self._changing():
            worker = self.workers.get(worker_id)
        if worker is None or not hmac.compare_digest(secret.encode(), worker.secret.encode()):
            return None
        return Caller("worker", worker_id=worker_id, role=worker.role)

    @staticmethod
    def _must_be(caller: str | None, worker_id: str, what: str) -> None:
        """A worker acting by its own credential may act only as itself."""
        if caller is not None and caller != worker_id:
            raise ApiError(403, "forbidden", f"worker {caller} may not {what} of {worker_id}")

    def heartbeat(self, worker_id: str, beat: Heartbeat, *, caller: str | None = None) -> list[str]:
        """Renew the worker's lease; returns the ids of tasks it must stop."""
        self._must_be(caller, worker_id, "send the heartbeats")
        with self._changing():
            worker = self.workers.get(worker_id)
            if worker is None:
                raise ApiError(404, "unknown_worker", f"worker {worker_id} is not registered")
            worker.last_heartbeat_s = self._clock()
            cancel = []
            for report in beat.tasks:
                task = self.tasks.get(report.task_id)
                if task is None or task.worker_id != worker_id or task.state not in ACTIVE:
                    cancel.append(report.task_id)
                    continue
                task.state = TaskState.RUNNING
                worker.progress[task.task_id] = dict(report.progress)
                job = self.jobs[task.job_id]
                if len(job.unusable_segments) < 1000:
                    job.unusable_segments.update(report.unusable_segments)
                train_iter = report.progress.get("train_iter")
                # Only the job's learner counts training; the number is a report, not
                # a budget a collector could spend.
                if task.kind == "learn" and train_iter is not None:
                    job.train_iters = max(job.train_iters, int(train_iter))
            return cancel

    def leave(self, worker_id: str, *, caller: str | None = None) -> None:
        self._must_be(caller, worker_id, "end the registration")
        with self._changing():
            if worker_id not in self.workers:
                raise not_found(f"worker {worker_id}")
            self._drop_worker(worker_id, "left")

    def _drop_worker(self, worker_id: str, why: str) -> None:
        worker = self.workers.pop(worker_id)
        for task_id in list(worker.task_ids):
            self._end_task(self.tasks[task_id], TaskState.LOST)
        log.info("worker %s %s; its tasks go back to the queue", worker_id, why)
        self._notify()

    def list_workers(self) -> list[WorkerInfo]:
        now = self._clock()
        with self._changing():
            return [
                WorkerInfo(
                    worker_id=w.worker_id,
                    role=w.role,
                    url=w.url,
                    state="busy" if w.task_ids else "idle",
                    task_id=min(w.task_ids) if w.task_ids else None,
                    task_ids=sorted(w.task_ids),
                    last_heartbeat_s=round(now - w.last_heartbeat_s, 3),
                    progress={t: p for t, p in w.progress.items() if t in w.task_ids},
                )
                for w in self.workers.values()
            ]

    # --- tasks ---------------------------------------------------------------------

    def _task(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise not_found(f"task {task_id}")
        if task.state not in ACTIVE:
            # A late message for a task that was reassigned or ended: refuse it, so
            # nothing is counted twice.
            raise conflict("task_not_active", f"task {task_id} is {task.state}")
        return task

    def _check_sender(
        self, job_id: str, task_id: str | None, kind: str, caller: str | None = None
    ) -> None:
        """Refuse a message sent for a task that is no longer this worker's to run."""
        if task_id is None:
            if caller is not None:
                raise bad_request("task_id", f"a worker sends the {kind} task it acts for")
            return
        task = self.tasks.get(task_id)
        if task is None or task.job_id != job_id or task.kind != kind:
            raise conflict("task_not_active", f"{kind} task {task_id} is not a task of {job_id}")
        if task.state not in ACTIVE:
            raise conflict("task_not_active", f"task {task_id} is {task.state}")
        self._must_be(caller, task.worker_id, f"act for task {task_id}")

    def _end_task(self, task: Task, state: TaskState) -> None:
        job = self.jobs.get(task.job_id)
        if task.kind == "learn" and job is not None and job.running and state != TaskState.DONE:
            # Items handed to this task that it never acknowledged go back (to a job
            # that still trains: an ended one has nobody to give them to).
            returned = job.buffer.give_back(task.task_id)
            if returned:
                log.info("task %s ended (%s): %d held items back", task.task_id, state, returned)
        if state in (TaskState.FAILED, TaskState.LOST) and job is not None:
            self._workflow(job.config).task_ended(job, task, state)
        task.state = state
        worker = self.workers.get(task.worker_id)
        if worker is not None:
            worker.task_ids.discard(task.task_id)
            worker.progress.pop(task.task_id, None)
        self._notify()

    def complete_task(
        self, task_id: str, result: dict[str, Any], *, caller: str | None = None
    ) -> None:
        with self._changing():
            task = self._task(task_id)
            self._must_be(caller, task.worker_id, f"report on task {task_id}")
            job = self.jobs[task.job_id]
            outcome = None
            if task.kind == "evaluate":
                try:
                    outcome = parse(EvalResult, result)
                except MessageError as exc:
                    raise bad_request(f"result.{exc.field}", exc.message) from None
            self._end_task(task, TaskState.DONE)
            if outcome is not None:
                self._workflow(job.config).evaluated(job, task, outcome, self)

    def fail_task(self, task_id: str, error: str, *, caller: str | None = None) -> None:
        with self._changing():
            task = self._task(task_id)
            self._must_be(caller, task.worker_id, f"report on task {task_id}")
            job = self.jobs[task.job_id]
            self._end_task(task, TaskState.FAILED)
            job.task_failures += 1
            log.warning("task %s (%s) of job %s failed: %s", task_id, task.kind, job.job_id, error)
            if job.task_failures >= self.limits.max_task_failures and job.running:
                self._finish(
                    job, "failed", f"{job.task_failures} tasks failed; last: {error[:500]}"
                )

    # --- data plane ----------------------------------------------------------------

    def insert_segments(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply:
        with self._changing():
            job = self._running_job(job_id)
            self._check_sender(job_id, insert.task_id, "collect", caller)
        segments_dir = f"{job_id}/segments"
        if caller is not None:
            # A collector's own folder is named "<its worker id>.<task id>".
            own = f"{segments_dir}/{caller}.{insert.task_id}/"
            for i, ref in enumerate(insert.segments):
                if not ref.path.startswith(own):
                    raise ApiError(
                        403, "forbidden", f"segments.{i}.path: not in {caller}'s own folder"
                    )
        for i, ref in enumerate(insert.segments):
            self._check_segment_file(job_id, ref, f"segments.{i}")
        try:
            result = job.buffer.insert(insert.segments, timeout_s=insert.timeout_s)
        except ValueError as exc:
            raise bad_request("segments", str(exc)) from None
        except BufferClosed:
            self._raise_if_closing()
            raise
        with self._changing():
            self._account(job, result.accepted_refs)
            return InsertReply(
                accepted=result.accepted, duplicates=result.duplicates, env_steps=job.env_steps
            )

    def _check_segment_file(self, job_id: str, ref: SegmentRef, field: str) -> None:
        """A reference must describe its file: inside the job's segments folder, a
        regular file, and as many rows as its header says (a declared size is never
        trusted: it decides what the buffer evicts). Reads the header only."""
        try:
            self.store.resolve(ref.path, under=f"{job_id}/segments")
            rows = self.store.segment_rows(ref.path)
        except PathError as exc:
            raise bad_request(f"{field}.path", str(exc)) from None
        except FileNotFoundError:
            raise bad_request(f"{field}.path", f"no file at '{ref.path}'") from None
        except (OSError, CorruptFileError) as exc:
            raise bad_request(f"{field}.path", f"not a readable segment: {exc}") from None
        if rows != ref.rows:
            raise bad_request(f"{field}.rows", f"{ref.rows} declared, the file holds {rows}")

    def _account(self, job: Job, refs: list[SegmentRef]) -> None:
        """Count newly indexed segments into the job; end it at `max_env_step`."""
        for ref in refs:
            job.env_steps += ref.env_steps
            job.episode_returns.extend(ref.episode_returns)
        max_env_step = job.config.system.max_env_step
        if job.running and max_env_step and job.env_steps >= max_env_step:
            self._finish_at_limit(job, f"max_env_step {max_env_step} reached")

    def _finish_at_limit(self, job: Job, what: str) -> None:
        # A budget ran out: that is success only for a job with no return goal.
        if job.config.env.stop_value is None:
            self._finish(job, "succeeded", what)
        else:
            self._finish(job, "failed", f"{what} before stop_value {job.config.env.stop_value}")

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampleReply:
        items = request.batch_size * request.num_batches
        if items > MAX_SAMPLE_ITEMS:
            raise bad_request(
                "num_batches",
                f"batch_size x num_batches = {items} exceeds {MAX_SAMPLE_ITEMS} items",
            )
        with self._changing():
            job = self._running_job(job_id)
            self._check_sender(job_id, request.task_id, "learn", caller)
            if request.timeout_s > 0:
                self._check_waiting(job_id)
            self._waiting_samples += 1
            self._waiting_by_job[job_id] += 1
        try:
            if request.task_id is not None and request.acknowledge:
                job.buffer.acknowledge(request.task_id, list(request.acknowledge))
            batches, hold_id = job.buffer.sample_for(
                request.task_id,
                request.batch_size,
                request.num_batches,
                timeout_s=request.timeout_s,
            )
        except BufferClosed:
            self._raise_if_closing()
            raise
        finally:
            with self._changing():
                self._waiting_samples -= 1
                self._waiting_by_job[job_id] -= 1
        with self._changing():
            task = self.tasks.get(request.task_id or "")
            if hold_id is not None and (task is None or task.state not in ACTIVE):
                # The task ended while this request waited: nobody will train on them.
                job.buffer.give_back(request.task_id or "")
                raise conflict("task_not_active", f"task {request.task_id} has ended")
        return SampleReply(batches=batches, hold_id=hold_id)

    def _check_waiting(self, job_id: str) -> None:
        """Bound the long-polls waiting at once, in all and per job (503 at once)."""
        if self._waiting_samples >= self.limits.max_waiting_samples:
            waiting, scope = self._waiting_samples, "in all"
        elif self._waiting_by_job[job_id] >= self.limits.max_waiting_samples_per_job:
            waiting, scope = self._waiting_by_job[job_id], f"for job {job_id}"
        else:
            return
        raise ApiError(
            503,
            "too_many_waiting",
            f"{waiting} sample requests are already waiting {scope}",
            retry_after_s=1.0,
        )

    def _raise_if_closing(self) -> None:
        if self._closing:
            # Not the job's end: this coordinator is stopping and will be back.
            raise ApiError(503, "shutting_down", "the coordinator is restarting", retry_after_s=1)

    @property
    def waiting_samples(self) -> int:
        """Sample requests waiting right now (long-polls are counted and bounded)."""
        return self._waiting_samples

    def buffer_stats(self, job_id: str) -> BufferStats:
        with self._changing():
            job = self._job(job_id)
        return job.buffer.stats()

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int:
        with self._changing():
            job = self._running_job(job_id)
            self._check_sender(job_id, update.task_id, "learn", caller)
        try:
            return job.buffer.update_priorities(update.keys, update.priorities)
        except ValueError as exc:
            raise bad_request("priorities", str(exc)) from None

    # --- policies ------------------------------------------------------------------

    def announce_policy(
        self,
        job_id: str,
        ref: PolicyRef,
        *,
        task_id: str | None = None,
        caller: str | None = None,
    ) -> None:
        expected = self.store.policy_path(job_id, ref.version)
        if ref.path != expected:
            raise bad_request("path", f"version {ref.version} must live at '{expected}'")
        if not self.store.resolve(ref.path).is_file():
            raise bad_request("path", f"no file at '{ref.path}'")
        with self._changing():
            job = self._running_job(job_id)
            self._check_sender(job_id, task_id, "learn", caller)
            if job.policy is not None and ref.version <= job.policy.version:
                raise conflict(
                    "stale_version",
                    f"version {ref.version} is not newer than {job.policy.version}",
                )
            job.policy = ref
            job.policy_versions.append(ref.version)
            job.buffer.set_learner_version(ref.version)
            job.train_iters = max(job.train_iters, ref.train_iter)
            self._defer(lambda: self.store.write_json(f"{job_id}/policies/latest.json", dump(ref)))
            self._prune_policies(job)
            max_train_iter = job.config.system.max_train_iter
            if max_train_iter and job.train_iters >= max_train_iter:
                self._finish_at_limit(job, f"max_train_iter {max_train_iter} reached")
            self._notify()

    def _prune_policies(self, job: Job) -> None:
        """Keep the newest versions, the best one and those being evaluated."""
        keep = set(job.policy_versions[-self.limits.keep_policies :])
        if job.best_eval is not None:
            keep.add(job.best_eval.policy_version)
        for task in self.tasks.values():
            if task.job_id == job.job_id and task.kind == "evaluate" and task.state in ACTIVE:
                keep.add(int(task.spec["policy_version"]))
        for version in [v for v in job.policy_versions if v not in keep]:
            path = self.store.policy_path(job.job_id, version)
            self._defer(lambda path=path: self.store.delete(path))
        job.policy_versions = [v for v in job.policy_versions if v in keep]

    def latest_policy(
        self,
        job_id: str,
        *,
        caller: str | None = None,
        newer_than: int | None = None,
        timeout_s: float = 0.0,
    ) -> PolicyRef | None:
        """The job's newest policy version. With `newer_than`, wait up to `timeout_s`
        for a version past it (a collector between rounds waits on this instead of
        polling); past `max_waiting_policy_polls` waiting at once, answer at once."""
        with self._changing():
            job = self._job(job_id)
            if caller is not None and not any(
                self.tasks[t].job_id == job_id for t in self._worker(caller).task_ids
            ):
                raise ApiError(403, "forbidden", f"worker {caller} has no task in job {job_id}")
            if (
                newer_than is not None
                and timeout_s > 0
                and self._waiting_policy_polls < self.limits.max_waiting_policy_polls
            ):
                self._waiting_policy_polls += 1
                try:
                    self._changed.wait_for(
                        lambda: (
                            self._closing
                            or not job.running
                            or (job.policy is not None and job.policy.version > newer_than)
                        ),
                        timeout_s,
                    )
                finally:
                    self._waiting_policy_polls -= 1
            return job.policy

    def _worker(self, worker_id: str) -> Worker:
        worker = self.workers.get(worker_id)
        if worker is None:
            raise ApiError(404, "unknown_worker", f"worker {worker_id} is not registered")
        return worker

    def policy_path(self, job_id: str, version: int | None) -> str:
        """The file of a policy version (the latest by default)."""
        with self._changing():
            job = self._job(job_id)
            if version is None:
                if job.policy is None:
                    raise not_found(f"a policy of job {job_id}")
                version = job.policy.version
        path = self.store.policy_path(job_id, version)
        if not self.store.resolve(path).is_file():
            raise not_found(f"policy version {version} of job {job_id}")
        return path

    # --- scheduling ----------------------------------------------------------------

    def _notify(self) -> None:
        self._dirty = True
        self._changed.notify_all()

    def wait_for_change(self, timeout_s: float) -> None:
        """Block until something the scheduler cares about changed, or `timeout_s`."""
        with self._changed:
            if not self._dirty:
                self._changed.wait(timeout_s)
            self._dirty = False

    def plan(self) -> list[Dispatch]:
        """Decide assignments and cancellations; the caller makes the HTTP calls.

        Each job is planned on its own: an error in one job's planning (bad data that
        slipped through) is logged and undone for that job alone, so it never stops
        the scheduling of the others, nor leaves half-planned tasks behind.
        """
        with self._changing():
            self._pass += 1
            self._expire_leases()
            self._expire_assignments()
            plan, self._cancels = self._cancels, []
            for job in sorted(self.jobs.values(), key=lambda j: j.started_at):
                if not job.running:
                    continue
                before = set(self.tasks)
                try:
                    plan.extend(self._plan_job(job))
                except Exception:
                    log.exception("planning job %s failed; its new tasks are dropped", job.job_id)
                    for task_id in set(self.tasks) - before:
                        self._end_task(self.tasks[task_id], TaskState.LOST)
                if self._clock() - job.last_orphan_sweep_s >= self.limits.orphan_sweep_period_s:
                    job.last_orphan_sweep_s = self._clock()
                    self._defer(
                        lambda job=job: self._sweep_orphans(job, self.limits.orphan_grace_s)
                    )
            try:
                self._sample_metrics()
            except Exception:
                log.exception("sampling metrics failed")
            return plan

    def _expire_assignments(self) -> None:
        """A task whose dispatch never completed (neither taken nor refused) is lost."""
        deadline = self._clock() - self.limits.assigning_timeout_s
        for task in [t for t in self.tasks.values() if t.state == TaskState.ASSIGNING]:
            if task.planned_at_s < deadline:
                log.warning("task %s was never confirmed by its worker", task.task_id)
                self._end_task(task, TaskState.LOST)

    def _plan_job(self, job: Job) -> list[Dispatch]:
        return self._workflow(job.config).plan(job, self)

    # The Planner a workflow uses (services/coordinator/workflows/base.py).

    def free_workers(self, role: str, kind: str) -> list[Worker]:
        now = self._clock()
        return [
            w
            for w in self.workers.values()
            if w.role == role
            and self._can_take(w, now)
            and not any(self.tasks[t].kind == kind for t in w.task_ids)
        ]

    def active_kinds(self, job: Job) -> dict[str, int]:
        return collections.Counter(
            t.kind for t in self.tasks.values() if t.job_id == job.job_id and t.state in ACTIVE
        )

    def role_count(self, role: str) -> int:
        return sum(w.role == role for w in self.workers.values())

    def assign(self, job: Job, worker: Worker, kind: str, spec: Any) -> Dispatch:
        return self._assign(job, worker, kind, spec)

    def seed(self, job: Job) -> int:
        return self._seed(job)

    def finish(self, job: Job, phase: str, reason: str) -> None:
        self._finish(job, phase, reason)

    def defer(self, effect: Callable[[], Any]) -> None:
        self._defer(effect)

    def _can_take(self, worker: Worker, now: float) -> bool:
        """Not backing off, and no assignment of an earlier pass still in flight: a
        worker that does not answer holds at most one pass's dispatches, never the
        scheduler."""
        return worker.not_before_s <= now and not any(
            self.tasks[t].state == TaskState.ASSIGNING
            and self.tasks[t].planned_in_pass < self._pass
            for t in worker.task_ids
        )

    def _seed(self, job: Job) -> int:
        job.tasks_created += 1
        return job.config.system.seed * 100_003 + job.tasks_created

    def _assign(self, job: Job, worker: Worker, kind: str, spec: Any) -> Dispatch:
        task = Task(
            task_id=new_id(kind),
            job_id=job.job_id,
            kind=kind,
            spec=dump(spec),
            worker_id=worker.worker_id,
            planned_at_s=self._clock(),
            planned_in_pass=self._pass,
        )
        self.tasks[task.task_id] = task
        worker.task_ids.add(task.task_id)
        return Dispatch(
            url=worker.url,
            auth=worker.slave_token,
            worker_id=worker.worker_id,
            task=task.assignment(),
        )

    @staticmethod
    def _cancel_dispatch(worker: Worker, task_id: str) -> Dispatch:
        return Dispatch(
            url=worker.url,
            auth=worker.slave_token,
            worker_id=worker.worker_id,
            cancel_task_id=task_id,
        )

    def dispatched(self, task_id: str) -> None:
        with self._changing():
            task = self.tasks.get(task_id)
            if task is not None and task.state == TaskState.ASSIGNING:
                task.state = TaskState.RUNNING
                worker = self.workers.get(task.worker_id)
                if worker is not None:
                    worker.dispatch_failures = 0

    def dispatch_failed(self, task_id: str, error: str) -> None:
        """The slave refused or could not be reached: the task is planned again."""
        with self._changing():
            task = self.tasks.get(task_id)
            if task is None or task.state not in ACTIVE:
                return
            log.warning("could not assign %s to %s: %s", task_id, task.worker_id, error)
            worker = self.workers.get(task.worker_id)
            self._end_task(task, TaskState.LOST)
            if worker is not None:
                worker.dispatch_failures += 1
                if worker.dispatch_failures >= self.limits.max_dispatch_failures:
                    self._drop_worker(
                        worker.worker_id, f"failed {worker.dispatch_failures} assignments"
                    )
                else:
                    # Exponential backoff: a slow worker is asked less and less often.
                    backoff_s = self.limits.dispatch_backoff_s * 2 ** (worker.dispatch_failures - 1)
                    worker.not_before_s = self._clock() + backoff_s

    def _expire_leases(self) -> None:
        deadline = self._clock() - self.limits.lease_timeout_s
        for worker_id in [
            w.worker_id for w in self.workers.values() if w.last_heartbeat_s < deadline
        ]:
            self._drop_worker(worker_id, f"missed heartbeats for {self.limits.lease_timeout_s}s")

    def _sample_metrics(self) -> None:
        now = self._clock()
        if now - self._last_metrics_s < self.limits.metrics_period_s:
            return
        self._last_metrics_s = now
        for job in self.jobs.values():
            if job.phase != "running":
                self._sweep_segments(job)
                continue
            job.buffer.collect_garbage()
            recent = list(job.episode_returns)
            job.metrics.append(
                {
                    "t": round(self._wall(), 3),
                    "env_steps": job.env_steps,
                    "train_iters": job.train_iters,
                    "buffer_size": job.buffer.size,
                    "policy_version": job.policy.version if job.policy else 0,
                    "collect_return_mean": statistics.fmean(recent) if recent else None,
                }
            )
            while len(job.metrics) > self.limits.metrics_points:
                job.metrics.popleft()

    def _sweep_orphans(self, job: Job, grace_s: float) -> int:
        """Index segment files no insert claimed (a collector died between writing and
        inserting, or the coordinator restarted after acknowledging them); delete the
        stale or unreadable ones. Returns how many were indexed.

        Disk work, done without the coordinator's lock; it is taken only to count what
        was indexed."""
        root, indexed = f"{job.job_id}/segments", 0
        for folder in self.store.list_dir(root):
            for name in self.store.list_dir(f"{root}/{folder}"):
                path = f"{root}/{folder}/{name}"
                try:
                    kind = job.buffer.classify(path)
                    if kind == "known" or (kind == "new" and self.store.age_s(path) < grace_s):
                        continue
                    if kind == "new":
                        ref = parse(SegmentRef, self.store.read_segment_header(path))
                        if ref.path != path:
                            raise ValueError(f"header names {ref.path}")
                        self._check_segment_file(job.job_id, ref, "header")
                        result = job.buffer.insert([ref], force=True)
                        with self._changing():
                            self._account(job, result.accepted_refs)
                        indexed += result.accepted
                        continue
                except (ValueError, OSError, CorruptFileError, MessageError, ApiError) as exc:
                    log.warning("segment %s is unusable (%s): deleting it", path, exc)
                except BufferClosed:
                    return indexed
                self.store.delete(path)
        if indexed:
            log.info("job %s: indexed %d segment files found on disk", job.job_id, indexed)
        return indexed

    # --- snapshots -----------------------------------------------------------------

    def snapshot_jobs(self) -> None:
        """Write every running job's state (and each finished job's once)."""
        with self._snapshot_lock:
            with self._changing():
                for job in self.jobs.values():
                    if job.ending is not None and not job.terminal_durable:
                        phase, reason, finished_at = job.ending
                        record = {**self._job_record(job), "phase": phase, "reason": reason}
                        record["finished_at"] = finished_at
                        self._defer(lambda job=job, record=record: self._complete_end(job, record))
                todo = [
                    (job, self._job_record(job))
                    for job in self.jobs.values()
                    if job.phase == "running" or not job.final_snapshot
                ]
            for job, record in todo:
                # Generations only grow, also across restarts: never reuse a file name.
                self._snapshot_gen = max(self._snapshot_gen + 1, int(self._wall() * 1000))
                write_job_snapshot(
                    self.store, job.job_id, record, job.buffer.snapshot(), self._snapshot_gen
                )
                if record["phase"] != "running":
                    job.final_snapshot = True

    def _job_record(self, job: Job) -> dict[str, Any]:
        return {
            "job_id": job.job_id,
            "name": job.name,
            "config": to_dict(job.config),
            "started_at": job.started_at,
            "phase": job.phase,
            "reason": job.reason,
            "finished_at": job.finished_at,
            "env_steps": job.env_steps,
            "train_iters": job.train_iters,
            "policy": as_record(job.policy),
            "policy_versions": list(job.policy_versions),
            "evals": [dump(e) for e in job.evals],
            "best_eval": as_record(job.best_eval),
            "eval_requested_iter": job.eval_requested_iter,
            "tasks_created": job.tasks_created,
            "task_failures": job.task_failures,
            "episode_returns": list(job.episode_returns),
            "metrics": list(job.metrics)[-600:],
            "segments_swept": job.segments_swept,
            "evaluation": list(job.evaluation),
        }

    def restore_jobs(self) -> list[str]:
        """Load every job snapshot under the shared root (at start); returns their ids.

        Running jobs continue: their buffers come back as saved, and segment files the
        snapshot does not know are indexed (or deleted when stale), so nothing that was
        acknowledged is lost and nothing leaks.
        """
        restored = []
        for job_id in self.store.list_dir(""):
            try:
                job = self._restore_job(job_id)
            except (ValueError, KeyError, TypeError, OSError, CorruptFileError) as exc:
                log.error("cannot restore job %s: %s", job_id, exc)
                continue
            if job is None:
                continue
            # The job is not published yet: its disk work needs no lock.
            if job.phase == "running":
                self._recover_policy_pointer(job)
                self._sweep_orphans(job, grace_s=0.0)
            else:
                job.buffer.close()
                job.final_snapshot = job.terminal_durable = True
                self._sweep_segments(job, now=True)
            with self._changing():
                self.jobs[job.job_id] = job
                self._notify()
            restored.append(job.job_id)
            log.info(
                "restored job %s (%s): %d env steps, buffer of %d",
                job.job_id,
                job.phase,
                job.env_steps,
                job.buffer.size,
            )
        return restored

    def _restore_job(self, job_id: str) -> Job | None:
        """A job from its folder: ended if its durable record says so; else as its
        newest snapshot left it; else (a job submitted just before a crash) fresh.
        None for a folder that holds no job."""
        record = read_job_record(self.store, job_id)
        if record is not None and record["phase"] in TERMINAL_PHASES:
            return self._job_from_record(record)
        if self.store.exists(state_path(job_id)):
            snapshot, data, buffer_meta = read_job_snapshot(self.store, job_id)
            job = self._job_from_record(snapshot)
            job.buffer.restore_snapshot(data, buffer_meta)
            return job
        return self._job_from_record(record) if record is not None else None

    def _recover_policy_pointer(self, job: Job) -> None:
        """Point at the newest valid policy file, also one written after the snapshot
        (policy files are immutable and written atomically: a file is a whole version)."""
        folder = f"{job.job_id}/policies"
        current = job.policy.version if job.policy else 0
        versions = sorted(
            (
                int(n.split(".")[0])
                for n in self.store.list_dir(folder)
                if n.endswith(".safetensors") and n.split(".")[0].isdigit()
            ),
            reverse=True,
        )
        for version in (v for v in versions if v > current):
            path = self.store.policy_path(job.job_id, version)
            try:
                data = self.store.read_bytes(path)
                policy = self.store.read_policy(path)
            except (OSError, CorruptFileError) as exc:
                log.warning("policy file %s unusable: %s", path, exc)
                continue
            job.policy = PolicyRef(
                version=version, path=path, sha256=sha256_hex(data), train_iter=policy.train_iter
            )
            job.policy_versions.extend(v for v in sorted(versions) if v > current)
            job.train_iters = max(job.train_iters, policy.train_iter)
            job.buffer.set_learner_version(version)
            log.info("job %s: newest policy on disk is version %d", job.job_id, version)
            return

    def _job_from_record(self, record: dict[str, Any]) -> Job:
        config = from_resolved(record["config"])
        job = Job(
            job_id=record["job_id"],
            name=record["name"],
            config=config,
            buffer=self._new_buffer(record["job_id"], config),
            started_at=float(record["started_at"]),
            phase=record["phase"],
            reason=record["reason"],
            finished_at=record["finished_at"],
            env_steps=int(record["env_steps"]),
            train_iters=int(record["train_iters"]),
            policy=policy_from(record["policy"]),
            policy_versions=[int(v) for v in record["policy_versions"]],
            evals=[parse(EvalSummary, e) for e in record["evals"]],
            best_eval=eval_from(record["best_eval"]),
            eval_requested_iter=int(record["eval_requested_iter"]),
            tasks_created=int(record["tasks_created"]),
            task_failures=int(record["task_failures"]),
            segments_swept=bool(record["segments_swept"]),
        )
        job.episode_returns.extend(record["episode_returns"])
        job.evaluation.extend(record.get("evaluation", []))
        job.metrics.extend(record["metrics"])
        return job

    def _sweep_segments(self, job: Job, *, now: bool = False) -> None:
        """Remove what collectors wrote around the end of a job, once they had time to
        notice it ended (each deletes a segment its insert could not place)."""
        if job.segments_swept or job.finished_at is None or not job.terminal_durable:
            return
        if now or self._wall() - job.finished_at >= self.limits.segment_sweep_delay_s:
            job.segments_swept = True
            self._defer(lambda: self.store.delete_tree(f"{job.job_id}/segments"))

    def begin_shutdown(self) -> None:
        """Stop taking data (answers say: retry later) and wake every waiting request."""
        with self._changing():
            self._closing = True
            for job in self.jobs.values():
                job.buffer.close()
            self._notify()

    def close(self) -> None:
        with self._changing():
            self._closing = True
            for job in self.jobs.values():
                job.buffer.close()
                self._sweep_segments(job, now=True)
            self._notify()
