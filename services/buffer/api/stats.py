"""GET /api/v1/jobs/<job_id>/buffer: size, counters, use, staleness, priorities,
and the rate limiter's state."""

from typing import Any

from flask import Blueprint

from common.http import extension, reply
from services.buffer.api import HOST

bp = Blueprint("buffer_stats", __name__, url_prefix="/api/v1/jobs/<job_id>/buffer")


@bp.get("")
def stats(job_id: str) -> Any:
    return reply(extension(HOST).buffer_stats(job_id))
