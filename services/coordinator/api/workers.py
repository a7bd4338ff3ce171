"""Workers: register, heartbeat (lease renewal), leave, list."""

from typing import Any

from flask import Blueprint

from common.http import allow, body, caller, reply
from common.messages import (
    Heartbeat,
    HeartbeatReply,
    Registered,
    WorkerAck,
    WorkerList,
    WorkerRegistration,
)
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("workers", __name__, url_prefix="/api/v1/workers")


@bp.post("")
@allow("registrar")
@documented(summary="Register a worker", body=WorkerRegistration, reply=Registered, status=201)
def register() -> Any:
    return reply(core().register_worker(body(WorkerRegistration)), 201)


@bp.get("")
@documented(summary="List workers and their tasks' progress", reply=WorkerList)
def list_workers() -> Any:
    return reply(WorkerList(workers=core().list_workers()))


@bp.post("/<worker_id>/heartbeat")
@allow("collector", "learner")
@documented(summary="Renew a worker's lease", body=Heartbeat, reply=HeartbeatReply)
def heartbeat(worker_id: str) -> Any:
    return reply(core().heartbeat(worker_id, body(Heartbeat), caller=caller()))


@bp.delete("/<worker_id>")
@allow("collector", "learner")
@documented(summary="Leave: the worker's tasks go to others at once", reply=WorkerAck, status=202)
def leave(worker_id: str) -> Any:
    core().leave(worker_id, caller=caller())
    return reply(WorkerAck(worker_id=worker_id), 202)
