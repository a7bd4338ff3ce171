"""Tasks: a slave reports a result or a failure."""

from typing import Any

from flask import Blueprint

from common.http import allow, body, caller, reply
from common.messages import TaskAck, TaskComplete, TaskFail
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("tasks", __name__, url_prefix="/api/v1/tasks")


@bp.post("/<task_id>/complete")
@allow("collector", "learner")
@documented(summary="A task's result (an evaluation's returns)", body=TaskComplete, reply=TaskAck)
def complete(task_id: str) -> Any:
    core().complete_task(task_id, body(TaskComplete).result, caller=caller())
    return reply(TaskAck(task_id=task_id))


@bp.post("/<task_id>/fail")
@allow("collector", "learner")
@documented(summary="A task failed", body=TaskFail, reply=TaskAck)
def fail(task_id: str) -> Any:
    core().fail_task(task_id, body(TaskFail).error, caller=caller())
    return reply(TaskAck(task_id=task_id))
