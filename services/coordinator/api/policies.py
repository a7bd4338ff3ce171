"""Policy versions: a learner announces one; collectors read the newest."""

from typing import Any

from flask import Blueprint, Response

from common.http import allow, body, caller, reply
from common.messages import PolicyAnnounce, PolicyRef
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("policies", __name__, url_prefix="/api/v1/jobs/<job_id>/policies")


@bp.post("")
@allow("learner")
@documented(summary="Announce a policy version", body=PolicyAnnounce, reply=PolicyRef, status=201)
def announce(job_id: str) -> Any:
    announce = body(PolicyAnnounce)
    core().announce_policy(job_id, announce.ref(), task_id=announce.task_id, caller=caller())
    return reply(announce.ref(), 201)


@bp.get("/latest")
@allow("collector", "learner")
@documented(
    summary="The newest policy version",
    reply=PolicyRef,
    no_content="no version published yet (collectors act at random until then)",
)
def latest(job_id: str) -> Any:
    ref = core().latest_policy(job_id, caller=caller())
    if ref is None:
        # None published yet: collectors act randomly until then.
        return Response(status=204)
    return reply(ref)
