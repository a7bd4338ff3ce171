"""A buffer process's data routes: inserts, samples, priorities and statistics, served
by the `BufferHost` its app puts in `app.extensions[HOST]` (services/buffer/host.py's
`ShardHost`). The coordinator has routes of the same paths that pass an operator's
request on to them (services/coordinator/api/data.py).
"""

from __future__ import annotations

from typing import Protocol

from flask import Blueprint, Flask, Response

from common.array_bodies import SampledItems
from common.errors import ApiError
from common.http import error_response
from common.messages import InsertReply, PriorityUpdate, SampleRequest, SegmentInsert
from services.buffer.core import BufferClosed, BufferStats, RateLimited, SampleTimeout

HOST = "drover.buffer_host"


class BufferHost(Protocol):
    """What answers a buffer process's routes (`ShardHost`)."""

    def insert_segments(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply: ...

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampledItems: ...

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int: ...

    def buffer_stats(self, job_id: str) -> BufferStats: ...


def blueprints() -> list[Blueprint]:
    from services.buffer.api import priorities, samples, segments, stats

    return [segments.bp, samples.bp, priorities.bp, stats.bp]


def install(app: Flask, host: BufferHost) -> None:
    """Serve the buffer routes (`blueprints()`, registered with the app's other
    routes) from `host`, and answer the buffer's errors."""
    app.extensions[HOST] = host

    @app.errorhandler(RateLimited)
    def _rate_limited(err: RateLimited) -> Response:
        return error_response(
            ApiError(
                429,
                "rate_limited",
                "the learner is behind; retry the same insert later",
                retry_after_s=err.retry_after_s,
            )
        )

    @app.errorhandler(SampleTimeout)
    def _sample_timeout(err: SampleTimeout) -> Response:
        return error_response(ApiError(503, "sample_timeout", str(err), retry_after_s=0.0))

    @app.errorhandler(BufferClosed)
    def _closed(err: BufferClosed) -> Response:
        return error_response(ApiError(409, "job_finished", str(err)))
