"""Policy versions: a learner announces one; collectors read the newest."""

from typing import Any

from flask import Blueprint, Response, request

from common.errors import bad_request
from common.http import allow, body, caller, reply
from common.messages import MAX_WAIT_S, PolicyAnnounce, PolicyRef
from common.openapi import documented
from services.coordinator.api import core, version_query

bp = Blueprint("policies", __name__, url_prefix="/api/v1/jobs/<job_id>/policies")


def _seconds_arg(name: str) -> float:
    raw = request.args.get(name)
    if raw is None:
        return 0.0
    try:
        value = float(raw) if len(raw) <= 16 else -1.0
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_WAIT_S:
        raise bad_request(name, f"'{raw[:32]}' is not a number of seconds from 0 to {MAX_WAIT_S}")
    return value


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
        "timeout_s": {"type": "string", "pattern": "^[0-9]{1,2}(\\.[0-9]{1,3})?$"},
    },
)
def latest(job_id: str) -> Any:
    newer_than = version_query("newer_than")
    timeout_s = _seconds_arg("timeout_s")
    ref = core().latest_policy(job_id, caller=caller(), newer_than=newer_than, timeout_s=timeout_s)
    if ref is None:
        # None published yet: collectors act randomly until then.
        return Response(status=204)
    return reply(ref)
