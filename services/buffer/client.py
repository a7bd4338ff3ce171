"""Typed client of a buffer process's own routes (the coordinator's side; workers use
the buffer's data routes through `services.coordinator.client.CoordinatorClient`, whose
insert and sample methods a buffer process answers the same way)."""

from __future__ import annotations

from common.http_client import ServiceClient
from common.messages import (
    BufferStats,
    Health,
    LearnerVersion,
    LimiterCounts,
    ShardReport,
    TaskEnds,
)


class BufferControl(ServiceClient):
    """The coordinator's calls to a buffer process, with the cluster token."""

    def report(self, since: int, *, timeout_s: float | None = None) -> ShardReport:
        return self.call_as(
            ShardReport, "GET", "/v1/shard/report", params={"since": since}, timeout_s=timeout_s
        )

    def task_ends(self, task_ids: list[str]) -> None:
        self.call("POST", "/v1/shard/task-ends", TaskEnds(task_ids=task_ids))

    def learner_version(self, version: int) -> None:
        self.call("POST", "/v1/shard/learner-version", LearnerVersion(version=version))

    def elsewhere(self, counts: LimiterCounts) -> None:
        self.call("POST", "/v1/shard/elsewhere", counts)

    def close_job(self, *, timeout_s: float | None = None) -> BufferStats:
        return self.call_as(BufferStats, "POST", "/v1/shard/close", timeout_s=timeout_s)

    def release(self, *, timeout_s: float | None = None) -> None:
        self.call("POST", "/v1/shard/release", timeout_s=timeout_s)

    def stats(self, job_id: str) -> BufferStats:
        return self.call_as(BufferStats, "GET", f"/api/v1/jobs/{job_id}/buffer")

    def healthy(self) -> bool:
        return self.call_as(Health, "GET", "/healthz", timeout_s=1.0).ok
