"""Tasks: created for a worker, confirmed, ended one way (`TaskState`).

A task that ends without its result gives its job's held replay items back and tells
its job's workflow (which may plan it again).
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from common.errors import bad_request, conflict, not_found
from common.messages import CollectSpec, DataAccess, LearnSpec, TaskSpec, new_id
from services.coordinator.remote_buffer import BufferProcess
from services.coordinator.state import (
    CoordinatorState,
    Dispatch,
    EndedTask,
    Job,
    Task,
    TaskState,
    Worker,
    must_be,
)
from services.coordinator.workflows import workflow_of

log = logging.getLogger(__name__)


class TaskBoard:
    def __init__(self, state: CoordinatorState) -> None:
        self.state = state

    def active(self, task_id: str) -> Task:
        """The task, which must still be assigned or running."""
        task = self.state.tasks.get(task_id)
        if task is None:
            ended = self.state.ended_tasks.get(task_id)
            if ended is None:
                raise not_found(f"task {task_id}")
            # A late message for a task that was reassigned or ended: refuse it, so
            # nothing is counted twice.
            raise conflict("task_not_active", f"task {task_id} is {ended.state}")
        return task

    def is_active(self, task_id: str | None) -> bool:
        return (task_id or "") in self.state.tasks

    def state_of(self, task_id: str) -> TaskState | None:
        """A task's state, ended ones included (None: unknown, or long forgotten)."""
        task = self.state.tasks.get(task_id)
        if task is not None:
            return task.state
        ended = self.state.ended_tasks.get(task_id)
        return ended.state if ended is not None else None

    def check_sender(
        self, job_id: str, task_id: str | None, kind: str, caller: str | None = None
    ) -> None:
        """Refuse a message sent for a task that is no longer this worker's to run."""
        if task_id is None:
            if caller is not None:
                raise bad_request("task_id", f"a worker sends the {kind} task it acts for")
            return
        task = self.state.tasks.get(task_id)
        facts = task or self.state.ended_tasks.get(task_id)
        if facts is None or facts.job_id != job_id or facts.kind != kind:
            raise conflict("task_not_active", f"{kind} task {task_id} is not a task of {job_id}")
        if task is None:
            raise conflict("task_not_active", f"task {task_id} is {facts.state}")
        must_be(caller, task.worker_id, f"act for task {task_id}")

    def end(self, task: Task, state: TaskState) -> None:
        """End an active task: it leaves the task map (its facts stay in its job's
        counts, and in the bounded memory of ended tasks)."""
        job = self.state.jobs.get(task.job_id)
        buffer = job.replay if job is not None and job.running else None
        if buffer is not None and task.kind in ("collect", "learn"):
            # The job's buffer processes refuse the task's credential from now on, and
            # give back what a learn task held (an ending job's buffer takes and gives
            # nothing more: it has nobody to give them to).
            buffer.task_ended(task.task_id)
        if state in (TaskState.FAILED, TaskState.LOST, TaskState.PREEMPTED) and job is not None:
            workflow_of(job.config).task_ended(job, task, state)
            if state == TaskState.LOST:
                job.tasks_reassigned += 1
        task.state = state
        self.state.metrics.tasks_ended.labels(task.kind, state.value).inc()
        worker = self.state.workers.get(task.worker_id)
        if worker is not None:
            worker.task_ids.discard(task.task_id)
            worker.progress.pop(task.task_id, None)
        self.state.tasks.pop(task.task_id, None)
        ended = self.state.ended_tasks
        ended[task.task_id] = EndedTask(task.job_id, task.kind, task.worker_id, state)
        while len(ended) > self.state.limits.ended_tasks_kept:
            ended.popitem(last=False)
        self.state.guard.notify()

    def cancel_job_tasks(self, job: Job, kind: str | None = None) -> None:
        """Cancel the job's tasks (of `kind`); their workers are told on the next pass."""
        for task in self.of_job(job, kind):
            worker = self.state.workers.get(task.worker_id)
            self.end(task, TaskState.CANCELLED)
            if worker is not None:
                self.state.cancels.append(cancel_dispatch(worker, task.task_id))

    def of_job(self, job: Job, kind: str | None = None) -> list[Task]:
        """The job's active tasks (of `kind`)."""
        return [
            t
            for t in self.state.tasks.values()
            if t.job_id == job.job_id and kind in (None, t.kind)
        ]

    def active_kinds(self, job: Job) -> dict[str, int]:
        return collections.Counter(t.kind for t in self.of_job(job))

    def create(self, job: Job, worker: Worker, spec: TaskSpec) -> Dispatch:
        task_id = new_id(spec.kind)
        if isinstance(spec, LearnSpec):
            # A new lease: its writes fence off those of every learner before it.
            job.learner_epoch += 1
            spec = dataclasses.replace(spec, epoch=job.learner_epoch)
        if job.replay is not None and isinstance(spec, CollectSpec | LearnSpec):
            # Its data goes to the job's buffer process, with a credential for it alone.
            spec = dataclasses.replace(
                spec, data=data_access(job.replay, task_id, worker.worker_id, spec)
            )
        task = Task(
            task_id=task_id,
            job_id=job.job_id,
            spec=spec,
            worker_id=worker.worker_id,
            planned_at_s=self.state.clock(),
            planned_in_pass=self.state.passes,
        )
        self.state.tasks[task.task_id] = task
        self.state.metrics.tasks_assigned.labels(spec.kind).inc()
        worker.task_ids.add(task.task_id)
        return Dispatch(
            url=worker.url,
            auth=worker.slave_token,
            worker_id=worker.worker_id,
            task=task.assignment(),
        )


def data_access(
    buffer: BufferProcess, task_id: str, worker_id: str, spec: CollectSpec | LearnSpec
) -> DataAccess:
    """Where a task's data goes at its job's buffer processes, with its credential
    signed now (a learn task's under its lease epoch): at its creation, and anew at
    each heartbeat of its worker (credentials expire)."""
    epoch = spec.epoch if isinstance(spec, LearnSpec) else 0
    return buffer.access(task_id, worker_id, spec.kind, epoch)


def cancel_dispatch(worker: Worker, task_id: str) -> Dispatch:
    """The call that stops the worker's task now."""
    return _worker_call(worker, cancel_task_id=task_id)


def release_dispatch(worker: Worker, task_id: str) -> Dispatch:
    """The call that has the worker end its task at the next safe point."""
    return _worker_call(worker, release_task_id=task_id)


def _worker_call(worker: Worker, **what: str) -> Dispatch:
    return Dispatch(url=worker.url, auth=worker.slave_token, worker_id=worker.worker_id, **what)
