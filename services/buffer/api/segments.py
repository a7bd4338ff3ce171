"""POST /api/v1/jobs/<job_id>/segments: a collector indexes the segments it wrote."""

from typing import Any

from flask import Blueprint

from common.http import allow, body, caller, extension, reply
from common.messages import InsertReply, SegmentInsert
from common.openapi import documented
from services.buffer.api import HOST

bp = Blueprint("segments", __name__, url_prefix="/api/v1/jobs/<job_id>/segments")


@bp.post("")
@allow("collector")
@documented(
    summary="Index segments a collector wrote (idempotent by path; 429 when ahead or busy)",
    body=SegmentInsert,
    reply=InsertReply,
)
def insert(job_id: str) -> Any:
    host = extension(HOST)
    return reply(host.insert_segments(job_id, body(SegmentInsert), caller=caller()))
