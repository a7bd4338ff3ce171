"""POST /api/v1/jobs/<job_id>/samples: a learner long-polls for batches."""

from typing import Any

from flask import Blueprint

from common.http import allow, body, caller, extension, reply
from common.messages import SampleReply, SampleRequest
from common.openapi import documented
from services.buffer.api import HOST
from services.buffer.api.forward import forward

bp = Blueprint("samples", __name__, url_prefix="/api/v1/jobs/<job_id>/samples")


@bp.post("")
@allow("learner")
@documented(
    summary="Long-poll for batches (503 sample_timeout after timeout_s)",
    body=SampleRequest,
    reply=SampleReply,
)
def sample(job_id: str) -> Any:
    if url := extension(HOST).data_url(job_id):
        return forward(job_id, url)
    return reply(extension(HOST).sample(job_id, body(SampleRequest), caller=caller()))
