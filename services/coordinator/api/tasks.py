"""Tasks: a slave reports a result or a failure."""

from typing import Any

from flask import Blueprint

from common.http import body, reply
from common.messages import TaskComplete, TaskFail
from services.coordinator.api import core

bp = Blueprint("tasks", __name__, url_prefix="/api/v1/tasks")


@bp.post("/<task_id>/complete")
def complete(task_id: str) -> Any:
    core().complete_task(task_id, body(TaskComplete).result)
    return reply({"task_id": task_id})


@bp.post("/<task_id>/fail")
def fail(task_id: str) -> Any:
    core().fail_task(task_id, body(TaskFail).error)
    return reply({"task_id": task_id})
