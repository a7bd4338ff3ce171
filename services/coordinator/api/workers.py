"""Workers: register, heartbeat (lease renewal), leave, list."""

from typing import Any

from flask import Blueprint

from common.http import body, reply
from common.messages import Heartbeat, HeartbeatReply, WorkerRegistration
from services.coordinator.api import core

bp = Blueprint("workers", __name__, url_prefix="/api/v1/workers")


@bp.post("")
def register() -> Any:
    return reply(core().register_worker(body(WorkerRegistration)), 201)


@bp.get("")
def list_workers() -> Any:
    return reply({"workers": core().list_workers()})


@bp.post("/<worker_id>/heartbeat")
def heartbeat(worker_id: str) -> Any:
    return reply(HeartbeatReply(cancel=core().heartbeat(worker_id, body(Heartbeat))))


@bp.delete("/<worker_id>")
def leave(worker_id: str) -> Any:
    core().leave(worker_id)
    return reply({"worker_id": worker_id}, 202)
