"""The coordinator's state: jobs, workers and tasks as plain dataclasses, the limits
one coordinator enforces, and `CoordinatorState`, which the coordinator's parts
(jobs.py, tasks.py, workers.py, policies.py, data.py, planning.py, snapshots.py)
share. Nothing here does I/O.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry

from common.config import JobConfig
from common.errors import ApiError
from common.messages import (
    BufferStats,
    EvalSummary,
    MetricsPoint,
    PolicyRef,
    PopulationStep,
    TaskAssignment,
    TaskKind,
    TaskSpec,
)
from common.storage import SharedStore
from jobconfig.population import Population
from services.coordinator.buffers import BufferProcesses
from services.coordinator.lock import ChangeLock
from services.coordinator.metrics import CoordinatorMetrics
from services.coordinator.remote_buffer import BufferProcess
from services.coordinator.reserve import RoomReserve


class TaskState(StrEnum):
    """A task's life: planned, confirmed by its worker, then ended one way."""

    ASSIGNING = "assigning"  # planned; the scheduler is sending it
    RUNNING = "running"  # its worker took it (or reports it)
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # its job ended
    LOST = "lost"  # its worker went away, or never took it: it is planned again
    #: Released so that its worker goes to another job (shares.py): it ended at a
    #: safe point, what it did handed in (or, past `release_grace_s`, was cancelled).
    PREEMPTED = "preempted"


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
    #: A segment file no insert has claimed for this long is indexed by its buffer
    #: process (or deleted when stale or unreadable): what a collector killed between
    #: write and insert leaves.
    orphan_grace_s: float = 30.0
    #: A worker that refused or missed an assignment gets none for this long, twice
    #: as long for each further one in a row (a worker that lost tasks the same) ...
    dispatch_backoff_s: float = 1.0
    #: ... up to this long.
    max_backoff_s: float = 300.0
    #: A confirmed task missing from this many heartbeats in a row of its worker is
    #: lost: the worker took it and does not run it (one missing beat can be a beat
    #: sent before the task started).
    unreported_beats_lost: int = 2
    #: A training job shows, in its status and a metric, that its evaluations stall
    #: when this many `eval_freq`s of train iterations went by without one.
    eval_stall_periods: int = 3
    #: Sample requests (long-polls) the coordinator passes on to buffer processes at
    #: once, each holding one of its threads; more are answered 503 at once, so slow or
    #: many clients can never hold every server thread ...
    max_waiting_samples: int = 16
    #: ... and long-polls one job's buffer process lets wait at once, so one job's
    #: empty buffer cannot starve the learners of the others.
    max_waiting_samples_per_job: int = 4
    #: Segment inserts a buffer process indexes at once (and the coordinator passes on
    #: at once); more are answered 429 `busy` (a short, jittered Retry-After), so a
    #: fleet that offers more than one core can index waits at its collectors instead
    #: of in the server's queue, where learners' samples would wait behind it. Lower
    #: favours samples, higher favours inserts; 0: no bound.
    max_concurrent_inserts: int = 4
    #: Inserts one job's buffer lets wait at once for its rate limiter (each holds a
    #: server thread until the learner samples); more are answered 429 `rate_limited`
    #: at once and retried by their collectors. Kept below the server's threads, so a
    #: learner's sample, the request that lets them go, always finds one; 0: no bound.
    max_waiting_inserts: int = 6
    #: Jobs one experiment may expand to; a sweep over it is refused (400 naming
    #: `sweep`) before anything is expanded.
    max_experiment_jobs: int = 1000
    #: How long a job whose budget is spent waits for its final evaluation
    #: (`policy.eval.evaluator.final_eval`) before it ends without it.
    final_eval_timeout_s: float = 300.0
    #: Collectors waiting at once for a newer policy version (each holds a server
    #: thread); past it they are answered at once and poll instead.
    max_waiting_policy_polls: int = 8
    #: Clients waiting at once for a job's end (`GET /jobs/<id>?wait_s=`), each on a
    #: server thread; past it they are answered at once.
    max_waiting_job_polls: int = 8
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
    metrics_points: int = 3600
    #: An ended job is forgotten (by this coordinator; its folder stays) this long
    #: after it ended (`DROVER_ENDED_JOB_RETENTION`: seconds, or 90m, 12h, 7d).
    ended_job_retention_s: float = 7 * 24 * 3600.0
    #: ... and, past this many ended jobs, the oldest ended ones go first.
    max_ended_jobs: int = 1000
    #: Ended tasks remembered (so a late message for one is told it ended, not that
    #: it never existed); older ones are forgotten.
    ended_tasks_kept: int = 10_000
    #: Jobs running at once; the rest wait in the queue, higher priority first, then in
    #: the order they came (0: no limit).
    max_running_jobs: int = 0
    #: How far (in collector-seconds) a job may run ahead of its fair share before one of
    #: its collectors moves to a job further behind: lower moves collectors sooner and
    #: more often (each move ends a collect task at a segment boundary).
    collector_slack_s: float = 2.0
    #: The same for learners, which move only where there are fewer than running jobs:
    #: a move ends a learn task at a checkpoint, and the job resumes from it later.
    learner_slack_s: float = 60.0
    #: A task released for another job ends by itself at its next safe point; one that
    #: has not ended this long after is cancelled.
    release_grace_s: float = 15.0
    #: Bytes of the shared volume kept for the coordinator's records (reserve.py), so
    #: that a job's end is recorded on a volume that stays full (0: none kept).
    record_reserve_bytes: int = 16 << 20
    #: How long a buffer process accepts a task credential after it was signed; each
    #: heartbeat of the task's worker brings a fresh one (services/buffer/credentials.py).
    credential_ttl_s: float = 120.0


@dataclass
class Task:
    task_id: str
    job_id: str
    spec: TaskSpec
    worker_id: str
    state: TaskState = TaskState.ASSIGNING
    planned_at_s: float = 0.0
    #: The scheduling pass that planned it.
    planned_in_pass: int = 0
    #: Set when it is released so that its worker goes to another job: it is cancelled
    #: if it has not ended by then (monotonic seconds).
    release_by_s: float | None = None
    #: Heartbeats in a row from its worker that did not list it, once confirmed: a
    #: worker that took the task and does not run it (`WorkerRegistry.heartbeat`).
    unreported_beats: int = 0

    @property
    def kind(self) -> TaskKind:
        return self.spec.kind

    def assignment(self) -> TaskAssignment:
        return TaskAssignment(task_id=self.task_id, job_id=self.job_id, spec=self.spec)


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
    #: Tasks in a row it lost: never confirmed, or confirmed and then not reported in
    #: its heartbeats (a stuck task runner, a broken env, a bad node). Each holds it
    #: back twice as long as the one before; a task it hands in clears it.
    lost_tasks: int = 0
    progress: dict[str, dict[str, float]] = field(default_factory=dict)

    def hold_back(self, now_s: float, strikes: int, limits: CoordinatorLimits) -> float:
        """No new task for `dispatch_backoff_s` doubled for each strike after the first,
        up to `max_backoff_s`: a worker that keeps failing is asked less and less often
        (never a retry storm), and asked again (it may have been a blip). Returns the
        seconds it is held back."""
        held_s = min(limits.max_backoff_s, limits.dispatch_backoff_s * 2 ** max(0, strikes - 1))
        self.not_before_s = now_s + held_s
        return held_s


@dataclass(frozen=True)
class EndedTask:
    """What is remembered of a task that ended (the task itself is let go)."""

    job_id: str
    kind: TaskKind
    worker_id: str
    state: TaskState


@dataclass
class Share:
    """A job's share of one role's workers, kept by the scheduling passes
    (services/coordinator/shares.py)."""

    #: Workers it is owed now (a fraction), and may hold after this pass.
    owed: float = 0.0
    target: int = 0
    #: Workers it holds now (tasks being released included).
    held: int = 0
    #: Worker-seconds owed and held while it ran, and its balance (owed minus held,
    #: bounded): who is furthest behind gets the next worker.
    owed_s: float = 0.0
    held_s: float = 0.0
    credit_s: float = 0.0
    #: Its balance is not set yet: it is, level with the others', at its first pass.
    fresh: bool = True

    def record(self) -> dict[str, float]:
        return {"owed_s": self.owed_s, "held_s": self.held_s, "credit_s": self.credit_s}

    @classmethod
    def restore(cls, record: dict[str, Any]) -> Share:
        return cls(
            owed_s=float(record.get("owed_s", 0.0)),
            held_s=float(record.get("held_s", 0.0)),
            credit_s=float(record.get("credit_s", 0.0)),
            fresh=False,
        )


@dataclass
class RoomWait:
    """A running job whose writes find the shared volume full (its tasks say so in
    their heartbeats: common/storage_full.py). Times are the coordinator's clock."""

    #: Since when it has made no progress for want of room.
    since_s: float
    #: Its env steps then: any more is progress, and the wait starts again.
    env_steps: int
    #: When a task last said it waits (a wait no task has spoken of for a lease's time
    #: is over).
    seen_s: float


@dataclass
class ExperimentJob:
    """A job of an experiment: its point of the sweep, or its trial of the tuning."""

    job_id: str
    #: The sweep's axis values (or the trial's parameters) of the job, by dotted key.
    values: dict[str, Any]
    seed: int
    #: A tuning's: the trial's number, how it ended (None: running; complete, pruned,
    #: failed) and its objective (a complete one's).
    trial: int | None = None
    trial_state: str | None = None
    objective: float | None = None


@dataclass
class Experiment:
    """Jobs submitted together from one config's sweep (jobconfig/sweep.py), or made
    one by one by its tuning's study (services/coordinator/tuning.py)."""

    experiment_id: str
    name: str
    created_at: float
    #: At most this many of its jobs run at once (None: as the cluster allows).
    parallel: int | None
    jobs: list[ExperimentJob]
    stopped: bool = False
    #: Population-based training over its jobs (None: they train each on its own).
    population: Population | None = None
    #: Its population's steps, oldest first.
    lineage: list[PopulationStep] = field(default_factory=list)
    #: Each member's evaluations counted at its last population step or ranking.
    ranked_at_evals: dict[str, int] = field(default_factory=dict)
    #: A tuning's config as it was submitted, its `tune:` section with it (None: a
    #: sweep), and whether its study ran its trials.
    tune_config: dict[str, Any] | None = None
    tuning_done: bool = False


@dataclass
class Job:
    job_id: str
    name: str
    config: JobConfig
    #: The job's buffer while it runs, served by its processes (buffers.py); None for
    #: a job that replays nothing (an evaluation), one that waits in the queue, and
    #: once the job ended and released it (what it held at the end is `final_buffer`).
    replay: BufferProcess | None
    #: When it was submitted (wall time).
    started_at: float
    #: Why its end could not be recorded yet ("": it could, or it has not ended): its
    #: end is shown meanwhile, said to be not yet recorded, and written when it can.
    unrecorded: str = ""
    phase: str = "running"
    #: When it began to run, past any wait in the queue (wall time; None: queued).
    running_since: float | None = None
    reason: str = ""
    #: Why a running job gets no tasks (no worker with its device), shown as its
    #: status's reason while it runs; set each scheduling pass, never saved.
    waiting: str = ""
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
    #: The job's workflow's own state (`Workflow.new_state`): only it reads it, and it
    #: records and restores it; None once the job ended.
    workflow_state: Any = None
    #: Segment files a learner reported unusable (their rows were skipped).
    unusable_segments: set[str] = field(default_factory=set)
    evals: list[EvalSummary] = field(default_factory=list)
    best_eval: EvalSummary | None = None
    tasks_created: int = 0
    #: Its writes waiting for room on the shared volume (None: they have room).
    room_wait: RoomWait | None = None
    #: The experiment it is a job of (None: submitted alone).
    experiment_id: str | None = None
    #: The newest learn lease's epoch (`LearnSpec.epoch`): a learn task's writes with
    #: an older one are refused (docs/architecture.md, "Fencing").
    learner_epoch: int = 0
    task_failures: int = 0
    #: The last failed task's error (the job's reason if failures end it).
    last_task_error: str = ""
    #: Tasks whose worker was lost (left, or its lease expired): their work went back
    #: to the queue for another worker.
    tasks_reassigned: int = 0
    episode_returns: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=100)
    )
    metrics: collections.deque[MetricsPoint] = field(default_factory=collections.deque)
    #: The buffer's statistics when the job ended (kept in its record).
    final_buffer: BufferStats | None = None
    #: Its share of each role's workers ("collector", "learner").
    shares: dict[str, Share] = field(default_factory=dict)
    #: Collectors a sync round is split over, fixed while it holds any (None: not
    #: decided; decided when its round's collectors are first given).
    gang_size: int | None = None
    #: Tasks of its released so that their worker went to another job.
    tasks_preempted: int = 0
    #: A queued job's place in the queue (1: next), set each scheduling pass.
    queue_position: int | None = None
    #: Why no learn task may start now (""): a population step copying a checkpoint
    #: in (services/coordinator/population.py); never saved.
    learn_hold: str = ""
    #: Why its evaluations stall (""): set each scheduling pass by its workflow once
    #: `eval_stall_periods` eval_freqs of train iterations went by without one; shown
    #: beside `waiting`; never saved.
    eval_stall: str = ""
    #: Its config as JSON data, for the config it was made of (jobs.py
    #: `config_record`): made once, not at every snapshot.
    config_record: tuple[JobConfig, dict[str, Any]] | None = None

    @property
    def running(self) -> bool:
        """Takes data and tasks: running, and not ending."""
        return self.phase == "running" and self.ending is None

    @property
    def queued(self) -> bool:
        """Waits in the coordinator's queue for a place among the running jobs."""
        return self.phase == "queued" and self.ending is None

    def share(self, role: str) -> Share:
        return self.shares.setdefault(role, Share())


@dataclass(frozen=True)
class Dispatch:
    """One call the scheduler must make to a slave."""

    url: str
    #: The worker's own secret for its routes (never the cluster token).
    auth: str
    worker_id: str
    task: TaskAssignment | None = None  # assign this task
    cancel_task_id: str | None = None  # or cancel this one
    release_task_id: str | None = None  # or release this one (end it at a safe point)


@dataclass
class CoordinatorState:
    """What every part of the coordinator reads and changes, under `guard`."""

    store: SharedStore
    limits: CoordinatorLimits
    #: The buffer processes serving the jobs' data.
    buffers: BufferProcesses
    #: Monotonic time (leases, timeouts) and wall time (what is shown and saved).
    clock: Callable[[], float]
    wall: Callable[[], float]
    guard: ChangeLock = field(default_factory=ChangeLock)
    jobs: dict[str, Job] = field(default_factory=dict)
    experiments: dict[str, Experiment] = field(default_factory=dict)
    workers: dict[str, Worker] = field(default_factory=dict)
    #: Tasks assigned or running; an ended task leaves for `ended_tasks`.
    tasks: dict[str, Task] = field(default_factory=dict)
    #: The last `limits.ended_tasks_kept` tasks that ended, oldest first.
    ended_tasks: collections.OrderedDict[str, EndedTask] = field(
        default_factory=collections.OrderedDict
    )
    #: Cancellations the next scheduling pass sends.
    cancels: list[Dispatch] = field(default_factory=list)
    #: The coordinator is stopping: requests are answered "retry later".
    closing: bool = False
    #: Scheduling passes so far.
    passes: int = 0
    #: What is counted for Prometheus (the app serves its registry at `/metrics`).
    metrics: CoordinatorMetrics = field(
        default_factory=lambda: CoordinatorMetrics(CollectorRegistry())
    )
    #: Held while a job's record is written: the snapshot thread's running record of a
    #: job never lands after (and over) the record of its end.
    record_writes: threading.Lock = field(default_factory=threading.Lock)
    #: Room kept on the shared volume for job records (reserve.py; None: none kept).
    reserve: RoomReserve | None = None


def must_be(caller: str | None, worker_id: str, what: str) -> None:
    """A worker acting by its own credential may act only as itself."""
    if caller is not None and caller != worker_id:
        raise ApiError(403, "forbidden", f"worker {caller} may not {what} of {worker_id}")


def raise_if_closing(state: CoordinatorState) -> None:
    if state.closing:
        # Not the job's end: this coordinator is stopping and will be back.
        raise ApiError(503, "shutting_down", "the coordinator is restarting", retry_after_s=1)
