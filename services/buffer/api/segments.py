"""POST /api/v1/jobs/<job_id>/segments: a collector indexes the segments it wrote."""

from typing import Any

from flask import Blueprint, Response

from common.http import allow, body, caller, reply
from common.messages import InsertReply, SegmentInsert
from common.openapi import documented
from services.buffer.api.forward import serving

bp = Blueprint("segments", __name__, url_prefix="/api/v1/jobs/<job_id>/segments")


@bp.post("")
@allow("collector")
@documented(
    summary="Index segments a collector wrote (idempotent by path; 429 when ahead or busy)",
    body=SegmentInsert,
    reply=InsertReply,
)
def insert(job_id: str) -> Any:
    host = serving(job_id, insert=True)
    if isinstance(host, Response):
        return host  # passed on as it came
    return reply(host.insert_segments(job_id, body(SegmentInsert), caller=caller()))
