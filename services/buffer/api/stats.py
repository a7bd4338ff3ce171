"""GET /api/v1/jobs/<job_id>/buffer: size, counters, use, staleness, priorities,
and the rate limiter's state."""

from typing import Any

from flask import Blueprint

from common.http import extension, reply
from common.messages import BufferStats
from common.openapi import documented
from services.buffer.api import HOST

bp = Blueprint("buffer_stats", __name__, url_prefix="/api/v1/jobs/<job_id>/buffer")


@bp.get("")
@documented(
    summary="The job's buffer: size, use, staleness, priorities, limiter", reply=BufferStats
)
def stats(job_id: str) -> Any:
    return reply(extension(HOST).buffer_stats(job_id))
