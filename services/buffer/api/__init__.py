"""The buffer's HTTP routes, mounted on the coordinator.

The routes reach the job's buffer through a `BufferHost` that the hosting app puts in
`app.extensions[HOST]`: the coordinator, which also counts env steps and episodes, or a
buffer process (services/buffer/host.py). A coordinator whose job's buffer runs in a
process of its own passes an operator's request on to it, or to each of its shards
(forward.py).
"""

from __future__ import annotations

from typing import Protocol

from flask import Blueprint, Flask, Response

from common.array_bodies import SampledItems
from common.errors import ApiError
from common.http import error_response
from common.messages import InsertReply, PriorityUpdate, SampleRequest, SegmentInsert
from services.buffer.checks import InsertSlot
from services.buffer.core import BufferClosed, BufferStats, RateLimited, SampleTimeout

HOST = "drover.buffer_host"


class DataHost(Protocol):
    """What answers the data routes of a job."""

    def insert_segments(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply: ...

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampledItems: ...

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int: ...


class BufferHost(DataHost, Protocol):
    def buffer_stats(self, job_id: str) -> BufferStats: ...

    def data_urls(self, job_id: str) -> list[str]:
        """Where the job's data is served when not by this host: its buffer process,
        or each of its shards; empty: here."""
        ...

    def insert_slot(self) -> InsertSlot:
        """A slot for one insert served here or passed on; an ApiError 429 busy (and
        counted as such) when the host's `max_concurrent_inserts` are taken."""
        ...

    def check_task_owner(self, job_id: str, task_id: str | None, caller: str) -> None:
        """Raises ApiError 403 when `task_id` is a task of the job held by another
        worker than `caller` (what a worker may not act for, wherever it sends)."""
        ...


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
