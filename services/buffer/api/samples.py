"""POST /api/v1/jobs/<job_id>/samples: a learner long-polls for batches."""

from typing import Any

from flask import Blueprint, Response, request

from common.array_bodies import (
    CONTENT_TYPE,
    SAMPLE_REQUEST_ARRAYS,
    SAMPLED_ARRAYS,
    wants_arrays,
)
from common.http import allow, body, caller, extension, reply
from common.messages import SampleReply, SampleRequest
from common.openapi import documented
from services.buffer.api import HOST

bp = Blueprint("samples", __name__, url_prefix="/api/v1/jobs/<job_id>/samples")


@bp.post("")
@allow("learner")
@documented(
    summary="Long-poll for batches (503 sample_timeout after timeout_s)",
    body=SampleRequest,
    reply=SampleReply,
    body_arrays=SAMPLE_REQUEST_ARRAYS,
    reply_arrays=SAMPLED_ARRAYS,
)
def sample(job_id: str) -> Any:
    host = extension(HOST)
    request_ = body(SampleRequest, SAMPLE_REQUEST_ARRAYS)
    items = host.sample(job_id, request_, caller=caller())
    if wants_arrays(request.headers.get("Accept")):
        return Response(items.frame(), content_type=CONTENT_TYPE)
    return reply(items.reply())
