"""Policy versions: a learner announces one; collectors read the newest."""

from typing import Any

from flask import Blueprint, Response

from common.http import allow, body, caller, reply
from common.messages import PolicyAnnounce, PolicyRef
from common.openapi import documented
from services.coordinator.api import SECONDS_QUERY, core, seconds_query, version_query

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
    summary="The newest policy version (with newer_than: waits up to timeout_s for one)",
    reply=PolicyRef,
    no_content="no version published yet (collectors act at random until then)",
    query={
        "newer_than": {"type": "string", "pattern": "^[0-9]{1,10}$"},
        "timeout_s": SECONDS_QUERY,
    },
)
def latest(job_id: str) -> Any:
    newer_than = version_query("newer_than")
    timeout_s = seconds_query("timeout_s")
    ref = core().latest_policy(job_id, caller=caller(), newer_than=newer_than, timeout_s=timeout_s)
    if ref is None:
        # None published yet: collectors act randomly until then.
        return Response(status=204)
    return reply(ref)
