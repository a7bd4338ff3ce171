"""An operator's data request to a coordinator whose job's buffer runs in a process of
its own: passed on as it came, body and all, and its answer passed back, without being
parsed here (the coordinator's interpreter stays out of the data plane); a job split
over shards gets it as a learner or collector would send it, each part to its shard
(client.py: a draw over all of them, each segment and priority to the shard
that holds it). A worker's is refused: its task says where its data goes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import urllib3
from flask import Response, request

from common.array_bodies import SampledItems
from common.errors import ApiError, bad_request
from common.http import caller, extension
from common.http_client import ServiceUnavailable
from common.messages import (
    MAX_WAIT_S,
    InsertReply,
    PriorityUpdate,
    SampleRequest,
    SegmentInsert,
)
from services.buffer.api import HOST, BufferHost, DataHost
from services.buffer.client import ShardedData

#: The longest a passed-on request may take: a sample's long-poll, and a margin.
FORWARD_TIMEOUT_S = MAX_WAIT_S + 10.0
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


#: How long each shard may take to answer an operator's request, past its long-poll.
SHARD_TIMEOUT_S = 10.0


def serving(job_id: str, *, insert: bool = False) -> DataHost | Response:
    """What answers a data request for `job_id` here: this app's host; for a job whose
    buffer runs in one process elsewhere, the request passed on as it came (the answer,
    a Response); for one split over shards, its shards as one host. An `insert` passed
    on takes one of the host's insert slots, as one served here does: the inserts a
    coordinator holds a thread for are bounded whichever path they take (429 busy at
    once past them), so that samples are not kept waiting behind them."""
    host = extension(HOST)
    urls = host.data_urls(job_id)
    if not urls:
        return host
    worker = caller()
    if worker is not None:
        # Acting for another worker's task is refused as such (403), wherever sent.
        body = request.get_json(silent=True) if request.is_json else None
        task_id = body.get("task_id") if isinstance(body, dict) else None
        host.check_task_owner(job_id, task_id if isinstance(task_id, str) else None, worker)
        raise ApiError(
            409,
            "data_elsewhere",
            f"job {job_id}'s data is served by its buffer process: send it where your "
            "task's data access says",
        )
    if len(urls) > 1:
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        return Shards(urls, bearer, host)
    with host.insert_slot() if insert else contextlib.nullcontext():
        return forward(job_id, urls[0])


class Shards:
    """A sharded job's data routes for an operator's request, over a client of its
    shards made for the request."""

    def __init__(self, urls: list[str], bearer: str, host: BufferHost) -> None:
        self.urls, self.bearer, self.host = urls, bearer, host

    @contextlib.contextmanager
    def _client(self) -> Iterator[ShardedData]:
        data = ShardedData(self.urls, self.bearer, timeout_s=SHARD_TIMEOUT_S)
        try:
            yield data
        except ServiceUnavailable as exc:
            raise ApiError(
                503, "buffer_unavailable", f"a shard of the job's buffer: {exc}", retry_after_s=1.0
            ) from None
        finally:
            data.close()

    def insert_segments(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply:
        with self.host.insert_slot(), self._client() as data:
            return data.insert_segments(
                job_id, insert.segments, timeout_s=insert.timeout_s, task_id=insert.task_id
            )

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampledItems:
        if request.items is not None:
            raise bad_request("items", "a shard's part of a draw is asked of that shard")
        if request.task_id is not None or request.acknowledge or request.give_back:
            # Holds are kept by the learner's own client of the shards, not by one made
            # for a request here.
            raise bad_request(
                "task_id", "a learn task draws from its job's shards where its data access says"
            )
        with self._client() as data:
            return data.sample_items(
                job_id,
                batch_size=request.batch_size,
                num_batches=request.num_batches,
                timeout_s=request.timeout_s,
                priority_keys=list(request.priority_keys),
                priorities=list(request.priorities),
            )

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int:
        with self._client() as data:
            return data.update_priorities(
                job_id, list(update.keys), list(update.priorities), task_id=update.task_id
            )


def forward(job_id: str, url: str) -> Response:
    """The request, sent to `url` (the buffer process of `job_id`) as it came."""
    headers = {"Authorization": request.headers.get("Authorization", "")}
    if request.content_type:
        headers["Content-Type"] = request.content_type
    if accept := request.headers.get("Accept"):
        headers["Accept"] = accept
    try:
        answer = _POOL.request(
            request.method,
            url + request.full_path.rstrip("?"),
            body=request.get_data(),
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
