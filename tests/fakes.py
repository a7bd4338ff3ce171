"""Test doubles: a fake coordinator client for slaves, a controllable task runner, a
collect task's context, a segment-file sink. (Waiting: `tests.helpers.wait_until`.)"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from common.messages import CollectSpec, HeartbeatReply, Registered, TaskAssignment
from services.slave.core import TaskContext


class CollectTaskContext(TaskContext):
    """A collect task's context, as a SegmentUploader or a collect loop sees it: the
    task, a coordinator client, and its stop signals."""

    def __init__(self, coordinator: Any) -> None:
        super().__init__(
            task=TaskAssignment(
                task_id="collect-1", job_id="job-1", spec=CollectSpec(seed=0, num_envs=1)
            ),
            worker_id="collector-1",
            coordinator=coordinator,
            data=coordinator,
            metrics=CollectorRegistry(),
        )


class FakeCoordinator:
    """Records what a slave tells the coordinator."""

    def __init__(self) -> None:
        self.completed: list[tuple[str, dict]] = []
        self.failed: list[tuple[str, str]] = []
        self.left: list[str] = []
        self.cancel_next: list[str] = []
        self.release_next: list[str] = []
        #: Fresh buffer credentials the next heartbeat answer carries, by task id.
        self.credentials_next: dict[str, str] = {}
        self.credential: str | None = None
        self.timeout_s = 5.0
        #: Where a task's data calls would go without a data access of its own (nowhere
        #: here: these tests' runners make none).
        self.base_url, self.bearer = "http://127.0.0.1:9", "fake-credential"
        #: The resources of each registration, in order.
        self.registrations: list[dict[str, Any]] = []

    def register(
        self, role: str, url: str, resources: dict[str, Any], *, slave_token: str
    ) -> Registered:
        self.registrations.append(dict(resources))
        return Registered(
            worker_id=f"{role}-fake",
            heartbeat_interval_s=0.05,
            lease_timeout_s=1,
            credential=f"{role}-fake.secret",
        )

    def heartbeat(self, worker_id: str, tasks: list) -> HeartbeatReply:
        cancel, self.cancel_next = self.cancel_next, []
        release, self.release_next = self.release_next, []
        credentials, self.credentials_next = self.credentials_next, {}
        return HeartbeatReply(cancel=cancel, release=release, credentials=credentials)

    def complete_task(self, task_id: str, result: dict) -> None:
        self.completed.append((task_id, result))

    def fail_task(self, task_id: str, error: str) -> None:
        self.failed.append((task_id, error))

    def leave(self, worker_id: str) -> None:
        self.left.append(worker_id)


class BlockingRunner:
    """Runs until stopped, or returns at once when the spec's seed is 7; fails when the
    seed is 13."""

    kinds = frozenset({"collect", "evaluate"})

    def run(self, ctx) -> dict[str, Any]:
        seed = ctx.task.spec.seed
        if seed == 13:
            raise RuntimeError("unlucky")
        if seed != 7:
            ctx.stop.wait(30)
        return {"seed": seed}


class DeletedFiles:
    """A segment-file sink that records what the buffer deletes."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def delete(self, rel: str) -> bool:
        self.deleted.append(rel)
        return True
