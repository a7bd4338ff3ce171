"""Workers: registration and credentials, heartbeats and leases, and how well they
take their assignments (a worker that does not answer is asked less often, then
dropped)."""

from __future__ import annotations

import hmac
import logging
import secrets

from common.errors import ApiError, not_found
from common.http import Caller
from common.messages import (
    CollectSpec,
    Heartbeat,
    HeartbeatReply,
    LearnSpec,
    Registered,
    WorkerInfo,
    WorkerRegistration,
    new_id,
)
from common.storage_full import ROOM_WAIT_KEY
from services.coordinator.jobs import JobBook
from services.coordinator.state import CoordinatorState, Task, TaskState, Worker, must_be
from services.coordinator.tasks import TaskBoard, data_access
from services.coordinator.urls import check_worker_url

log = logging.getLogger(__name__)


class WorkerRegistry:
    def __init__(self, state: CoordinatorState, tasks: TaskBoard, jobs: JobBook) -> None:
        self.state = state
        self.tasks = tasks
        #: Heartbeats report a learner's train iterations: counted there; a count that
        #: ends the job wakes the scheduler, whose pass ends it (`heartbeat`).
        self.jobs = jobs
        #: When leases were last checked (`expire_leases`, each scheduling pass).
        self._checked_s: float | None = None

    def register(self, reg: WorkerRegistration) -> Registered:
        limits = self.state.limits
        worker = Worker(
            worker_id=new_id(reg.role),
            role=reg.role,
            url=check_worker_url(reg.url, limits.worker_hosts),
            resources=reg.resources,
            last_heartbeat_s=self.state.clock(),
            secret=secrets.token_urlsafe(32),
            slave_token=reg.slave_token,
        )
        with self.state.guard.changing():
            if len(self.state.workers) >= limits.max_workers:
                raise ApiError(
                    503,
                    "too_many_workers",
                    f"this coordinator has its limit of {limits.max_workers} workers",
                    retry_after_s=limits.lease_timeout_s,
                )
            self.state.workers[worker.worker_id] = worker
            self.state.guard.notify()
        log.info("worker %s registered at %s", worker.worker_id, worker.url)
        return Registered(
            worker_id=worker.worker_id,
            heartbeat_interval_s=limits.heartbeat_interval_s,
            lease_timeout_s=limits.lease_timeout_s,
            credential=f"{worker.worker_id}.{worker.secret}",
        )

    def for_credential(self, credential: str) -> Caller | None:
        """The worker a credential belongs to (None if it is no live worker's)."""
        worker_id, _, secret = credential.rpartition(".")
        with self.state.guard.changing():
            worker = self.state.workers.get(worker_id)
        if worker is None or not hmac.compare_digest(secret.encode(), worker.secret.encode()):
            return None
        return Caller("worker", worker_id=worker_id, role=worker.role)

    def get(self, worker_id: str) -> Worker:
        worker = self.state.workers.get(worker_id)
        if worker is None:
            raise ApiError(404, "unknown_worker", f"worker {worker_id} is not registered")
        return worker

    def heartbeat(
        self, worker_id: str, beat: Heartbeat, *, caller: str | None = None
    ) -> HeartbeatReply:
        """Renew the worker's lease; answers which of its tasks it must stop, and which
        it must end at their next safe point (released: told again at each beat, in
        case the scheduler's call did not reach it)."""
        must_be(caller, worker_id, "send the heartbeats")
        with self.state.guard.changing():
            worker = self.get(worker_id)
            worker.last_heartbeat_s = self.state.clock()
            cancel, release, credentials = [], [], {}
            self._count_unreported(worker, {report.task_id for report in beat.tasks})
            for report in beat.tasks:
                task = self.state.tasks.get(report.task_id)
                if task is None or task.worker_id != worker_id:
                    cancel.append(report.task_id)
                    continue
                if task.release_by_s is not None:
                    release.append(task.task_id)
                credential = self._fresh_credential(task)
                if credential is not None:
                    credentials[task.task_id] = credential
                task.state = TaskState.RUNNING
                task.unreported_beats = 0
                worker.progress[task.task_id] = dict(report.progress)
                job = self.state.jobs[task.job_id]
                if len(job.unusable_segments) < 1000:
                    job.unusable_segments.update(report.unusable_segments)
                waited_s = report.progress.get(ROOM_WAIT_KEY)
                if waited_s is not None:
                    self.jobs.note_no_room(job, float(waited_s))
                train_iter = report.progress.get("train_iter")
                # Only the job's learner counts training; the number is a report, not
                # a budget a collector could spend.
                if task.kind == "learn" and train_iter is not None:
                    self.jobs.count_train_iters(job, int(train_iter))
                    # Not settled here: a job's end writes its record and summary
                    # (fsync'd) before the call that ended it is answered, and a
                    # heartbeat's answer must never wait on the disk (its worker's
                    # lease would run out on a slow volume). The scheduler's pass,
                    # woken now, ends the job in its own thread.
                    if self.jobs.verdict(job) is not None:
                        self.state.guard.notify()
            return HeartbeatReply(cancel=cancel, release=release, credentials=credentials)

    def _fresh_credential(self, task: Task) -> str | None:
        """The task's buffer credential signed anew (None: a task that moves no data,
        or of a job that no longer runs)."""
        job = self.state.jobs.get(task.job_id)
        buffer = job.replay if job is not None and job.running else None
        if buffer is None or not isinstance(task.spec, CollectSpec | LearnSpec):
            return None
        return data_access(buffer, task.task_id, task.worker_id, task.spec).credential

    def _count_unreported(self, worker: Worker, reported: set[str]) -> None:
        """A task its worker confirmed and no longer lists in its heartbeats is lost
        (it accepted the task and does not run it): planned again, on another worker
        while this one is held back. Without this, a collector that accepts
        evaluations and never runs them would be idle, and so first in line for every
        evaluation of the job, which would then never have one."""
        limits = self.state.limits
        for task_id in sorted(worker.task_ids - reported):
            task = self.state.tasks[task_id]
            if task.state != TaskState.RUNNING:
                continue  # still being assigned: expire_assignments' to judge
            task.unreported_beats += 1
            if task.unreported_beats >= limits.unreported_beats_lost:
                self.lost(worker, task, f"missing from {task.unreported_beats} heartbeats")

    def lost(self, worker: Worker, task: Task, why: str) -> None:
        """The worker lost its task: planned again, and the worker held back."""
        self.tasks.end(task, TaskState.LOST)
        worker.lost_tasks += 1
        held_s = worker.hold_back(self.state.clock(), worker.lost_tasks, self.state.limits)
        self.state.metrics.tasks_lost_by_worker.labels(task.kind).inc()
        log.warning(
            "%s task %s of %s lost by %s (%s): planned again; %s held back %.0f s "
            "(%d lost in a row)",
            task.kind,
            task.task_id,
            task.job_id,
            worker.worker_id,
            why,
            worker.worker_id,
            held_s,
            worker.lost_tasks,
        )

    def leave(self, worker_id: str, *, caller: str | None = None) -> None:
        must_be(caller, worker_id, "end the registration")
        with self.state.guard.changing():
            if worker_id not in self.state.workers:
                raise not_found(f"worker {worker_id}")
            self.drop(worker_id, "left")

    def drop(self, worker_id: str, why: str) -> None:
        worker = self.state.workers.pop(worker_id)
        for task_id in list(worker.task_ids):
            self.tasks.end(self.state.tasks[task_id], TaskState.LOST)
        log.info("worker %s %s; its tasks go back to the queue", worker_id, why)
        self.state.guard.notify()

    def expire_leases(self) -> None:
        """Drop the workers whose heartbeats stopped for `lease_timeout_s`.

        A coordinator that was stalled itself (its container paused, its machine
        starved or suspended: passes far apart) heard nobody meanwhile, so it cannot
        tell a silent worker from its own deafness: every lease is extended by the
        stall, and workers that are truly gone expire a lease later."""
        timeout_s, now = self.state.limits.lease_timeout_s, self.state.clock()
        stalled_s = 0.0 if self._checked_s is None else now - self._checked_s
        self._checked_s = now
        if stalled_s > timeout_s / 2:
            log.warning(
                "the coordinator was stalled for %.1f s (paused or starved): every lease is "
                "extended by as much",
                stalled_s,
            )
            for worker in self.state.workers.values():
                worker.last_heartbeat_s = min(now, worker.last_heartbeat_s + stalled_s)
        deadline = now - timeout_s
        for worker in [w for w in self.state.workers.values() if w.last_heartbeat_s < deadline]:
            self.state.metrics.lease_expiries.labels(worker.role).inc()
            self.drop(worker.worker_id, f"missed heartbeats for {timeout_s}s")

    def listing(self) -> list[WorkerInfo]:
        now = self.state.clock()
        with self.state.guard.changing():
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
                    resources=dict(w.resources),
                    jobs={t: self.state.tasks[t].job_id for t in w.task_ids},
                    held_back_s=round(max(0.0, w.not_before_s - now), 1),
                    lost_tasks=w.lost_tasks,
                )
                for w in self.state.workers.values()
            ]

    # --- taking assignments --------------------------------------------------------

    def free(self, role: str, kind: str) -> list[Worker]:
        """Workers of `role` that can take a task of `kind` now."""
        now = self.state.clock()
        return [
            w
            for w in self.state.workers.values()
            if w.role == role
            and self._can_take(w, now)
            and not any(self.state.tasks[t].kind == kind for t in w.task_ids)
        ]

    def _can_take(self, worker: Worker, now: float) -> bool:
        """Not backing off, and no assignment of an earlier pass still in flight: a
        worker that does not answer holds at most one pass's dispatches, never the
        scheduler."""
        return worker.not_before_s <= now and not any(
            self.state.tasks[t].state == TaskState.ASSIGNING
            and self.state.tasks[t].planned_in_pass < self.state.passes
            for t in worker.task_ids
        )

    def dispatched(self, task_id: str) -> None:
        with self.state.guard.changing():
            task = self.state.tasks.get(task_id)
            if task is not None and task.state == TaskState.ASSIGNING:
                task.state = TaskState.RUNNING
                worker = self.state.workers.get(task.worker_id)
                if worker is not None:
                    worker.dispatch_failures = 0

    def dispatch_failed(self, task_id: str, error: str) -> None:
        """The slave refused or could not be reached: the task is planned again."""
        limits = self.state.limits
        with self.state.guard.changing():
            task = self.state.tasks.get(task_id)
            if task is None:
                return
            log.warning("could not assign %s to %s: %s", task_id, task.worker_id, error)
            worker = self.state.workers.get(task.worker_id)
            self.tasks.end(task, TaskState.LOST)
            if worker is None:
                return
            worker.dispatch_failures += 1
            if worker.dispatch_failures >= limits.max_dispatch_failures:
                self.drop(worker.worker_id, f"failed {worker.dispatch_failures} assignments")
            else:
                worker.hold_back(self.state.clock(), worker.dispatch_failures, limits)

    def expire_assignments(self) -> None:
        """A task whose dispatch never completed (neither taken nor refused) is lost,
        and its worker held back."""
        deadline = self.state.clock() - self.state.limits.assigning_timeout_s
        for task in [t for t in self.state.tasks.values() if t.state == TaskState.ASSIGNING]:
            if task.planned_at_s < deadline:
                worker = self.state.workers.get(task.worker_id)
                if worker is None:
                    self.tasks.end(task, TaskState.LOST)
                else:
                    self.lost(worker, task, "never confirmed")
