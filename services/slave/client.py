"""Typed client for a slave's `/v1` routes (used by the coordinator and tests)."""

from __future__ import annotations

from common.http_client import ServiceClient
from common.messages import (
    SlaveStatus,
    TaskAssignment,
)


class SlaveClient(ServiceClient):
    """Typed client for a slave's `/v1` routes (used by the coordinator and tests)."""

    def assign(self, task: TaskAssignment) -> None:
        self.call("POST", "/v1/tasks", task, timeout_s=5.0)

    def cancel(self, task_id: str) -> None:
        self.call("DELETE", f"/v1/tasks/{task_id}", timeout_s=5.0)

    def release(self, task_id: str) -> None:
        self.call("POST", f"/v1/tasks/{task_id}/release", timeout_s=5.0)

    def status(self) -> SlaveStatus:
        return self.call_as(SlaveStatus, "GET", "/v1/status")
