"""The contract between the coordinator and a workflow."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from common.config import JobConfig, ReplayBufferConfig
from common.messages import EvalResult, TaskSpec

if TYPE_CHECKING:
    from common.storage import SharedStore
    from services.coordinator.state import CoordinatorLimits, Dispatch, Job, Task, TaskState, Worker


class Planner(Protocol):
    """What the coordinator offers a workflow while it holds the coordinator's lock.

    A workflow reads and changes its job's fields, and creates tasks only through
    `assign`, so leases, credentials and dispatching stay the coordinator's.
    """

    store: SharedStore
    limits: CoordinatorLimits

    def free_workers(self, role: str, kind: str) -> list[Worker]:
        """Workers of `role` that can take a task of `kind` now (in a pass: only those
        with the job's device)."""
        ...

    def active_kinds(self, job: Job) -> dict[str, int]:
        """How many of the job's tasks of each kind are assigned or running."""
        ...

    def share(self, job: Job, role: str) -> int:
        """How many workers of `role` the job may hold now: what the share scheduler
        gives it this pass (its `Demand`, its weight and priority, the other jobs'),
        of the workers that have its device."""
        ...

    def assign(self, job: Job, worker: Worker, spec: TaskSpec) -> Dispatch:
        """Create a task of the job for `worker` (of `spec.kind`); the scheduler sends it."""
        ...

    def seed(self, job: Job) -> int:
        """A fresh seed for one of the job's tasks."""
        ...

    def defer(self, effect: Callable[[], Any], *, latest_of: str | None = None) -> None:
        """Run disk work once the coordinator's lock is released (never under it);
        `latest_of`: the file it writes whole, whose newest content counts (kept and
        tried again while the volume is full: services/coordinator/lock.py)."""
        ...


@dataclass(frozen=True)
class Demand:
    """What a running job asks of the cluster's workers; the coordinator divides them
    among the jobs by weight and priority (services/coordinator/shares.py)."""

    #: Collect tasks it runs at most (None: as many as its share gives it).
    collectors: int | None
    #: Its collectors are one set, given all at once or not at all: a round split over
    #: them does not end with fewer (None `collectors`: the set is its share when
    #: first given, kept while it holds any).
    gang: bool = False
    #: It trains on a learner (one learn task at a time; a learner group is one).
    learner: bool = False


@dataclass(frozen=True)
class Outcome:
    """Why a job is done: the phase it ends in, and the reason its status shows."""

    phase: Literal["succeeded", "failed"]
    reason: str
    #: A budget ran out (`system.max_env_step`, `max_train_iter`): the job may first
    #: evaluate its newest policy (`Workflow.final_evaluation`).
    budget: bool = False


class Workflow(Protocol):
    """A kind of job. Usage, by the coordinator::

    workflow.check(config)                     # the config alone: ConfigError when not
    replay = workflow.replay(config)           # the buffer the job gets
    workflow.admit(config, planner)            # at submission: ApiError when not
    job.workflow_state = workflow.new_state(config)   # the job's own state
    demand = workflow.demand(job)              # each pass: the workers it asks for
    dispatches = workflow.plan(job, planner)   # each scheduling pass, within its share
    workflow.evaluated(job, task, result, planner)   # an evaluate task's result
    workflow.task_ended(job, task, state)      # a task failed or was lost
    outcome = workflow.outcome(job)            # after any of the job's counters moved
    workflow.final_evaluation(job, now_s, timeout_s)  # its budget spent: evaluate first?
    record = workflow.record(job.workflow_state)      # snapshots, JSON
    job.workflow_state = workflow.restore(record, config)   # after a restart
    workflow.kept_versions(job)                # policy files it still reads
    workflow.scalars(job)                      # its TensorBoard scalars now

    A workflow never ends a job itself: it says why the job is done (`outcome`), and
    the coordinator's one decision point (`JobBook.settle`) ends it, with the budgets
    and the failure limit. State only the workflow reads lives in its own value
    (`job.workflow_state`), which it creates, records and restores, so a workflow
    with state is still one file and one line in `WORKFLOWS`.
    """

    #: The algorithms' collect units it runs (`Algorithm.collect_unit`).
    collect_units: frozenset[str]
    #: The worker roles its tasks go to: each needs the job's device (a CUDA job is
    #: refused at submission when one of these roles has only CPU workers).
    roles: frozenset[str]
    #: Its tasks insert and sample: a coordinator that runs buffer processes serves the
    #: job's data from one (False: nothing is replayed; its token buffer stays here).
    replays: bool
    #: Its jobs keep a league of opponents in their state (`SelfPlayState.league`),
    #: which `/api/v1/jobs/<id>/league` and its matches serve (False: a 404 there).
    has_league: bool

    def check(self, config: JobConfig) -> None:
        """Refuse (ConfigError naming the field) a config it cannot run, from the
        config alone (so `drover run` says it before starting anything)."""
        ...

    def replay(self, config: JobConfig) -> ReplayBufferConfig:
        """The job's replay buffer settings, from its config."""
        ...

    def admit(self, config: JobConfig, planner: Planner) -> None:
        """Refuse (ApiError 400) what this workflow cannot run on this coordinator."""
        ...

    def demand(self, job: Job) -> Demand:
        """The workers the job asks for now, which the coordinator weighs against the
        other jobs' (`planner.share` then says what it was given)."""
        ...

    def plan(self, job: Job, planner: Planner) -> list[Dispatch]:
        """Assignments for free workers, within the job's share (the coordinator sends
        them)."""
        ...

    def evaluated(self, job: Job, task: Task, result: EvalResult, planner: Planner) -> None:
        """An evaluate task of the job completed with `result`."""
        ...

    def task_ended(self, job: Job, task: Task, state: TaskState) -> None:
        """A task of the job ended `failed`, `lost` or `preempted` (before its result,
        or with a partial one: its worker went to another job)."""
        ...

    def outcome(self, job: Job) -> Outcome | None:
        """Whether the job is done by this workflow's rule (a goal reached, all its
        work done), and why; None while it is not."""
        ...

    def final_evaluation(self, job: Job, now_s: float, timeout_s: float) -> bool:
        """Its budget spent, whether the job waits for one more evaluation, of its
        newest policy version, before it ends (the coordinator then stops its collect
        and learn tasks); False once that evaluation is in, or after `timeout_s` of
        waiting (`now_s`: the coordinator's clock), so a job never waits for ever."""
        ...

    def new_state(self, config: JobConfig) -> Any:
        """A new job's workflow state (None for a workflow that keeps none)."""
        ...

    def record(self, state: Any) -> dict[str, Any]:
        """The state as JSON data, for the job's snapshots and record."""
        ...

    def restore(self, record: dict[str, Any], config: JobConfig) -> Any:
        """The state from `record` (what `record` wrote) for a job of `config`, after
        a restart."""
        ...

    def kept_versions(self, job: Job) -> set[int]:
        """Policy versions whose files the workflow still reads (a league's past
        versions): kept on disk beyond the newest few."""
        ...

    def scalars(self, job: Job) -> dict[str, float]:
        """Its TensorBoard scalars of the job now (tag: value), written with the job's
        metrics points (services/coordinator/tensorboard.py)."""
        ...
