"""How a collect task's segments reach the coordinator: `SegmentUploader` writes each
segment the loop hands it (`PendingSegment`) to the shared store and inserts its
reference, on a thread of its own, so stepping continues while a segment uploads. Its
queue is short (`UPLOAD_QUEUE_SEGMENTS`): when the rate limiter says wait, the queue
fills and the loop's `put` blocks, which slows stepping down; no data is dropped.

Usage (a collect loop)::

    uploader = SegmentUploader(ctx, store, insert_timeout_s, metrics=metrics)
    uploader.put(PendingSegment(columns=columns, ref=ref))   # blocks while full
    uploader.close()
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry
from tenacity import RetryCallState, RetryError, Retrying, retry_if_exception

from common.errors import ApiError
from common.frames import pack_frames
from common.http_client import is_transient, retry_wait_s
from common.messages import SegmentRef, dump
from common.storage import SharedStore
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


#: Segments written but not yet inserted that a collector holds before its stepping
#: loop waits (the rate limiter's back-pressure reaches the envs through this).
UPLOAD_QUEUE_SEGMENTS = 2
#: Segments one insert carries at most with the default queue: the one taken and those
#: queued behind it.
MAX_SEGMENTS_PER_UPLOAD = UPLOAD_QUEUE_SEGMENTS + 1


class SegmentUploader:
    """Writes segments and inserts their references, in its own thread; the segments
    queued while an insert is out go together in the next one.

    An insert is retried until the coordinator accepts it or the task stops: `429`
    waits its `Retry-After`; an unreachable or restarting coordinator is retried with
    jittered exponential backoff. Inserts are idempotent by path, so a retry never
    counts twice. A segment that is refused (the task was reassigned, the job ended)
    stays on disk: the coordinator indexes or removes such files itself, so none is
    lost or left behind.
    """

    def __init__(
        self,
        ctx: TaskContext,
        store: SharedStore,
        insert_timeout_s: float,
        max_pending: int = UPLOAD_QUEUE_SEGMENTS,
        *,
        metrics: CollectorMetrics | None = None,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.metrics = metrics or CollectorMetrics(CollectorRegistry())
        self.insert_timeout_s = insert_timeout_s
        self.job_env_steps = 0
        self.segments_sent = 0
        self.rows_acknowledged = 0
        #: Time the stepping loop spent waiting for room (the rate limiter's doing).
        self.waited_s = 0.0
        #: Why the uploader thread stopped, when an error stopped it.
        self.error: str | None = None
        self._queue: queue.Queue[PendingSegment | None] = queue.Queue(maxsize=max_pending)
        self._max_batch = max_pending + 1
        self._thread = threading.Thread(target=self._loop, name="uploader", daemon=True)
        self._thread.start()

    def raise_if_failed(self) -> None:
        """Raises UploadFailed when an error stopped the uploader thread: a loop that
        waits for something else (the next policy version) calls it, since nothing it
        waits for comes while its data is not arriving."""
        if self.error is not None:
            raise UploadFailed(self.error)

    def put(self, pending: PendingSegment) -> None:
        """Queue a segment; blocks while the queue is full (the learner is behind).

        Raises:
            UploadFailed: the uploader thread stopped on an error; the task fails with it
                instead of waiting forever for room that will never come.
        """
        started = time.monotonic()
        try:
            while not self.ctx.stopped():
                if self.error is not None:
                    raise UploadFailed(self.error)
                try:
                    self._queue.put(pending, timeout=0.2)
                    return
                except queue.Full:
                    continue
        finally:
            self.waited_s += time.monotonic() - started

    def close(self, timeout_s: float = 10.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            # What queued up meanwhile goes in the same insert: one request when the
            # coordinator keeps up, fewer per segment when it does not.
            batch, last = [first], False
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    last = True
                    break
                batch.append(item)
            if self.ctx.stopped() or self.error is not None:
                if last:
                    return
                continue  # drain without writing: the task is over
            try:
                for item in batch:
                    # Images are written with each frame once (common/frames.py); here,
                    # off the env loop's thread.
                    columns = pack_frames(item.columns)
                    size = self.store.write_segment(item.ref.path, columns, header=dump(item.ref))
                    self.metrics.segments_written.inc()
                    self.metrics.segment_bytes.inc(size)
                self._insert([item.ref for item in batch])
            except Exception as exc:  # a full disk, a refusal no retry can fix
                paths = ", ".join(item.ref.path for item in batch)
                log.exception("uploading %s failed", paths)
                self.error = f"uploading {paths} failed: {type(exc).__name__}: {exc}"
            if last:
                return

    def _insert(self, refs: list[SegmentRef]) -> None:
        ctx = self.ctx
        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=retry_wait_s,
            stop=lambda _: ctx.stopped(),
            sleep=ctx.stop.wait,
            before_sleep=self._retrying,
        )
        try:
            for attempt in retrying:
                with attempt:
                    reply = ctx.coordinator.insert_segments(
                        ctx.task.job_id,
                        refs,
                        timeout_s=self.insert_timeout_s,
                        task_id=ctx.task.task_id,
                    )
        except RetryError:
            return  # the task stopped while waiting
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
