"""How a collect task's segments reach the coordinator: `SegmentUploader` writes the
chunks of step data the loop hands it (`PendingSegment`) to the shared store and
inserts their references, on a thread of its own, so stepping continues while it
uploads. The chunks that queue up while an upload is out are written as one segment
(one file, one fsync) and inserted in one request: when the collector steps faster
than one file per chunk can be written, segments grow instead of the per-file costs
(a write, an fsync, the coordinator's read of the header) taking the collector's time.
The queue holds at most `max_rows` rows: when the rate limiter says wait, it fills and
the loop's `put` blocks, which slows stepping down; no data is dropped.

Usage (a collect loop)::

    uploader = SegmentUploader(ctx, store, insert_timeout_s, max_rows=..., metrics=metrics)
    uploader.put(PendingSegment(columns=columns, ref=ref))   # blocks while full
    uploader.close()
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry
from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception

from common.errors import ApiError
from common.frames import pack_frames
from common.http_client import is_transient, retry_wait_s
from common.messages import MAX_EPISODES_PER_SEGMENT, SegmentRef, dump
from common.storage import SharedStore
from common.storage_full import retry_while_full
from services.collector.metrics import CollectorMetrics
from services.slave.core import TaskContext

log = logging.getLogger(__name__)


class UploadFailed(RuntimeError):
    """The uploader thread stopped on an error: the collect task fails with it."""


@dataclass
class PendingSegment:
    """A segment a loop hands the uploader: its columns, written as they are, and the
    reference inserted once they are on disk."""

    columns: dict[str, np.ndarray]
    ref: SegmentRef


#: Rows one upload (one segment file, one insert request) carries at most when the job
#: has no rate limiter; also the most rows the queue holds before the loop waits.
MAX_UPLOAD_ROWS = 4096
#: How long a chunk waits for more to join it before its upload starts anyway. An
#: upload costs a file, an fsync and a request whatever it carries; uploading each
#: chunk at once kept the uploader thread busy (and the GIL with it) on small files
#: while the stepping thread waited for the interpreter.
UPLOAD_WAIT_S = 0.05


def merged(chunks: list[PendingSegment]) -> PendingSegment:
    """Consecutive chunks of one policy version as one segment: their columns end to
    end, written at the first chunk's path (a collector's paths only grow, so the
    coordinator's per-worker order still holds), their counts and episodes summed."""
    first = chunks[0]
    if len(chunks) == 1:
        return first
    names = first.columns.keys()
    columns = {name: np.concatenate([c.columns[name] for c in chunks]) for name in names}
    returns, lengths, spans, offset = [], [], [], 0
    for chunk in chunks:
        returns += chunk.ref.episode_returns
        lengths += chunk.ref.episode_lengths
        spans += [(offset + row, length) for row, length in chunk.ref.episodes]
        offset += chunk.ref.rows
    keep = MAX_EPISODES_PER_SEGMENT
    ref = dataclasses.replace(
        first.ref,
        rows=offset,
        env_steps=sum(c.ref.env_steps for c in chunks),
        episode_returns=returns[-keep:],
        episode_lengths=lengths[-keep:],
        episodes=spans,
    )
    return PendingSegment(columns=columns, ref=ref)


def upload_groups(chunks: list[PendingSegment]) -> list[PendingSegment]:
    """The segments one upload writes: each run of chunks of one policy version merged
    (a segment reference carries one version, which staleness is judged by), split
    where their episode spans would pass what one reference lists."""
    groups: list[PendingSegment] = []
    for _, run in itertools.groupby(chunks, key=lambda chunk: chunk.ref.policy_version):
        group: list[PendingSegment] = []
        spans = 0
        for chunk in run:
            if group and spans + len(chunk.ref.episodes) > MAX_EPISODES_PER_SEGMENT:
                groups.append(merged(group))
                group, spans = [], 0
            group.append(chunk)
            spans += len(chunk.ref.episodes)
        groups.append(merged(group))
    return groups


class SegmentUploader:
    """Writes segments and inserts their references, in its own thread; the chunks
    queued while an upload is out go together, as one segment, in the next one.

    An insert is retried until the coordinator accepts it or the task stops: `429`
    waits its `Retry-After`; an unreachable or restarting coordinator is retried with
    jittered exponential backoff. Inserts are idempotent by path, so a retry never
    counts twice. A segment that is refused (the task was reassigned, the job ended)
    stays on disk: the coordinator indexes or removes such files itself, so none is
    lost or left behind.

    Args:
        max_rows: rows one upload carries at most, and the queue holds before `put`
            waits (a chunk bigger than this still goes, alone). With a rate limiter it
            must be an insert the limiter can always admit (`jobconfig.insert_rows_bound`):
            a bigger one could wait for room that never comes.
        wait_s: how long the oldest chunk waits for others before its upload starts
            (sooner once `max_rows` rows are queued); 0 for loops whose next chunk
            waits on this one being inserted (a round the learner trains on).
        storage_grace_s: how long a segment write finding the shared volume full is
            tried again (the queue fills meanwhile, and the loop waits) before the
            task fails with it (`system.storage_grace_s`).
    """

    def __init__(
        self,
        ctx: TaskContext,
        store: SharedStore,
        insert_timeout_s: float,
        *,
        max_rows: int = MAX_UPLOAD_ROWS,
        wait_s: float = UPLOAD_WAIT_S,
        metrics: CollectorMetrics | None = None,
        storage_grace_s: float = 300.0,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.metrics = metrics or CollectorMetrics(CollectorRegistry())
        self.insert_timeout_s = insert_timeout_s
        self.max_rows = max_rows
        self.wait_s = wait_s
        self.storage_grace_s = storage_grace_s
        self.job_env_steps = 0
        self.segments_sent = 0
        self.rows_acknowledged = 0
        #: Time the stepping loop spent waiting for room (the rate limiter's doing).
        self.waited_s = 0.0
        #: Why the uploader thread stopped, when an error stopped it.
        self.error: str | None = None
        #: Queued chunks and when each was queued (monotonic seconds).
        self._queue: collections.deque[tuple[float, PendingSegment]] = collections.deque()
        self._queued_rows = 0
        #: Set while a `put` waits for room: the next upload is due at once.
        self._full = False
        self._closing = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="uploader", daemon=True)
        self._thread.start()

    def raise_if_failed(self) -> None:
        """Raises UploadFailed when an error stopped the uploader thread: a loop that
        waits for something else (the next policy version) calls it, since nothing it
        waits for comes while its data is not arriving."""
        if self.error is not None:
            raise UploadFailed(self.error)

    def _has_room(self, rows: int) -> bool:
        return not self._queue or self._queued_rows + rows <= self.max_rows

    def put(self, pending: PendingSegment) -> None:
        """Queue a chunk; blocks while the queue is full (the learner is behind).

        Raises:
            UploadFailed: the uploader thread stopped on an error; the task fails with it
                instead of waiting forever for room that will never come.
        """
        started = time.monotonic()
        try:
            with self._changed:
                # A released task's last chunks still go in: only a cancel drops them.
                while not self.ctx.dropping():
                    if self.error is not None:
                        raise UploadFailed(self.error)
                    if self._has_room(pending.ref.rows):
                        self._full = False
                        self._queue.append((time.monotonic(), pending))
                        self._queued_rows += pending.ref.rows
                        self._changed.notify_all()
                        return
                    # Full: the upload starts now, not when the oldest chunk is due.
                    self._full = True
                    self._changed.notify_all()
                    # A bounded wait: a stopped task sets no condition.
                    self._changed.wait(timeout=0.2)
        finally:
            self.waited_s += time.monotonic() - started

    def close(self, timeout_s: float = 10.0) -> None:
        """Upload what is queued (unless the task was cancelled), then end the thread."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _take(self) -> list[PendingSegment] | None:
        """The chunks of the next upload: the oldest, and those behind it that fit in
        `max_rows`, once the oldest has waited `wait_s` or `max_rows` rows are queued
        (at once when closing or stopped); None once closed with nothing left."""
        with self._changed:
            while True:
                if not self._queue:
                    if self._closing:
                        return None
                    self._changed.wait(timeout=0.2)
                    continue
                due = self._queue[0][0] + self.wait_s - time.monotonic()
                hurry = self._full or self._closing or self.ctx.stopped() or self.error is not None
                if due <= 0 or hurry or self._queued_rows >= self.max_rows:
                    break
                self._changed.wait(timeout=due)
            chunks = [self._queue.popleft()[1]]
            rows = chunks[0].ref.rows
            while self._queue and rows + self._queue[0][1].ref.rows <= self.max_rows:
                chunk = self._queue.popleft()[1]
                chunks.append(chunk)
                rows += chunk.ref.rows
            self._queued_rows -= rows
            self._full = False
            self._changed.notify_all()
            return chunks

    def _loop(self) -> None:
        while (chunks := self._take()) is not None:
            if self.ctx.dropping() or self.error is not None:
                continue  # drain without writing: the task was cancelled
            segments = upload_groups(chunks)
            try:
                for item in segments:
                    # Images are written with each frame once (common/frames.py); here,
                    # off the env loop's thread.
                    columns = pack_frames(item.columns)
                    size = retry_while_full(
                        functools.partial(
                            self.store.write_segment,
                            item.ref.path,
                            columns,
                            header=dump(item.ref),
                        ),
                        grace_s=self.storage_grace_s,
                        what=f"segment {item.ref.path}",
                        stopped=self.ctx.dropping,
                        sleep=self.ctx.pause,
                        on_full=self.metrics.storage_full_retries.inc,
                        progress=self.ctx.progress,
                    )
                    self.metrics.segments_written.inc()
                    self.metrics.segment_bytes.inc(size)
                self._insert([item.ref for item in segments])
            except Exception as exc:  # a disk full past the grace, a refusal no retry fixes
                paths = ", ".join(item.ref.path for item in segments)
                log.exception("uploading %s failed", paths)
                with self._changed:
                    self.error = f"uploading {paths} failed: {type(exc).__name__}: {exc}"
                    self._changed.notify_all()

    def _insert(self, refs: list[SegmentRef]) -> None:
        ctx = self.ctx
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=retry_wait_s,
            stop=lambda _: ctx.dropping(),
            sleep=ctx.pause,
            before_sleep=self._retrying,
        )
        try:
            for attempt in retrying:
                with attempt:
                    reply = ctx.data.insert_segments(
                        ctx.task.job_id,
                        refs,
                        timeout_s=self.insert_timeout_s,
                        task_id=ctx.task.task_id,
                    )
        except RetryError:
            return  # the task was cancelled while waiting
        except ApiError as exc:
            if exc.status not in (401, 403, 404, 409):
                raise
            log.info("insert refused, stopping the task: %s", exc.message)
            ctx.stop.set()
            return
        self.job_env_steps = reply.env_steps
        self.segments_sent += len(refs)
        self.rows_acknowledged += sum(ref.rows for ref in refs)

    def _retrying(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, ApiError) and exc.status == 429:  # routine: not logged
            self.metrics.insert_retries.labels("rate_limited").inc()
            return
        self.metrics.insert_retries.labels("transient").inc()
        log.warning("insert failed (%s); retrying", exc)
