"""Many jobs, one cluster: which jobs run, and how many workers of each role each one
holds. Each scheduling pass (planning.py), under the coordinator's lock:

1. `admit`: past `limits.max_running_jobs`, jobs wait in the queue (phase `queued`),
   higher `system.priority` first, then in the order they came; each knows its place.
2. `divide`: each role's workers are divided among the running jobs
   (shares.py: by `system.share` within a priority, higher priorities first, a sync
   round's collectors as one set), each job's balance moved on, and a job holding
   more than its target has tasks released: told to end at their next safe point (a
   collector at a segment boundary, with what it collected handed in; a learner after
   a checkpoint), so that their workers go to jobs further behind. A released task
   that has not ended after `limits.release_grace_s` is cancelled.
3. Each job's workflow then plans within its target (`JobPlanning.share`), and says
   why it waits where it gets nothing (`Job.waiting`).

Only collect and learn tasks are counted: an evaluation runs beside a collect task on
any collector that has none, and moves no share.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from services.coordinator.devices import can_run
from services.coordinator.shares import Claim, Division, divide, settle_credit, starting_credit
from services.coordinator.state import (
    CoordinatorState,
    Dispatch,
    Job,
    Task,
    TaskState,
    Worker,
)
from services.coordinator.tasks import TaskBoard, cancel_dispatch, release_dispatch
from services.coordinator.workflows import Demand, workflow_of

log = logging.getLogger(__name__)

#: The task kind each shared role runs.
KIND_OF_ROLE = {"collector": "collect", "learner": "learn"}


class Sharing:
    def __init__(
        self, state: CoordinatorState, tasks: TaskBoard, start_running: Callable[[Job], None]
    ) -> None:
        self.state = state
        self.tasks = tasks
        #: Runs a job that leaves the queue (`Admission.start_running`).
        self.start_running = start_running
        #: When the balances were last moved on (monotonic seconds).
        self._last_pass_s: float | None = None

    # --- the queue ---------------------------------------------------------------------

    def admit(self) -> None:
        """Start queued jobs while there is room among the running ones, and number
        the rest."""
        state, limit = self.state, self.state.limits.max_running_jobs
        queue = sorted((j for j in state.jobs.values() if j.queued), key=queue_order)
        running = sum(
            j.running or (j.ending is not None and not j.terminal_durable)
            for j in state.jobs.values()
        )
        # An experiment's jobs past its `parallel` wait for one of its own places.
        places = {
            e.experiment_id: e.parallel
            - sum(j.running for j in state.jobs.values() if j.experiment_id == e.experiment_id)
            for e in state.experiments.values()
            if e.parallel is not None
        }
        for job in list(queue):
            if limit and running >= limit:
                break
            if places.get(job.experiment_id or "", 1) <= 0:
                continue
            queue.remove(job)
            running += 1
            if job.experiment_id in places:
                places[job.experiment_id] -= 1
            self.start_running(job)
        for position, job in enumerate(queue, start=1):
            job.queue_position = position
            experiment = state.experiments.get(job.experiment_id or "")
            if places.get(job.experiment_id or "", 1) <= 0 and experiment is not None:
                job.waiting = (
                    f"queued: its experiment {experiment.experiment_id} runs {experiment.parallel} "
                    "of its jobs at once (sweep.parallel)"
                )
            else:
                job.waiting = (
                    f"queued: {ordinal(position)} of {len(queue)} waiting for one of the "
                    f"{limit} places among running jobs (DROVER_MAX_RUNNING_JOBS)"
                )

    # --- dividing the workers ----------------------------------------------------------

    def divide(self) -> list[Dispatch]:
        """Move every running job's balances on, divide each role's workers, release
        what jobs hold beyond their targets, and cancel releases past their grace.
        Returns the release and cancel calls to send."""
        state = self.state
        now = state.clock()
        dt_s = 0.0 if self._last_pass_s is None else max(0.0, now - self._last_pass_s)
        self._last_pass_s = now
        plan = self._expire_releases(now)
        jobs = sorted((j for j in state.jobs.values() if j.running), key=queue_order)
        demands = {j.job_id: workflow_of(j.config).demand(j) for j in jobs}
        held = self._held(jobs)
        self._start_balances(jobs, held)
        for job in jobs:
            for role in KIND_OF_ROLE:
                share = job.share(role)
                count = len(held[job.job_id][role])
                share.owed_s += dt_s * share.owed
                share.held_s += dt_s * count
                share.credit_s = settle_credit(
                    share.credit_s, share.owed, count, dt_s, self._slack_s(role)
                )
                share.held = count
        learners = self._divide_role("learner", jobs, demands, held)
        collectors = self._divide_role("collector", jobs, demands, held, learners)
        for job in jobs:
            job.waiting = self._why_waiting(job, demands[job.job_id], learners, collectors)
            for role in KIND_OF_ROLE:
                whole = role == "collector" and demands[job.job_id].gang
                plan += self._release_excess(job, role, held[job.job_id][role], whole=whole)
            if not held[job.job_id]["collector"] and job.share("collector").target == 0:
                job.gang_size = None  # its next round's set is sized anew
        return plan

    def _start_balances(self, jobs: list[Job], held: dict[str, dict[str, list[Task]]]) -> None:
        """A job that starts running (submitted, or out of the queue) starts level with
        the others: for collectors with the one furthest behind (it is given some at
        once), for learners with the holder furthest ahead (it waits its turn)."""
        for role in KIND_OF_ROLE:
            fresh = [j for j in jobs if j.share(role).fresh]
            if not fresh:
                continue
            others = [j for j in jobs if not j.share(role).fresh]
            if role == "learner":
                others = [j for j in others if held[j.job_id]["learner"]]
            credit = starting_credit(
                (j.share(role).credit_s for j in others), served_first=role == "collector"
            )
            for job in fresh:
                job.share(role).credit_s, job.share(role).fresh = credit, False

    def _slack_s(self, role: str) -> float:
        limits = self.state.limits
        return limits.learner_slack_s if role == "learner" else limits.collector_slack_s

    def _held(self, jobs: list[Job]) -> dict[str, dict[str, list[Task]]]:
        """Each job's active collect and learn tasks (released ones included)."""
        held: dict[str, dict[str, list[Task]]] = {
            j.job_id: {role: [] for role in KIND_OF_ROLE} for j in jobs
        }
        roles = {kind: role for role, kind in KIND_OF_ROLE.items()}
        for task in self.state.tasks.values():
            role = roles.get(task.kind)
            if role is not None and task.job_id in held:
                held[task.job_id][role].append(task)
        for tasks in held.values():
            for role_tasks in tasks.values():
                role_tasks.sort(key=lambda t: t.planned_at_s)
        return held

    def _divide_role(
        self,
        role: str,
        jobs: list[Job],
        demands: dict[str, Demand],
        held: dict[str, dict[str, list[Task]]],
        learners: Division | None = None,
    ) -> Division:
        """Divide the registered workers of `role` among `jobs`; each job's share
        gets its owed fraction and its target."""
        workers = [w for w in self.state.workers.values() if w.role == role]
        claims = [
            self._claim(job, role, demands[job.job_id], workers, held, learners) for job in jobs
        ]
        slack_s = self._slack_s(role)
        if any(c.want < 0 for c in claims):
            # A round's set of collectors not sized yet is its whole share of them, as
            # if it were a job like the others.
            alike = [dataclasses.replace(c, want=abs(c.want), gang=False) for c in claims]
            owed = divide(alike, len(workers), slack_s).owed
            claims = [
                c if c.want >= 0 else sized(c, math.floor(owed[c.job_id] + 1e-6)) for c in claims
            ]
        division = divide(claims, len(workers), slack_s)
        for job, claim in zip(jobs, claims, strict=True):
            share = job.share(role)
            share.owed, share.target = division.owed[job.job_id], division.target[job.job_id]
            if role == "collector" and claim.gang and share.target:
                job.gang_size = share.target
        return division

    def _claim(
        self,
        job: Job,
        role: str,
        demand: Demand,
        workers: list[Worker],
        held: dict[str, dict[str, list[Task]]],
        learners: Division | None,
    ) -> Claim:
        fitting = sum(can_run(w, job.config) for w in workers)
        tasks = held[job.job_id][role]
        share = job.share(role)
        standby = gang = False
        if role == "learner":
            want = 1 if demand.learner and fitting else 0
        else:
            # A job that could train on a learner but is given none now has nobody to
            # collect for: it keeps or gets collectors only where no other job wants
            # them (with no learner registered at all, each job waits alike).
            standby = (
                learners is not None
                and job.job_id in learners.owed
                and learners.owed[job.job_id] > 0
                and learners.target[job.job_id] == 0
                and all(t.release_by_s is not None for t in held[job.job_id]["learner"])
            )
            gang = demand.gang
            if demand.collectors == 0:
                want = 0
            elif gang:
                size = demand.collectors or job.gang_size
                # Negative: not sized yet (`_divide_role` sizes it at most `fitting`).
                want = size if size is not None else -fitting
                if size is not None and size > fitting:
                    want = 0  # can never run here: its reason says so
            else:
                want = min(demand.collectors or fitting, fitting)
        return Claim(
            job_id=job.job_id,
            priority=job.config.system.priority,
            weight=job.config.system.share,
            want=want,
            gang=gang,
            standby=standby,
            held=sum(t.release_by_s is None for t in tasks),
            credit_s=share.credit_s,
            order=queue_order(job),
        )

    def _release_excess(
        self, job: Job, role: str, tasks: list[Task], *, whole: bool
    ) -> list[Dispatch]:
        """Release the job's newest tasks of the role beyond its target (`whole`: all
        of them, a round's set: a part of it cannot finish a round)."""
        share = job.share(role)
        kept = [t for t in tasks if t.release_by_s is None]
        excess = len(kept) - share.target
        if excess <= 0:
            return []
        if whole:
            excess = len(kept)
        plan = []
        for task in kept[-excess:]:
            plan += self.release(task)
        return plan

    def release(self, task: Task) -> list[Dispatch]:
        """Tell the task's worker to end it at its next safe point (a task not yet
        confirmed by its worker is simply cancelled)."""
        worker = self.state.workers.get(task.worker_id)
        job = self.state.jobs.get(task.job_id)
        if job is not None:
            job.tasks_preempted += 1
        self.state.metrics.tasks_released.labels(task.kind).inc()
        if task.state == TaskState.ASSIGNING or worker is None:
            self.tasks.end(task, TaskState.PREEMPTED)
            return [cancel_dispatch(worker, task.task_id)] if worker is not None else []
        task.release_by_s = self.state.clock() + self.state.limits.release_grace_s
        log.info(
            "releasing %s task %s of job %s on %s: its worker goes to another job",
            task.kind,
            task.task_id,
            task.job_id,
            task.worker_id,
        )
        return [release_dispatch(worker, task.task_id)]

    def _expire_releases(self, now: float) -> list[Dispatch]:
        """Cancel released tasks that did not end within their grace."""
        plan = []
        for task in list(self.state.tasks.values()):
            if task.release_by_s is not None and now > task.release_by_s:
                log.warning(
                    "released task %s did not end within %.0f s; cancelled",
                    task.task_id,
                    self.state.limits.release_grace_s,
                )
                worker = self.state.workers.get(task.worker_id)
                self.tasks.end(task, TaskState.PREEMPTED)
                if worker is not None:
                    plan.append(cancel_dispatch(worker, task.task_id))
        return plan

    # --- saying why ----------------------------------------------------------------------

    def _why_waiting(
        self, job: Job, demand: Demand, learners: Division, collectors: Division
    ) -> str:
        """Why the job gets no learner, or no collector ("" when it has what it needs).
        A device the job needs and nobody has (devices.py) is said by the caller."""
        learner, collector = job.share("learner"), job.share("collector")
        if demand.learner and learner.target == 0 and learner.held == 0:
            return "waiting for a learner: " + self._contention(job, "learner", learners)
        if demand.collectors == 0 or collector.target > 0 or collector.held > 0:
            return ""
        size = demand.collectors or job.gang_size
        fitting = sum(
            w.role == "collector" and can_run(w, job.config) for w in self.state.workers.values()
        )
        if demand.gang and size is not None and size > fitting:
            return (
                f"waiting for {size} collectors at once (system.collector_num: its sync "
                f"rounds are split over them); {fitting} registered can run it"
            )
        what = f"{size} collectors at once for a sync round" if demand.gang else "a collector"
        return f"waiting for {what}: " + self._contention(job, "collector", collectors)

    def _contention(self, job: Job, role: str, division: Division) -> str:
        """Who holds the role's workers: higher-priority jobs, or its equals (its turn
        comes as its balance grows)."""
        priority = job.config.system.priority
        holders = [
            j
            for j in self.state.jobs.values()
            if j.running and j is not job and division.target.get(j.job_id, 0) > 0
        ]
        above = sorted({j.job_id for j in holders if j.config.system.priority > priority})
        count = sum(w.role == role for w in self.state.workers.values())
        if not count:
            return f"no {role} is registered"
        if above:
            return (
                f"jobs of a higher priority hold them ({', '.join(above[:3])}"
                f"{', ...' if len(above) > 3 else ''})"
            )
        share = job.share(role)
        return (
            f"{len(holders) + 1} jobs of priority {priority} share {count} {role}s; "
            f"owed {share.owed:.2f}, its turn comes as its balance grows "
            f"({share.credit_s:+.1f} {role}-seconds)"
        )


def queue_order(job: Job) -> tuple[float, float, str]:
    """Higher priority first, then the order jobs were submitted in."""
    return (-job.config.system.priority, job.started_at, job.job_id)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def sized(claim: Claim, size: int) -> Claim:
    """A round's claim for a set of `size` collectors (at least one)."""
    return dataclasses.replace(claim, want=max(1, size))
