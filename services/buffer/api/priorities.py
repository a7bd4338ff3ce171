"""POST /api/v1/jobs/<job_id>/priorities: a learner sends new priorities by key."""

from typing import Any

from flask import Blueprint

from common.errors import bad_request
from common.http import allow, body, caller, extension, reply
from common.messages import PrioritiesUpdated, PriorityUpdate
from common.openapi import documented
from services.buffer.api import HOST

bp = Blueprint("priorities", __name__, url_prefix="/api/v1/jobs/<job_id>/priorities")


@bp.post("")
@allow("learner")
@documented(summary="New priorities by key", body=PriorityUpdate, reply=PrioritiesUpdated)
def update(job_id: str) -> Any:
    host = extension(HOST)
    update = body(PriorityUpdate)
    if len(update.keys) != len(update.priorities):
        raise bad_request(
            "priorities", f"{len(update.priorities)} values for {len(update.keys)} keys"
        )
    updated = host.update_priorities(job_id, update, caller=caller())
    return reply(PrioritiesUpdated(updated=updated))
