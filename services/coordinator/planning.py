"""Where the coordinator asks each job's workflow what to do: every scheduling pass
(`plan`) and whenever a task reports its result or its failure. `Planning` is the
`Planner` a workflow sees (services/coordinator/workflows/base.py); in a pass, each
job's workflow sees it through `JobPlanning`, which offers only the workers that have
the job's device, and no more of them than the job's share (sharing.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from common.errors import bad_request
from common.messages import EvalResult, MessageError, TaskSpec, parse
from common.ranks import learner_ranks
from common.storage import SharedStore
from services.coordinator.admission import Admission
from services.coordinator.devices import can_run, waiting_reason
from services.coordinator.experiments import forget_old_experiments
from services.coordinator.job_views import JobViews
from services.coordinator.jobs import JobBook
from services.coordinator.population import PopulationTraining
from services.coordinator.sharing import KIND_OF_ROLE, Sharing
from services.coordinator.state import (
    CoordinatorLimits,
    CoordinatorState,
    Dispatch,
    Job,
    TaskState,
    Worker,
    must_be,
)
from services.coordinator.tasks import TaskBoard
from services.coordinator.workers import WorkerRegistry
from services.coordinator.workflows import workflow_of

log = logging.getLogger(__name__)


class Planning:
    def __init__(
        self,
        state: CoordinatorState,
        jobs: JobBook,
        admission: Admission,
        views: JobViews,
        tasks: TaskBoard,
        workers: WorkerRegistry,
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.admission = admission
        self.views = views
        self.tasks = tasks
        self.workers = workers
        self.sharing = Sharing(state, tasks, admission.start_running)
        self.population = PopulationTraining(state, tasks)
        self._last_metrics_s = float("-inf")

    # --- the Planner a workflow uses ---------------------------------------------------

    @property
    def store(self) -> SharedStore:
        return self.state.store

    @property
    def limits(self) -> CoordinatorLimits:
        return self.state.limits

    def free_workers(self, role: str, kind: str) -> list[Worker]:
        return self.workers.free(role, kind)

    def active_kinds(self, job: Job) -> dict[str, int]:
        return self.tasks.active_kinds(job)

    def share(self, job: Job, role: str) -> int:
        return job.share(role).target

    def assign(self, job: Job, worker: Worker, spec: TaskSpec) -> Dispatch:
        if not can_run(worker, job.config):
            # A workflow that picked its worker some other way than `free_workers`:
            # the task would only fail there (this job's planning is undone).
            raise ValueError(f"{worker.worker_id} lacks the device job {job.job_id} runs on")
        return self.tasks.create(job, worker, spec)

    def seed(self, job: Job) -> int:
        job.tasks_created += 1
        return job.config.system.seed * 100_003 + job.tasks_created

    def defer(self, effect: Callable[[], Any], *, latest_of: str | None = None) -> None:
        self.state.guard.defer(effect, latest_of=latest_of)

    # --- each pass -------------------------------------------------------------------

    def plan(self) -> list[Dispatch]:
        """Decide assignments and cancellations; the caller makes the HTTP calls.

        Each job is planned on its own: an error in one job's planning (bad data that
        slipped through) is logged and undone for that job alone, so it never stops
        the scheduling of the others, nor leaves half-planned tasks behind.
        """
        state, limits = self.state, self.state.limits
        with state.guard.changing():
            state.passes += 1
            self.workers.expire_leases()
            self.workers.expire_assignments()
            plan, state.cancels = state.cancels, []
            self.sharing.admit()
            plan.extend(self.sharing.divide())
            for job in sorted(state.jobs.values(), key=lambda j: j.started_at):
                # A counter restored from disk (a newer policy found there) may have
                # reached a budget: settled before the job gets more work.
                self.jobs.settle(job)
                if not job.running:
                    continue
                before = set(state.tasks)
                try:
                    plan.extend(self.plan_job(job))
                except Exception:
                    log.exception("planning job %s failed; its new tasks are dropped", job.job_id)
                    for task_id in set(state.tasks) - before:
                        self.tasks.end(state.tasks[task_id], TaskState.LOST)
            if state.clock() - self._last_metrics_s >= limits.metrics_period_s:
                self._last_metrics_s = state.clock()
                try:
                    self.views.sample_metrics()
                    self.views.forget_old()
                    forget_old_experiments(state)
                except Exception:
                    log.exception("sampling metrics failed")
            return plan

    def plan_job(self, job: Job) -> list[Dispatch]:
        if job.replay is not None and not job.replay.ready:
            # Its tasks go out once its buffer process answers (within a second or two).
            job.waiting = "waiting for its buffer process to start"
            return []
        workflow = workflow_of(job.config)
        # A device nobody has says more than a share not given (sharing.py's reason).
        device = waiting_reason(job.config, workflow.roles, self.state.workers.values())
        job.waiting = device or job.learn_hold or job.waiting
        return workflow.plan(job, JobPlanning(self, job))

    # --- task results ----------------------------------------------------------------

    def complete_task(
        self, task_id: str, result: dict[str, Any], *, caller: str | None = None
    ) -> None:
        with self.state.guard.changing():
            task = self.tasks.active(task_id)
            must_be(caller, task.worker_id, f"report on task {task_id}")
            job = self.state.jobs[task.job_id]
            outcome = None
            if task.kind == "evaluate":
                try:
                    outcome = parse(EvalResult, result)
                except MessageError as exc:
                    raise bad_request(f"result.{exc.field}", exc.message) from None
            # A released task ends at a safe point with what it did handed in.
            released = task.release_by_s is not None
            self.tasks.end(task, TaskState.PREEMPTED if released else TaskState.DONE)
            worker = self.state.workers.get(task.worker_id)
            if worker is not None:
                worker.lost_tasks = 0  # it runs what it takes
            if outcome is not None:
                workflow_of(job.config).evaluated(job, task, outcome, self)
                self.jobs.settle(job)
                self.population.evaluated(job)

    def fail_task(self, task_id: str, error: str, *, caller: str | None = None) -> None:
        with self.state.guard.changing():
            task = self.tasks.active(task_id)
            must_be(caller, task.worker_id, f"report on task {task_id}")
            job = self.state.jobs[task.job_id]
            self.tasks.end(task, TaskState.FAILED)
            job.task_failures += 1
            job.last_task_error = error[:500]
            log.warning("task %s (%s) of job %s failed: %s", task_id, task.kind, job.job_id, error)
            self.jobs.settle(job)


class JobPlanning:
    """The `Planner` one job's workflow sees in a scheduling pass: only the workers
    that have the job's device are offered and counted (a CUDA job sees only workers
    that report CUDA devices), so such a job waits for a fitting worker instead of
    failing its tasks on one without; collectors the job cannot use do not count
    toward its share of a round either."""

    def __init__(self, planning: Planning, job: Job) -> None:
        self._planning = planning
        self._job = job

    @property
    def store(self) -> SharedStore:
        return self._planning.store

    @property
    def limits(self) -> CoordinatorLimits:
        return self._planning.limits

    def free_workers(self, role: str, kind: str) -> list[Worker]:
        """Free workers with the job's device; for the tasks its share counts (collect,
        learn), no more than its target lets it add, and a round's set whole or not at
        all."""
        job, config = self._job, self._job.config
        if role == "learner" and job.learn_hold:
            return []  # a population step is copying its checkpoint in (population.py)
        workers = [w for w in self._planning.free_workers(role, kind) if can_run(w, config)]
        if role == "learner" and config.policy.learn.multi_gpu:
            # A data-parallel job goes to the biggest learner group first.
            workers.sort(key=lambda w: -learner_ranks(w.resources))
        if kind == "evaluate":
            # Idle collectors first, then the job's own: an evaluation beside another
            # job's collect task would slow that job down for this one's sake.
            own = {t.worker_id for t in self._planning.tasks.of_job(job)}
            workers.sort(key=lambda w: (len(w.task_ids), w.worker_id not in own))
        if KIND_OF_ROLE.get(role) != kind:
            return workers
        share = job.share(role)
        held = sum(
            t.kind == kind and t.release_by_s is None for t in self._planning.tasks.of_job(job)
        )
        room = max(0, share.target - held)
        gang = role == "collector" and workflow_of(config).demand(job).gang
        if gang and len(workers) < room:
            return []  # the set waits whole: a part of it could not finish a round
        return workers[:room]

    def active_kinds(self, job: Job) -> dict[str, int]:
        return self._planning.active_kinds(job)

    def share(self, job: Job, role: str) -> int:
        return self._planning.share(job, role)

    def assign(self, job: Job, worker: Worker, spec: TaskSpec) -> Dispatch:
        return self._planning.assign(job, worker, spec)

    def seed(self, job: Job) -> int:
        return self._planning.seed(job)

    def defer(self, effect: Callable[[], Any], *, latest_of: str | None = None) -> None:
        self._planning.defer(effect, latest_of=latest_of)
