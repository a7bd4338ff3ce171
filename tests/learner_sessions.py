"""A learner's session against a coordinator double that takes announcements of one
learn lease epoch only: what the fencing and population-based training tests resume
and publish with (tests/unit/test_fencing.py, tests/unit/test_population.py)."""

from prometheus_client import CollectorRegistry

from algorithms.dqn.learner import DQN
from common.errors import ApiError
from common.messages import LearnSpec, TaskAssignment
from common.storage import SharedStore
from jobconfig import resolve_job_config, with_spaces
from services.learner.resume import resume
from services.learner.sessions import BatchSession
from services.slave.core import TaskContext

JOB = "job-1"


class Coordinator:
    """Takes announcements of `epoch` only, as the coordinator does for the lease."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.announced = []

    def announce_policy(self, job_id, ref, *, task_id=None):
        if ref.epoch != self.epoch:
            raise ApiError(409, "task_not_active", f"task {task_id} is lost")
        self.announced.append(ref)

    def latest_policy(self, job_id, **_):
        return self.announced[-1] if self.announced else None


def context(coordinator: Coordinator, epoch: int) -> TaskContext:
    """A learn task of lease `epoch` of JOB, its coordinator the double."""
    return TaskContext(
        task=TaskAssignment(
            task_id=f"learn-{epoch}", job_id=JOB, spec=LearnSpec(seed=0, epoch=epoch)
        ),
        worker_id=f"learner-{epoch}",
        coordinator=coordinator,  # type: ignore[arg-type]
        data=coordinator,  # type: ignore[arg-type]
        metrics=CollectorRegistry(),
    )


def session(store: SharedStore, coordinator: Coordinator, epoch: int) -> BatchSession:
    """A DQN learner's session of lease `epoch`, resumed as a learn task starts."""
    config, _ = resolve_job_config({"policy": {"type": "dqn"}})
    config = with_spaces(config, 4, 2)
    ctx = context(coordinator, epoch)
    learner = DQN(config.policy)
    resumed = resume(store, JOB, "dqn", learner, ctx)
    return BatchSession(ctx, config, store, learner, resumed.version)
