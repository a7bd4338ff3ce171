"""A job's data at the coordinator: its buffer's statistics, and an operator's insert,
sample or priorities, passed on to the job's buffer processes (services/buffer/api
serves them there). A request for a job served by one process is passed on as it came,
body and all, and its answer passed back unparsed (the coordinator's interpreter stays
out of the data plane); one for a job split over shards is sent as a learner or a
collector would send it (services/buffer/client.py: a draw over all of them, each
segment and priority to the shard that holds it). A worker's is refused: its task says
where its data goes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import urllib3
from flask import Blueprint, Response, request

from common.array_bodies import (
    CONTENT_TYPE,
    SAMPLE_REQUEST_ARRAYS,
    SAMPLED_ARRAYS,
    wants_arrays,
)
from common.errors import ApiError, bad_request
from common.http import allow, body, caller, raw_body, reply
from common.http_client import ServiceUnavailable
from common.messages import (
    MAX_WAIT_S,
    BufferStats,
    InsertReply,
    PrioritiesUpdated,
    PriorityUpdate,
    SampleReply,
    SampleRequest,
    SegmentInsert,
)
from common.openapi import documented
from services.buffer.client import ShardedData
from services.coordinator.api import core

bp = Blueprint("data", __name__, url_prefix="/api/v1/jobs/<job_id>")

#: The longest a passed-on request may take: a sample's long-poll, and a margin.
FORWARD_TIMEOUT_S = MAX_WAIT_S + 10.0
#: How long each shard may take to answer an operator's request, past its long-poll.
SHARD_TIMEOUT_S = 10.0
#: A buffer process starting or restarting refuses connections for a second or two:
#: connecting is tried again for about `CONNECT_PATIENCE_S` (nothing was sent yet).
CONNECT_PATIENCE_S = 15.0
_CONNECT_RETRIES = urllib3.Retry(
    total=None,
    connect=int(CONNECT_PATIENCE_S / 0.5),
    read=False,
    redirect=False,
    status=0,
    other=0,
    backoff_factor=0.1,
    backoff_max=0.5,
)
_POOL = urllib3.PoolManager(maxsize=8, retries=_CONNECT_RETRIES)


@bp.get("/buffer")
@documented(
    summary="The job's buffer: size, use, staleness, priorities, limiter", reply=BufferStats
)
def stats(job_id: str) -> Any:
    return reply(core().buffer_stats(job_id))


@bp.post("/segments")
@allow("collector")
@documented(
    summary="Index segments a collector wrote (passed on to the job's buffer process; "
    "a worker sends them there)",
    body=SegmentInsert,
    reply=InsertReply,
)
def insert(job_id: str) -> Any:
    # Each route holds the body to its limit before anything else, as the buffer's.
    data = raw_body(SegmentInsert)
    urls = _buffer_of(job_id)
    # A passed-on insert holds a slot, as one indexed here did: the inserts this
    # coordinator holds a thread for are bounded (429 busy at once past them), so
    # that other requests are not kept waiting behind them.
    with core().insert_slot():
        if len(urls) == 1:
            return _forward(job_id, urls[0], data)
        insert = body(SegmentInsert)
        with _shards(urls) as shards:
            return reply(
                shards.insert_segments(
                    job_id, insert.segments, timeout_s=insert.timeout_s, task_id=insert.task_id
                )
            )


@bp.post("/samples")
@allow("learner")
@documented(
    summary="Long-poll for batches (passed on to the job's buffer processes; 503 "
    "sample_timeout after timeout_s)",
    body=SampleRequest,
    reply=SampleReply,
    body_arrays=SAMPLE_REQUEST_ARRAYS,
    reply_arrays=SAMPLED_ARRAYS,
)
def sample(job_id: str) -> Any:
    data = raw_body(SampleRequest, SAMPLE_REQUEST_ARRAYS)
    urls = _buffer_of(job_id)
    with core().sample_slot():  # a long-poll holds a thread here: bounded in all
        return _sample(job_id, urls, data)


def _sample(job_id: str, urls: list[str], data: bytes) -> Any:
    if len(urls) == 1:
        return _forward(job_id, urls[0], data)
    draw = body(SampleRequest, SAMPLE_REQUEST_ARRAYS)
    if draw.items is not None:
        raise bad_request("items", "a shard's part of a draw is asked of that shard")
    if draw.task_id is not None or draw.acknowledge or draw.give_back:
        # Holds are kept by the learner's own client of the shards, not by one made
        # for a request here.
        raise bad_request(
            "task_id", "a learn task draws from its job's shards where its data access says"
        )
    with _shards(urls) as shards:
        items = shards.sample_items(
            job_id,
            batch_size=draw.batch_size,
            num_batches=draw.num_batches,
            timeout_s=draw.timeout_s,
            priority_keys=list(draw.priority_keys),
            priorities=list(draw.priorities),
        )
    if wants_arrays(request.headers.get("Accept")):
        return Response(items.frame(), content_type=CONTENT_TYPE)
    return reply(items.reply())


@bp.post("/priorities")
@allow("learner")
@documented(
    summary="New priorities by key (passed on to the job's buffer processes)",
    body=PriorityUpdate,
    reply=PrioritiesUpdated,
)
def update_priorities(job_id: str) -> Any:
    data = raw_body(PriorityUpdate)
    urls = _buffer_of(job_id)
    if len(urls) == 1:
        return _forward(job_id, urls[0], data)
    update = body(PriorityUpdate)
    if len(update.keys) != len(update.priorities):
        raise bad_request(
            "priorities", f"{len(update.priorities)} values for {len(update.keys)} keys"
        )
    with _shards(urls) as shards:
        updated = shards.update_priorities(
            job_id, list(update.keys), list(update.priorities), task_id=update.task_id
        )
    return reply(PrioritiesUpdated(updated=updated))


def _buffer_of(job_id: str) -> list[str]:
    """Where an operator's data request for the job goes: its buffer processes, one a
    shard (404, 409 or 503 as `Coordinator.data_urls` says). A worker's is refused:
    403 when it names another worker's task (as it would be wherever sent), else 409."""
    host = core()
    urls = host.data_urls(job_id)
    worker = caller()
    if worker is not None:
        sent = request.get_json(silent=True) if request.is_json else None
        task_id = sent.get("task_id") if isinstance(sent, dict) else None
        host.check_task_owner(job_id, task_id if isinstance(task_id, str) else None, worker)
        raise ApiError(
            409,
            "data_elsewhere",
            f"job {job_id}'s data is served by its buffer process: send it where your "
            "task's data access says",
        )
    return urls


@contextlib.contextmanager
def _shards(urls: list[str]) -> Iterator[ShardedData]:
    """A client of a sharded job's buffer processes, made for this request, with the
    operator's own token."""
    bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    data = ShardedData(urls, bearer, timeout_s=SHARD_TIMEOUT_S)
    try:
        yield data
    except ServiceUnavailable as exc:
        raise ApiError(
            503, "buffer_unavailable", f"a shard of the job's buffer: {exc}", retry_after_s=1.0
        ) from None
    finally:
        data.close()


def _forward(job_id: str, url: str, data: bytes) -> Response:
    """The request, sent to `url` (the buffer process of `job_id`) as it came, with
    its body `data`."""
    headers = {"Authorization": request.headers.get("Authorization", "")}
    if request.content_type:
        headers["Content-Type"] = request.content_type
    if accept := request.headers.get("Accept"):
        headers["Accept"] = accept
    try:
        answer = _POOL.request(
            request.method,
            url + request.full_path.rstrip("?"),
            body=data,
            headers=headers,
            timeout=urllib3.Timeout(connect=5.0, read=FORWARD_TIMEOUT_S),
        )
    except urllib3.exceptions.HTTPError as exc:
        raise ApiError(
            503, "buffer_unavailable", f"job {job_id}'s buffer process: {exc}", retry_after_s=1.0
        ) from None
    return Response(
        answer.data,
        status=answer.status,
        content_type=answer.headers.get("Content-Type", "application/json"),
        headers={k: v for k, v in answer.headers.items() if k == "Retry-After"},
    )
