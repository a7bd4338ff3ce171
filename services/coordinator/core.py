"""The coordinator: jobs, workers and their leases, tasks, the replay buffers, the
policy pointer, and each job's workflow. No Flask, no sockets.

`Coordinator` is a facade over parts that share one `CoordinatorState` behind one
lock (lock.py): what changes state does so in memory under the lock, and the disk
work it needs runs once the lock is let go.

    state.py        jobs, workers, tasks (TaskState), limits: plain data
    jobs.py         admission, phases and the durable end, status, metrics
    experiments.py  the jobs of one config's sweep, together
    tasks.py        creating and ending tasks
    workers.py      registration, credentials, leases, dispatch health
    policies.py     the policy pointer and which versions stay on disk
    data.py         inserts, samples, priorities, orphaned segment files
    planning.py     scheduling passes and task results: asks the job's workflow
    persistence.py  snapshots and restore (file layout: snapshot.py)

The scheduler thread (scheduler.py) asks `plan()` what to assign and reports back
with `dispatched()` / `dispatch_failed()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from common.errors import conflict
from common.http import Caller
from common.messages import (
    BufferStats,
    CheckpointList,
    ExperimentCreated,
    ExperimentList,
    ExperimentStatus,
    ExperimentSubmit,
    GameResults,
    Heartbeat,
    HeartbeatReply,
    JobCreated,
    JobList,
    JobMetrics,
    JobStatus,
    JobSubmit,
    LeagueView,
    MatchDraw,
    MatchList,
    PolicyRef,
    Registered,
    WorkerInfo,
    WorkerRegistration,
)
from common.metrics import service_registry
from common.storage import SharedStore
from services.buffer.checks import InsertSlot
from services.coordinator.admission import Admission
from services.coordinator.buffers import BufferProcesses, BufferProcessSettings
from services.coordinator.data import DataPlane
from services.coordinator.experiments import ExperimentBook
from services.coordinator.job_views import MAX_PAGE, JobViews
from services.coordinator.jobs import JobBook
from services.coordinator.matches import MatchDesk
from services.coordinator.metrics import CoordinatorMetrics, JobGauges
from services.coordinator.persistence import Persistence
from services.coordinator.planning import Planning
from services.coordinator.policies import PolicyPointer
from services.coordinator.reserve import RESERVE_NAME, RoomReserve
from services.coordinator.shard_runs import ShardRunner
from services.coordinator.state import (
    ACTIVE,
    CoordinatorLimits,
    CoordinatorState,
    Dispatch,
    Job,
    Task,
    TaskState,
    Worker,
    must_be,
)
from services.coordinator.tasks import TaskBoard
from services.coordinator.workers import WorkerRegistry

__all__ = [
    "ACTIVE",
    "Coordinator",
    "CoordinatorLimits",
    "Dispatch",
    "Job",
    "Task",
    "TaskState",
    "Worker",
]


#: The coordinator's limits each buffer process keeps for its job (by the variable of
#: the same name: services/buffer/settings.py).
SHARD_LIMITS = (
    "max_concurrent_inserts",
    "max_waiting_samples_per_job",
    "max_waiting_inserts",
    "orphan_grace_s",
    "credential_ttl_s",
)


def shard_limits_env(limits: CoordinatorLimits) -> dict[str, str]:
    """The variables that give a buffer process this coordinator's `SHARD_LIMITS`."""
    return {f"DROVER_{name.upper()}": str(getattr(limits, name)) for name in SHARD_LIMITS}


class Coordinator:
    """Jobs, workers, tasks. Thread-safe: every public method takes the lock."""

    def __init__(
        self,
        store: SharedStore,
        limits: CoordinatorLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        metrics: CollectorRegistry | None = None,
        buffers: BufferProcessSettings,
        buffer_runner: ShardRunner | None = None,
    ) -> None:
        """`metrics`: the registry to count in (a fresh `service_registry()` when None);
        `buffers`: how each job's buffer runs in processes of its own (buffers.py);
        `buffer_runner`: what starts them (processes when None; a test's may serve
        them in threads of this interpreter)."""
        limits = limits or CoordinatorLimits()
        self.state = CoordinatorState(
            store=store,
            limits=limits,
            buffers=BufferProcesses(
                dataclasses.replace(
                    buffers, passed_env={**shard_limits_env(limits), **buffers.passed_env}
                ),
                # Bound late: the parts they call are made below.
                on_report=lambda job_id, read: self.data.count_report(job_id, read),
                on_failed=lambda job_id, why: self.job_book.buffer_failed(job_id, why),
                runner=buffer_runner,
            ),
            clock=clock,
            wall=wall_clock,
            metrics=CoordinatorMetrics(metrics if metrics is not None else service_registry()),
        )
        self.tasks_board = TaskBoard(self.state)
        self.job_book = JobBook(self.state, self.tasks_board)
        self.admission = Admission(self.state, self.job_book)
        self.job_views = JobViews(self.state, self.job_book)
        self.registry = WorkerRegistry(self.state, self.tasks_board, self.job_book)
        self.policies = PolicyPointer(self.state, self.job_book, self.tasks_board, self.registry)
        self.data = DataPlane(self.state, self.job_book)
        self.planning = Planning(
            self.state,
            self.job_book,
            self.admission,
            self.job_views,
            self.tasks_board,
            self.registry,
        )
        self.persistence = Persistence(
            self.state, self.job_book, self.admission, self.job_views, self.policies
        )
        self.matches = MatchDesk(self.state, self.job_book, self.tasks_board)
        self.experiment_book = ExperimentBook(
            self.state, self.job_book, self.admission, self.job_views
        )
        self.metrics.registry.register(JobGauges(self._gauge_values))
        Gauge(
            "drover_state_writes_waiting_for_room",
            "The coordinator's pointer and record writes kept for want of room on the "
            "shared volume (tried again every snapshot period)",
            registry=self.metrics.registry,
        ).set_function(lambda: self.state.guard.latest.kept)
        if self.limits.record_reserve_bytes > 0:
            self.state.reserve = RoomReserve(
                store.root / RESERVE_NAME, self.limits.record_reserve_bytes
            )
            self.state.reserve.keep()

    # What tests and the app read directly.

    @property
    def store(self) -> SharedStore:
        return self.state.store

    @property
    def limits(self) -> CoordinatorLimits:
        return self.state.limits

    @property
    def jobs(self) -> dict[str, Job]:
        return self.state.jobs

    @property
    def workers(self) -> dict[str, Worker]:
        return self.state.workers

    @property
    def tasks(self) -> dict[str, Task]:
        return self.state.tasks

    @property
    def metrics(self) -> CoordinatorMetrics:
        return self.state.metrics

    @property
    def _lock(self) -> Any:
        return self.state.guard.lock

    # --- jobs ------------------------------------------------------------------------

    def submit_job(self, submit: JobSubmit) -> JobCreated:
        return self.admission.submit(submit, self.planning)

    def stop_job(self, job_id: str) -> JobStatus:
        self.job_book.stop(job_id)
        return self.job_views.status(job_id)  # its end, on disk now

    def submit_experiment(self, submit: ExperimentSubmit) -> ExperimentCreated:
        return self.experiment_book.submit(submit, self.planning)

    def experiment_status(self, experiment_id: str) -> ExperimentStatus:
        return self.experiment_book.status(experiment_id)

    def list_experiments(
        self, *, limit: int = MAX_PAGE, page_token: str | None = None
    ) -> ExperimentList:
        return self.experiment_book.listing(limit=limit, page_token=page_token)

    def stop_experiment(self, experiment_id: str) -> ExperimentStatus:
        return self.experiment_book.stop(experiment_id)

    def job_status(self, job_id: str, *, wait_s: float = 0.0) -> JobStatus:
        return self.job_views.status(job_id, wait_s=wait_s)

    def list_jobs(
        self, *, phase: str | None = None, limit: int = MAX_PAGE, page_token: str | None = None
    ) -> JobList:
        return self.job_views.listing(phase=phase, limit=limit, page_token=page_token)

    def job_metrics(self, job_id: str) -> JobMetrics:
        return self.job_views.metrics(job_id)

    def buffer_sizes(self) -> dict[str, int]:
        return self.job_views.buffer_sizes()

    def _gauge_values(self) -> tuple[list[JobStatus], dict[str, int], int]:
        """What the per-job gauges show at a scrape."""
        return self.list_jobs().jobs, self.buffer_sizes(), len(self.list_workers())

    # --- self-play leagues -----------------------------------------------------------

    def league(self, job_id: str) -> LeagueView:
        return self.matches.view(job_id)

    def draw_matches(self, job_id: str, draw: MatchDraw, *, caller: str | None = None) -> MatchList:
        return self.matches.draw(job_id, draw, caller=caller)

    def report_games(self, job_id: str, results: GameResults, *, caller: str | None = None) -> None:
        self.matches.report(job_id, results, caller=caller)

    # --- workers ---------------------------------------------------------------------

    def register_worker(self, reg: WorkerRegistration) -> Registered:
        return self.registry.register(reg)

    def worker_for_credential(self, credential: str) -> Caller | None:
        return self.registry.for_credential(credential)

    def heartbeat(
        self, worker_id: str, beat: Heartbeat, *, caller: str | None = None
    ) -> HeartbeatReply:
        return self.registry.heartbeat(worker_id, beat, caller=caller)

    def leave(self, worker_id: str, *, caller: str | None = None) -> None:
        self.registry.leave(worker_id, caller=caller)

    def list_workers(self) -> list[WorkerInfo]:
        return self.registry.listing()

    def task_state(self, task_id: str) -> TaskState | None:
        """A task's state, ended ones included while they are remembered."""
        with self.state.guard.changing():
            return self.tasks_board.state_of(task_id)

    # --- tasks -----------------------------------------------------------------------

    def complete_task(
        self, task_id: str, result: dict[str, Any], *, caller: str | None = None
    ) -> None:
        self.planning.complete_task(task_id, result, caller=caller)

    def fail_task(self, task_id: str, error: str, *, caller: str | None = None) -> None:
        self.planning.fail_task(task_id, error, caller=caller)

    # --- data plane ------------------------------------------------------------------

    def buffer_stats(self, job_id: str) -> BufferStats:
        return self.job_views.buffer_stats(job_id)

    # --- policies --------------------------------------------------------------------

    def announce_policy(
        self, job_id: str, ref: PolicyRef, *, task_id: str | None = None, caller: str | None = None
    ) -> None:
        self.policies.announce(job_id, ref, task_id=task_id, caller=caller)

    def latest_policy(
        self,
        job_id: str,
        *,
        caller: str | None = None,
        newer_than: int | None = None,
        timeout_s: float = 0.0,
    ) -> PolicyRef | None:
        return self.policies.latest(
            job_id, caller=caller, newer_than=newer_than, timeout_s=timeout_s
        )

    def policy_path(self, job_id: str, version: int | None) -> str:
        return self.policies.path(job_id, version)

    def checkpoints(self, job_id: str) -> CheckpointList:
        return CheckpointList(names=self.policies.checkpoints(job_id))

    def checkpoint_path(self, job_id: str, name: str) -> str:
        return self.policies.checkpoint_path(job_id, name)

    def video_path(self, job_id: str, name: str) -> str:
        return self.policies.video_path(job_id, name)

    # --- scheduling ------------------------------------------------------------------

    def plan(self) -> list[Dispatch]:
        return self.planning.plan()

    def wait_for_change(self, timeout_s: float) -> None:
        self.state.guard.wait_for_change(timeout_s)

    def dispatched(self, task_id: str) -> None:
        self.registry.dispatched(task_id)

    def dispatch_failed(self, task_id: str, error: str) -> None:
        self.registry.dispatch_failed(task_id, error)

    # --- snapshots and shutdown ------------------------------------------------------

    def snapshot_jobs(self) -> dict[str, tuple[float, float]]:
        return self.persistence.snapshot_jobs()

    def restore_jobs(self) -> list[str]:
        # Experiments first: their jobs' places in the queue depend on them.
        self.experiment_book.restore()
        restored = self.persistence.restore_jobs()
        # Their tunings go on once their jobs are back (a trial cut short is failed).
        self.experiment_book.start_tunings(self.planning)
        return restored

    def begin_shutdown(self) -> None:
        """Pass no more data requests on (answers say: retry later) and wake every
        waiting request. Buffer processes take data until they are stopped, snapshot
        last (`close`)."""
        with self.state.guard.changing():
            self.state.closing = True
            self.state.guard.notify()

    def close(self) -> None:
        self.experiment_book.close()  # no trial is started or ended from here on
        with self.state.guard.changing():
            self.state.closing = True
            for job in self.state.jobs.values():
                self.job_book.sweep_segments(job, now=True)
            self.state.guard.notify()
        self.job_book.boards.close_all()
        self.state.buffers.close()  # each writes its last snapshot
        if self.state.reserve is not None:
            # Not left behind in a run folder: a coordinator that starts takes it again.
            self.state.reserve.release()

    def check_task_owner(self, job_id: str, task_id: str | None, caller: str) -> None:
        with self.state.guard.changing():
            task = self.state.tasks.get(task_id or "")
            if task is not None and task.job_id == job_id:
                must_be(caller, task.worker_id, f"act for task {task.task_id}")

    def insert_slot(self) -> InsertSlot:
        return self.data.insert_slot()

    def sample_slot(self) -> contextlib.AbstractContextManager[None]:
        return self.data.sample_slot()

    @property
    def waiting_samples(self) -> int:
        """Sample requests passed on to buffer processes and not answered yet."""
        return self.data.waiting_samples

    def data_urls(self, job_id: str) -> list[str]:
        """Where the coordinator reaches the job's buffer processes, one a shard.

        Raises:
            ApiError: 404 for no such job; 409 when it ended, waits in the queue or
                replays nothing; 503 while the coordinator stops.
        """
        with self.state.guard.changing():
            job = self.job_book.running(job_id)
            if job.replay is None:
                raise conflict("no_buffer", f"job {job_id} replays nothing: it has no buffer")
            return [shard.control.base_url for shard in job.replay.shards]
