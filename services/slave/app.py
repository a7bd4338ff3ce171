"""A slave's Flask app: the `/v1/tasks` routes the coordinator assigns, cancels and
releases through, and status, health, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask, Response

from common.errors import ApiError
from common.http import allow, body, extension, install_http_basics, reply
from common.messages import (
    Health,
    SlaveStatus,
    TaskAck,
    TaskAssignment,
)
from common.metrics import metrics_response
from common.openapi import documented, install_openapi
from services.slave.core import EXTENSION, Slave

log = logging.getLogger(__name__)


tasks_bp = Blueprint("tasks", __name__, url_prefix="/v1/tasks")
health_bp = Blueprint("health", __name__)


def _slave() -> Slave:
    return extension(EXTENSION)


@tasks_bp.post("")
@documented(
    summary="Assign a task (409 when one of its kind runs)",
    body=TaskAssignment,
    reply=TaskAck,
    status=202,
)
def assign_task() -> Any:
    task = body(TaskAssignment)
    _slave().assign(task)
    return reply(TaskAck(task_id=task.task_id), 202)


@tasks_bp.delete("/<task_id>")
@documented(summary="Cancel a task", reply=TaskAck, status=202)
def cancel_task(task_id: str) -> Any:
    if not _slave().cancel(task_id):
        raise ApiError(404, "not_found", f"task {task_id} is not running here")
    return reply(TaskAck(task_id=task_id), 202)


@tasks_bp.post("/<task_id>/release")
@documented(
    summary="Release a task: it ends at its next safe point, hands in what it did and "
    "reports complete (its worker goes to another job)",
    reply=TaskAck,
    status=202,
)
def release_task(task_id: str) -> Any:
    if not _slave().release(task_id):
        raise ApiError(404, "not_found", f"task {task_id} is not running here")
    return reply(TaskAck(task_id=task_id), 202)


@health_bp.get("/v1/status")
@documented(summary="This worker's tasks and their progress", reply=SlaveStatus)
def status() -> Any:
    return reply(_slave().status())


@health_bp.get("/healthz")
@documented(summary="Liveness", reply=Health)
def healthz() -> Any:
    return reply(Health(ok=True))


@health_bp.get("/readyz")
@documented(summary="Readiness: shared root mounted, registered", reply=Health)
def readyz() -> Any:
    ok, why = _slave().ready()
    return reply(Health(ok=ok, reason=why), 200 if ok else 503)


@health_bp.get("/metrics")
@allow("scraper")
@documented(summary="Prometheus metrics", content_type="text/plain")
def metrics() -> Response:
    return metrics_response(_slave().metrics)


def routes() -> list[Blueprint]:
    """A collector's or learner's routes: its tasks, its health and metrics."""
    return [tasks_bp, health_bp]


def create_slave_app(name: str, slave: Slave, token: str = "", metrics_token: str = "") -> Flask:
    """A collector's or learner's Flask app: the task and health blueprints.

    Its routes take the secret the slave gave the coordinator at registration, and
    the cluster `token` when this process has it (operators); `/metrics` also takes
    `metrics_token` (a Prometheus server's). Requests are counted in the slave's
    registry, with the slave's role as their `service`.
    """
    app = Flask(name)
    install_http_basics(
        app,
        [slave.slave_token, token],
        metrics_token=metrics_token or None,
        service=slave.role,
        metrics=slave.metrics,
    )
    app.extensions[EXTENSION] = slave
    for bp in routes():
        app.register_blueprint(bp)
    install_openapi(app, f"drover {slave.role}")
    return app
