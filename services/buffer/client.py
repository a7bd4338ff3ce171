"""The buffer's clients: a task's data calls (`BufferData`: insert, sample, priorities,
to a job's buffer process; `ShardedData`: the same calls over a job's shards, as one;
`data_client` picks one for a task's data access), and the coordinator's calls to a
buffer process of its own routes (`BufferControl`). The data routes are
`services/buffer/api/*`: a route change and its client change land in one diff.

A job split over shards (sharding.py) is sent:

- `insert_segments`: each segment to its shard (`segment_shard`: a collector's go to
  one shard in runs, so an insert is mostly one request); the groups at once, and a
  refusal of any is the insert's: it is sent again whole, and since inserts are
  idempotent by path, what a shard took counts once;
- `sample`: one draw over all shards (`split`, each shard's part, `merge`), each
  shard's request carrying the priorities of its own keys; from a fifo job's shards,
  each one's oldest in proportion to what it queues (`split_queue`), held under one
  hold id of this client's that stands for each shard's;
- `update_priorities`: each key to the shard that holds it.

Usage::

    data = data_client(access.urls, access.credential, timeout_s=10.0)
    reply = data.sample(job_id, batch_size=64, num_batches=8, timeout_s=5.0)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from common.array_bodies import CONTENT_TYPE as ARRAYS_TYPE
from common.array_bodies import SAMPLE_REQUEST_ARRAYS, SampledItems, encode
from common.errors import ApiError, bad_request
from common.http_client import API, ServiceClient, ServiceUnavailable
from common.messages import (
    BufferStats,
    Health,
    InsertReply,
    LearnerVersion,
    LimiterCounts,
    PrioritiesUpdated,
    PriorityUpdate,
    SampleReply,
    SampleRequest,
    SegmentInsert,
    SegmentRef,
    ShardReport,
    TaskEnds,
    parse,
)
from services.buffer.core import segment_shard
from services.buffer.sharding import merge, split, split_queue
from services.buffer.table import shard_of


class BufferData(ServiceClient):
    """A task's data calls to its job's buffer process (with the task's credential),
    or an operator's to the coordinator's data routes (with the cluster token), which
    the coordinator passes on to the job's buffer process."""

    def insert_segments(
        self,
        job_id: str,
        segments: list[SegmentRef],
        *,
        timeout_s: float = 0.0,
        task_id: str | None = None,
    ) -> InsertReply:
        return self.call_as(
            InsertReply,
            "POST",
            f"{API}/jobs/{job_id}/segments",
            SegmentInsert(segments=segments, timeout_s=timeout_s, task_id=task_id),
            timeout_s=self.timeout_s + timeout_s,
        )

    def sample(self, job_id: str, **request: Any) -> SampleReply:
        """`sample_items` (its keyword arguments), as a reply: what a sharded job's
        client (`ShardedData.sample`) answers too."""
        return self.sample_items(job_id, **request).reply()

    def sample_items(
        self,
        job_id: str,
        *,
        batch_size: int,
        num_batches: int,
        timeout_s: float,
        task_id: str | None = None,
        acknowledge: list[str] | None = None,
        priority_keys: list[int] | None = None,
        priorities: list[float] | None = None,
        items: int | None = None,
        give_back: list[str] | None = None,
    ) -> SampledItems:
        """`sample`'s items as arrays; `items`: a shard's part of a draw over shards,
        `give_back`: holds whose items go back to the queue untrained."""
        req = SampleRequest(
            batch_size=batch_size,
            num_batches=num_batches,
            timeout_s=timeout_s,
            task_id=task_id,
            acknowledge=acknowledge or [],
            give_back=give_back or [],
            priority_keys=priority_keys or [],
            priorities=priorities or [],
            items=items,
        )
        # Binary both ways (common/array_bodies.py): the priorities a learner sends and
        # the keys, rows and weights it gets are arrays, not numbers printed one by one.
        resp = self.raw(
            "POST",
            f"{API}/jobs/{job_id}/samples",
            encode(req, SAMPLE_REQUEST_ARRAYS),
            timeout_s=self.timeout_s + timeout_s,
            content_type=ARRAYS_TYPE,
            accept=ARRAYS_TYPE,
        )
        return SampledItems.from_frame(resp.data)

    def update_priorities(
        self, job_id: str, keys: list[int], priorities: list[float], *, task_id: str | None = None
    ) -> int:
        """Returns how many keys were still in the buffer."""
        upd = PriorityUpdate(keys=keys, priorities=priorities, task_id=task_id)
        data = self.call("POST", f"{API}/jobs/{job_id}/priorities", upd)
        return parse(PrioritiesUpdated, data).updated


T = TypeVar("T")
#: How often a learner asks shards that had nothing to draw for their state again
#: (doubling up to the second figure) until its long-poll's time is up.
STATE_POLL_S, MAX_STATE_POLL_S = 0.05, 0.5


def data_client(urls: list[str], credential: str, *, timeout_s: float) -> BufferData | ShardedData:
    """The client of a task's data access: one buffer process's, or its shards'."""
    if len(urls) == 1:
        return BufferData(urls[0], credential, timeout_s=timeout_s)
    return ShardedData(urls, credential, timeout_s=timeout_s)


class ShardedData:
    """The data routes of a job's shards, as one (see the module's text)."""

    def renew(self, credential: str) -> None:
        """Use a fresh task credential from now on (on every shard)."""
        self.bearer = credential
        for shard in self.shards:
            shard.renew(credential)

    def __init__(self, urls: list[str], credential: str, *, timeout_s: float) -> None:
        self.shards = [BufferData(url, credential, timeout_s=timeout_s) for url in urls]
        self.base_urls = list(urls)
        self.bearer = credential
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(len(urls), thread_name_prefix="shard")
        self._rng = np.random.default_rng()
        self._lock = threading.Lock()
        #: Each shard's mass and smallest sampling weight, as its last answer said
        #: (0 and inf: not heard from yet, or nothing to draw).
        self._masses = [0.0] * len(urls)
        self._min_weights = [math.inf] * len(urls)
        #: Whether the shards consume what they hand out (fifo), as they last said.
        self._consumes = False
        #: A fifo draw's holds: each of this client's hold ids, by shard the hold id
        #: that shard gave its part; and, by shard, holds to give back untrained.
        self._holds: dict[str, dict[int, str]] = {}
        self._next_hold = 0
        self._untrained: dict[int, list[str]] = {}

    # --- inserts ---------------------------------------------------------------------

    def insert_segments(
        self,
        job_id: str,
        segments: list[SegmentRef],
        *,
        timeout_s: float = 0.0,
        task_id: str | None = None,
    ) -> InsertReply:
        groups: dict[int, list[SegmentRef]] = {}
        for ref in segments:
            groups.setdefault(segment_shard(ref.path, len(self.shards)), []).append(ref)
        replies = self._each(
            {
                k: (
                    lambda k=k, refs=refs: self.shards[k].insert_segments(
                        job_id, refs, timeout_s=timeout_s, task_id=task_id
                    )
                )
                for k, refs in groups.items()
            }
        )
        return InsertReply(
            accepted=sum(r.accepted for r in replies.values()),
            duplicates=sum(r.duplicates for r in replies.values()),
            env_steps=sum(r.env_steps for r in replies.values()),
        )

    # --- samples ---------------------------------------------------------------------

    def sample(self, job_id: str, **request: Any) -> SampleReply:
        """One draw over the shards (`sample_items`), as a reply."""
        return self.sample_items(job_id, **request).reply()

    def sample_items(
        self,
        job_id: str,
        *,
        batch_size: int,
        num_batches: int,
        timeout_s: float,
        task_id: str | None = None,
        acknowledge: list[str] | None = None,
        priority_keys: list[int] | None = None,
        priorities: list[float] | None = None,
    ) -> SampledItems:
        """One draw over the shards; `ApiError` 503 `sample_timeout` when they had not
        enough to draw within `timeout_s` (as one buffer's long-poll ends)."""
        count = batch_size * num_batches
        keys = np.asarray(priority_keys or [], dtype=np.int64)
        values = np.asarray(priorities or [], dtype=np.float64)
        owner = shard_of(keys, len(self.shards))
        with self._lock:
            trained: dict[int, list[str]] = {}
            for own in acknowledge or []:
                for k, hold_id in self._holds.get(own, {}).items():
                    trained.setdefault(k, []).append(hold_id)
        deadline = time.monotonic() + timeout_s
        wait_s = STATE_POLL_S
        while True:
            counts = self._counts(count)
            if sum(counts) and self._consumes and task_id is None:
                # Parts drawn from some shards when another failed could not be held,
                # nor given back: they would be lost.
                raise bad_request(
                    "task_id",
                    f"job {job_id}'s fifo items are split over shards: a draw holds them "
                    "for a learn task until it acknowledges them, so it names one",
                )
            parts = self._draw(
                job_id,
                counts,
                batch_size,
                num_batches,
                max(0.0, deadline - time.monotonic()),
                task_id,
                (keys, values, owner),
                trained,
            )
            keys, values, owner, trained = keys[:0], values[:0], owner[:0], {}  # sent once
            if sum(counts):
                break
            if self._ready(count):
                continue  # the states just heard allow a draw
            if time.monotonic() + wait_s > deadline:
                raise ApiError(
                    503,
                    "sample_timeout",
                    f"the shards of job {job_id} had not {count} items to draw",
                    retry_after_s=0.0,
                )
            time.sleep(wait_s)
            wait_s = min(2 * wait_s, MAX_STATE_POLL_S)
        with self._lock:
            for own in acknowledge or []:
                self._holds.pop(own, None)
            mins = [w for w in self._min_weights if math.isfinite(w)] or None
            items = merge(parts, batch_size=batch_size, rng=self._rng, min_weights=mins)
            held = {k: part.hold_id for k, part in enumerate(parts) if part.hold_id}
            if held:
                items.hold_id = f"shards-{self._next_hold}"
                self._next_hold += 1
                self._holds[items.hold_id] = held
        return items

    def _counts(self, count: int) -> list[int]:
        """Each shard's part of a draw of `count` items, from what each said last; all
        0 (a round of states) while they cannot give them."""
        with self._lock:
            masses, consumes = list(self._masses), self._consumes
        if not self._ready(count):
            return [0] * len(self.shards)
        if consumes:
            return split_queue(count, masses)
        return split(count, masses, self._rng)

    def _ready(self, count: int) -> bool:
        """Whether the shards' last answers allow a draw of `count` items: a fifo job's
        shards must queue them all between them, any other's have any mass."""
        with self._lock:
            total = sum(self._masses)
            return total >= count if self._consumes else total > 0

    def _draw(
        self,
        job_id: str,
        counts: list[int],
        batch_size: int,
        num_batches: int,
        timeout_s: float,
        task_id: str | None,
        priorities: tuple[np.ndarray, np.ndarray, np.ndarray],
        trained: dict[int, list[str]],
    ) -> list[SampledItems]:
        """Each shard's part of one draw (`counts`), at once; what each said of its
        state is kept even when another failed (the next split needs it), and so are
        the holds of parts drawn when another failed (the next request gives them
        back)."""
        parts: dict[int, SampledItems] = {}
        keys, values, owner = priorities
        with self._lock:
            untrained = {k: list(ids) for k, ids in self._untrained.items()}

        def ask(k: int) -> SampledItems:
            try:
                part = self.shards[k].sample_items(
                    job_id,
                    batch_size=batch_size,
                    num_batches=num_batches,
                    timeout_s=timeout_s,
                    task_id=task_id,
                    acknowledge=trained.get(k),
                    give_back=untrained.get(k),
                    priority_keys=keys[owner == k].tolist(),
                    priorities=values[owner == k].tolist(),
                    items=counts[k],
                )
            except (ApiError, ServiceUnavailable):
                with self._lock:
                    self._masses[k] = 0.0  # asked for its state only, until it answers
                raise
            parts[k] = part
            with self._lock:
                given = untrained.get(k, [])
                self._untrained[k] = [h for h in self._untrained.get(k, []) if h not in given]
                if part.shard is not None:
                    self._masses[k] = part.shard.mass
                    self._consumes = part.shard.consumes
                    self._min_weights[k] = (
                        part.shard.min_weight if part.shard.mass > 0 else math.inf
                    )
            return part

        try:
            self._each({k: (lambda k=k: ask(k)) for k in range(len(self.shards))})
        except BaseException:
            with self._lock:
                for k, part in parts.items():
                    if part.hold_id is not None:
                        self._untrained.setdefault(k, []).append(part.hold_id)
            raise
        return [parts[k] for k in range(len(self.shards))]

    def update_priorities(
        self, job_id: str, keys: list[int], priorities: list[float], *, task_id: str | None = None
    ) -> int:
        """Returns how many keys were still in the buffer."""
        array = np.asarray(keys, dtype=np.int64)
        owner = shard_of(array, len(self.shards))
        values = np.asarray(priorities, dtype=np.float64)
        updated = self._each(
            {
                k: (
                    lambda k=k: self.shards[k].update_priorities(
                        job_id,
                        array[owner == k].tolist(),
                        values[owner == k].tolist(),
                        task_id=task_id,
                    )
                )
                for k in set(owner.tolist())
            }
        )
        return sum(updated.values())

    # --- the fan-out -----------------------------------------------------------------

    def _each(self, calls: dict[int, Callable[[], T]]) -> dict[int, T]:
        """Every call at once, on the pool; the first error raised once all ended."""
        if len(calls) == 1:
            ((k, call),) = calls.items()
            return {k: call()}
        futures = {k: self._pool.submit(call) for k, call in calls.items()}
        results: dict[int, Any] = {}
        error: BaseException | None = None
        for k, future in futures.items():
            try:
                results[k] = future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the rest
                error = error or exc
        if error is not None:
            raise error
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for shard in self.shards:
            shard.close()


#: A task's data calls, to one buffer process or over a job's shards.
DataClient = BufferData | ShardedData


class BufferControl(ServiceClient):
    """The coordinator's calls to a buffer process, with the cluster token."""

    def report(self, since: int, *, timeout_s: float | None = None) -> ShardReport:
        return self.call_as(
            ShardReport, "GET", "/v1/shard/report", params={"since": since}, timeout_s=timeout_s
        )

    def task_ends(self, task_ids: list[str]) -> None:
        self.call("POST", "/v1/shard/task-ends", TaskEnds(task_ids=task_ids))

    def learner_version(self, version: int) -> None:
        self.call("POST", "/v1/shard/learner-version", LearnerVersion(version=version))

    def elsewhere(self, counts: LimiterCounts) -> None:
        self.call("POST", "/v1/shard/elsewhere", counts)

    def close_job(self, *, timeout_s: float | None = None) -> BufferStats:
        return self.call_as(BufferStats, "POST", "/v1/shard/close", timeout_s=timeout_s)

    def release(self, *, timeout_s: float | None = None) -> None:
        self.call("POST", "/v1/shard/release", timeout_s=timeout_s)

    def stats(self, job_id: str) -> BufferStats:
        return self.call_as(BufferStats, "GET", f"/api/v1/jobs/{job_id}/buffer")

    def healthy(self) -> bool:
        return self.call_as(Health, "GET", "/healthz", timeout_s=1.0).ok
