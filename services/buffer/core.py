"""Replay buffer: an index of rows in segment files, a sampler, a rate limiter.

The bytes stay on the shared file system; the buffer keeps, per item, which segment
and row it lives in. Items get increasing integer keys; the buffer is a ring of
`capacity` slots (slot = key % capacity), so the oldest item is evicted first.

Segments are reference-counted: when every row of a segment has been evicted and no
sample handed out in the last `release_grace_s` still points at it, the file is
deleted, so disk use stays bounded by the capacity.

The rate limiter follows Reverb's `SampleToInsertRatio`: it keeps
`samples / inserts` near `samples_per_insert` within `error_buffer` sampled items by
making the faster side wait. Nothing is ever dropped to keep the ratio.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from common.config import ReplayBufferConfig
from common.messages import SampledBatch, SampledSegment, SegmentRef

_SEGMENT = re.compile(r"^(?P<job>[^/]+)/segments/(?P<worker>[^/]+)/(?P<seq>\d{1,12})\.safetensors$")


class RateLimited(Exception):
    """The insert must wait for the learner; retry after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after_s:.2f}s")
        self.retry_after_s = retry_after_s


class SampleTimeout(Exception):
    """No sample could be served before the request's deadline."""


class BufferClosed(Exception):
    """The job ended; the buffer serves no more samples or inserts."""


class SegmentFiles(Protocol):
    """Where released segment files go (the shared store)."""

    def delete(self, rel: str) -> bool: ...


@dataclass(frozen=True)
class RateLimiterState:
    samples_per_insert: float | None
    min_size_to_sample: int
    error_buffer: float
    inserted: int
    sampled: int


class RateLimiter:
    """Reverb-style samples-per-insert limiter, counted in items.

    With `spi = samples_per_insert`, the target is
    ``sampled == spi * (inserted - min_size_to_sample)``; sampling may run ahead of
    it by at most `error_buffer` items and behind it by at most `error_buffer`.
    Without a ratio, only `min_size_to_sample` holds sampling back.
    """

    def __init__(
        self, samples_per_insert: float | None, min_size_to_sample: int, error_buffer: float
    ) -> None:
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = error_buffer
        self.inserted = 0
        self.sampled = 0

    def _diff(self, inserted: int, sampled: int) -> float:
        spi = self.samples_per_insert or 0.0
        return spi * (inserted - self.min_size_to_sample) - sampled

    def can_sample(self, num_items: int) -> bool:
        if self.inserted < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        return self._diff(self.inserted, self.sampled + num_items) >= -self.error_buffer

    def can_insert(self, num_items: int) -> bool:
        if self.samples_per_insert is None:
            return True
        if self.inserted + num_items <= self.min_size_to_sample:
            return True
        return self._diff(self.inserted + num_items, self.sampled) <= self.error_buffer

    def state(self) -> RateLimiterState:
        return RateLimiterState(
            samples_per_insert=self.samples_per_insert,
            min_size_to_sample=self.min_size_to_sample,
            error_buffer=self.error_buffer,
            inserted=self.inserted,
            sampled=self.sampled,
        )


@dataclass
class _Segment:
    path: str
    live_rows: int
    last_sampled_s: float = float("-inf")


@dataclass(frozen=True)
class InsertResult:
    accepted: int
    duplicates: int
    accepted_refs: list[SegmentRef]


@dataclass(frozen=True)
class BufferStats:
    size: int
    capacity: int
    inserts: int
    samples: int
    evictions: int
    live_segments: int
    released_segments: int
    samples_per_insert_ratio: float | None
    limiter: RateLimiterState


class ReplayBuffer:
    """A job's replay index: thread-safe; sample requests long-poll on a condition."""

    def __init__(
        self,
        job_id: str,
        config: ReplayBufferConfig,
        files: SegmentFiles,
        *,
        error_buffer: float,
        seed: int = 0,
        release_grace_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.capacity = config.replay_buffer_size
        self.limiter = RateLimiter(
            config.samples_per_insert, config.min_size_to_sample, error_buffer
        )
        self._files = files
        self._clock = clock
        self._release_grace_s = release_grace_s
        self._rng = np.random.default_rng(seed)
        self._cond = threading.Condition()
        self._closed = False
        # Per slot: which segment (id into _segments) and which row of it; -1 = empty.
        self._segment_of = np.full(self.capacity, -1, dtype=np.int64)
        self._row_of = np.zeros(self.capacity, dtype=np.int32)
        self._next_key = 0
        self._segments: dict[int, _Segment] = {}
        self._segment_ids: dict[str, int] = {}
        self._next_segment_id = 0
        # Highest accepted sequence number per collector: a re-sent segment whose rows
        # were already evicted is still recognised as a duplicate.
        self._last_seq: dict[str, int] = {}
        self._dead: set[int] = set()
        self._evictions = 0
        self._released = 0

    # --- inserts -------------------------------------------------------------------

    def insert(self, refs: list[SegmentRef], *, timeout_s: float = 0.0) -> InsertResult:
        """Index the rows of `refs`; inserts of a path seen before count once.

        Raises:
            ValueError: a path is not a segment of this job.
            RateLimited: the limiter did not allow it within `timeout_s`.
            BufferClosed: the job has ended.
        """
        parsed = [(ref, self._parse_path(ref.path)) for ref in refs]
        deadline = self._clock() + timeout_s
        with self._cond:
            fresh = [(ref, key) for ref, key in parsed if not self._is_duplicate(*key, ref.path)]
            # Two refs to the same path in one message count once.
            unique = list({ref.path: (ref, key) for ref, key in fresh}.values())
            num_rows = sum(ref.rows for ref, _ in unique)
            while True:
                if self._closed:
                    raise BufferClosed(f"job {self.job_id} has ended")
                if self.limiter.can_insert(num_rows):
                    break
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise RateLimited(retry_after_s=0.05)
                self._cond.wait(remaining)
            for ref, (worker, seq) in unique:
                self._add_segment(ref)
                self._last_seq[worker] = max(seq, self._last_seq.get(worker, -1))
            self.limiter.inserted += num_rows
            self._release_dead()
            self._cond.notify_all()
        return InsertResult(
            accepted=len(unique),
            duplicates=len(refs) - len(unique),
            accepted_refs=[ref for ref, _ in unique],
        )

    def _parse_path(self, path: str) -> tuple[str, int]:
        match = _SEGMENT.match(path)
        if match is None or match["job"] != self.job_id:
            raise ValueError(
                f"path '{path}' is not '{self.job_id}/segments/<worker_id>/<seq>.safetensors'"
            )
        return match["worker"], int(match["seq"])

    def _is_duplicate(self, worker: str, seq: int, path: str) -> bool:
        return path in self._segment_ids or seq <= self._last_seq.get(worker, -1)

    def _add_segment(self, ref: SegmentRef) -> None:
        rows = ref.rows
        segment_id = self._next_segment_id
        self._next_segment_id += 1
        # A segment larger than the whole buffer keeps only its newest rows.
        first_row = max(0, rows - self.capacity)
        keys = np.arange(self._next_key + first_row, self._next_key + rows)
        self._next_key += rows
        slots = keys % self.capacity
        old = self._segment_of[slots]
        old = old[old >= 0]
        if len(old):
            self._evictions += len(old)
            ids, counts = np.unique(old, return_counts=True)
            for sid, count in zip(ids.tolist(), counts.tolist(), strict=True):
                entry = self._segments[sid]
                entry.live_rows -= count
                if entry.live_rows == 0:
                    self._dead.add(sid)
        self._segment_of[slots] = segment_id
        self._row_of[slots] = np.arange(first_row, rows, dtype=np.int32)
        self._segments[segment_id] = _Segment(path=ref.path, live_rows=len(slots))
        self._segment_ids[ref.path] = segment_id

    # --- samples -------------------------------------------------------------------

    @property
    def size(self) -> int:
        return min(self._next_key, self.capacity)

    def sample(self, batch_size: int, num_batches: int, *, timeout_s: float) -> list[SampledBatch]:
        """Draw `num_batches` batches uniformly, waiting up to `timeout_s` for data.

        Raises:
            SampleTimeout: not enough data, or the limiter held sampling back.
            BufferClosed: the job has ended.
        """
        num_items = batch_size * num_batches
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise BufferClosed(f"job {self.job_id} has ended")
                if self.size >= batch_size and self.limiter.can_sample(num_items):
                    break
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise SampleTimeout(
                        f"no sample within {timeout_s}s (size {self.size}, "
                        f"limiter {self.limiter.state()})"
                    )
                self._cond.wait(remaining)
            slots = self._rng.integers(0, self.size, size=(num_batches, batch_size))
            batches = [self._batch(row_slots) for row_slots in slots]
            now = self._clock()
            for sid in np.unique(self._segment_of[slots]).tolist():
                self._segments[sid].last_sampled_s = now
            self.limiter.sampled += num_items
            self._cond.notify_all()
        return batches

    def _batch(self, slots: np.ndarray) -> SampledBatch:
        segment_ids = self._segment_of[slots]
        order = np.argsort(segment_ids, kind="stable")
        slots, segment_ids = slots[order], segment_ids[order]
        keys = self._key_of(slots)
        rows = self._row_of[slots]
        bounds = np.flatnonzero(np.diff(segment_ids)) + 1
        segments = [
            SampledSegment(path=self._segments[int(ids[0])].path, rows=part.tolist())
            for ids, part in zip(np.split(segment_ids, bounds), np.split(rows, bounds), strict=True)
        ]
        return SampledBatch(keys=keys.tolist(), segments=segments, weights=[1.0] * len(slots))

    def _key_of(self, slots: np.ndarray) -> np.ndarray:
        # The newest key in each slot: keys of the last full turn of the ring.
        base = self._next_key - self._next_key % self.capacity
        keys = base + slots
        return np.where(keys >= self._next_key, keys - self.capacity, keys)

    def update_priorities(self, keys: list[int], priorities: list[float]) -> int:
        """Uniform replay keeps no priorities; returns how many keys are still live."""
        if len(keys) != len(priorities):
            raise ValueError(f"{len(keys)} keys but {len(priorities)} priorities")
        with self._cond:
            lo = self._next_key - self.size
            return int(sum(lo <= k < self._next_key for k in keys))

    # --- lifecycle -------------------------------------------------------------------

    def _release_dead(self) -> None:
        """Delete the files of fully evicted segments no recent sample points at."""
        if not self._dead:
            return
        cutoff = self._clock() - self._release_grace_s
        for sid in [s for s in self._dead if self._segments[s].last_sampled_s <= cutoff]:
            entry = self._segments.pop(sid)
            del self._segment_ids[entry.path]
            self._dead.discard(sid)
            self._files.delete(entry.path)
            self._released += 1

    def collect_garbage(self) -> None:
        """Release what the grace period held back (called periodically)."""
        with self._cond:
            self._release_dead()

    def close(self) -> None:
        """End of job: wake every waiter and refuse further inserts and samples."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> BufferStats:
        with self._cond:
            inserted, sampled = self.limiter.inserted, self.limiter.sampled
            return BufferStats(
                size=self.size,
                capacity=self.capacity,
                inserts=inserted,
                samples=sampled,
                evictions=self._evictions,
                live_segments=len(self._segments) - len(self._dead),
                released_segments=self._released,
                samples_per_insert_ratio=sampled / inserted if inserted else None,
                limiter=self.limiter.state(),
            )
