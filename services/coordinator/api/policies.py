"""Policy versions: a learner announces one; collectors read the newest."""

from typing import Any

from flask import Blueprint

from common.http import body, caller, reply
from common.messages import PolicyAnnounce, PolicyRef
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("policies", __name__, url_prefix="/api/v1/jobs/<job_id>/policies")


@bp.post("")
@documented(summary="Announce a policy version", body=PolicyAnnounce, reply=PolicyRef, status=201)
def announce(job_id: str) -> Any:
    announce = body(PolicyAnnounce)
    core().announce_policy(job_id, announce.ref(), task_id=announce.task_id, caller=caller())
    return reply(announce.ref(), 201)


@bp.get("/latest")
@documented(summary="The newest policy version (204 when none yet)", reply=PolicyRef)
def latest(job_id: str) -> Any:
    ref = core().latest_policy(job_id)
    if ref is None:
        return "", 204  # none published yet: collectors act randomly until then
    return reply(ref)
