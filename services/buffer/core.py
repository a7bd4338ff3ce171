"""A job's replay buffer: an index of items in segment files, a sampler, a remover,
a rate limiter, and the segments' reference counts. No Flask.

One class in one module on purpose (over 1,100 lines): one condition guards the item
table, the segments' counts, the holds, the limiter and what a cut or a delta saves,
and every method's correctness is a statement about all of them at once (an insert
decided again in the hold of the lock that indexes it; a cut that saves holds and
segments as one instant). The parts that need no lock are modules beside it: the
table (table.py), samplers and removers (selectors.py, sumtree.py), the limiter
(limiter.py), the snapshot file (snapshot.py).

The bytes stay on the shared file system; for each item the buffer keeps which
segment and rows it lives in, the policy version that collected it, how often it was
sampled, and its priority. Samplers and removers are values (selectors.py); the rate
limiter makes the faster side wait (limiter.py).

Segments are reference-counted: when every item of a segment has left the buffer and
no sample handed out in the last `release_grace_s` points at it, the file is deleted,
so disk use stays bounded by the capacity.

Usage::

    buffer = ReplayBuffer("job-1", config, store, error_buffer=..., seed=0)
    buffer.insert([segment_ref], timeout_s=2.0)        # may raise RateLimited
    batches = buffer.sample(64, 8, timeout_s=5.0)      # may raise SampleTimeout
    buffer.update_priorities(keys, priorities)
    buffer.set_learner_version(12)                     # staleness eviction
    taken = buffer.cut(at_cut=lambda: my_record())     # one instant; the lock held briefly
    change = buffer.delta()                            # what changed since the last cut
    buffer.restore_snapshot(taken.data, taken.meta, deltas=[(change.data, change.meta)])

The coordinator persists a buffer through `cut`, `delta` and `restore_snapshot`
(services/coordinator/persistence.py; the files: services/coordinator/snapshot.py).
`save` and `restore` write and read one whole state as a file pair; only the tests
use them.

This module is one class of about 900 lines, on purpose: inserts, samples, holds, a
job's end and snapshots all read and change the same state (the item table, the
segments and their reference counts, the holds, the counters, the random state) under
one condition, and each keeps what the others rely on: a segment's live items count
its items in the table and those held; a cut and the deltas after it see every write;
a restore rebuilds the counts the other methods keep. Split over modules, these parts
would share the class's private state. What stands alone is a module already:
table.py (the item columns and their change journal), selectors.py (samplers and
removers), limiter.py, sumtree.py, snapshot.py (a snapshot file's bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import random
import re
import secrets
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from common.array_bodies import SampledItems, ShardState, batch_then_segment
from common.config import ReplayBufferConfig
from common.messages import BufferStats, InsertReply, SampledBatch, SegmentRef
from services.buffer.limiter import RateLimiter
from services.buffer.selectors import make_remover, make_sampler
from services.buffer.snapshot import ArrayFileBuilder
from services.buffer.table import COLUMNS, ItemTable, apply_changes, squash, undo

LAG_BUCKETS = 32
#: Live items over which `stats` computes its means and extremes exactly; above it,
#: that many drawn at random.
STATS_SAMPLE = 65_536
#: The snapshot format `cut` writes: 2 saves no free list, arrival order or per-segment
#: item counts (derived at restore) and keeps the segments' paths in the arrays.
SNAPSHOT_FORMAT = 2
_SEGMENT = re.compile(r"^(?P<job>[^/]+)/segments/(?P<worker>[^/]+)/(?P<seq>\d{1,12})\.safetensors$")


T = TypeVar("T")
#: Consecutive segments of one collector that go to the same shard.
SEGMENTS_PER_SHARD = 16


def segment_shard(path: str, shards: int) -> int:
    """Which of a job's `shards` indexes a segment (sharding.py): a collector's
    segments go to one shard in runs of `SEGMENTS_PER_SHARD`, then to the next, each
    collector starting at a shard of its own (a hash of its folder's name). An insert
    then mostly goes to one shard, and every shard gets its share of a job's segments
    however few collectors it has.

    Raises:
        ValueError: not a segment's path.
    """
    match = _SEGMENT.match(path)
    if match is None:
        raise ValueError(f"path '{path}' is not '<job>/segments/<worker_id>/<seq>.safetensors'")
    return _shard_of(match, shards)


def _shard_of(match: re.Match[str], shards: int) -> int:
    """`segment_shard` of a path `_SEGMENT` matched."""
    if shards == 1:
        return 0
    run = int(match["seq"]) // SEGMENTS_PER_SHARD
    return (zlib.crc32(match["worker"].encode()) + run) % shards


#: Seconds an insert refused because `max_waiting_inserts` were waiting is told to wait
#: before it tries again (jittered by 0.5-1.5x, so the refused do not come back together).
FULL_RETRY_S = 0.25


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
    """Where segment files are deleted (the shared store)."""

    def delete(self, rel: str) -> bool: ...

    def write_bytes(self, rel: str, data: bytes | memoryview) -> Any: ...

    def read_bytes(self, rel: str) -> bytes: ...


@dataclass
class _Segment:
    path: str
    live_items: int
    last_sampled_s: float = float("-inf")


@dataclass
class _Hold:
    """Items a consuming sampler handed to one task, kept until it acknowledges them:
    out of the table, but still counted in their segments (whose files stay)."""

    holder: str
    segment: np.ndarray
    row: np.ndarray
    length: np.ndarray
    version: np.ndarray


_HOLD_COLUMNS = ("segment", "row", "length", "version")
#: Holds, segments and dead segment ids as a snapshot's cut found them.
_Containers = tuple[list[_Hold], dict[int, _Segment], set[int]]


@dataclass(frozen=True)
class InsertResult:
    #: Segments this insert indexed (`accepted_refs`: theirs, to count).
    accepted: int
    #: Segments indexed before (a retry of an answered insert): left as they were.
    duplicates: int
    accepted_refs: list[SegmentRef]
    #: Segments the orphan sweep had found on disk and indexed while their writer's
    #: insert was on its way (a buffer process starting): the insert's own, indexed
    #: once, already counted. Its sender is answered them as accepted, not duplicates.
    claimed: int = 0

    def reply(self, env_steps: int) -> InsertReply:
        """What its sender is answered: the segments now in the buffer because of it
        (`accepted`, claimed ones included), the repeats, the job's env steps."""
        return InsertReply(
            accepted=self.accepted + self.claimed, duplicates=self.duplicates, env_steps=env_steps
        )


@dataclass(frozen=True)
class BufferSnapshot(Generic[T]):
    """The buffer's whole state at one instant (its cut)."""

    #: The arrays, as safetensors bytes (a memoryview: write it, hash it, or `bytes()` it).
    data: memoryview
    #: The rest, as JSON data naming the arrays' digest.
    meta: dict[str, Any]
    #: What the caller's `at_cut` returned (None without one).
    at_cut: T | None
    #: The longest the buffer's lock was held for it, and how long it took in all.
    longest_lock_hold_s: float
    duration_s: float


@dataclass
class _Counters:
    sample_requests: int = 0
    evictions: dict[str, int] = field(
        default_factory=lambda: {"capacity": 0, "max_use": 0, "staleness": 0}
    )
    released_segments: int = 0


def sequence_windows(
    starts: np.ndarray, lengths: np.ndarray, sequence_length: int, overlap: int
) -> tuple[np.ndarray, np.ndarray]:
    """(first row, rows) of the sequence items of episodes at `starts` of `lengths`
    rows: windows of `sequence_length` rows, each starting `sequence_length - overlap`
    rows after the one before, as many as cover the episode; an episode's last window
    may be shorter, and one no longer than `sequence_length` is one window. Every row
    is in some window, and no window crosses an episode's end."""
    stride = sequence_length - overlap
    first: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for start, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        # A window starting at `o` adds rows past the one before while o < length - overlap.
        offsets = np.arange(0, max(length - overlap, 1), stride, dtype=np.int64)
        first.append(start + offsets)
        rows.append(np.minimum(sequence_length, length - offsets))
    if not first:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(first).astype(np.int32), np.concatenate(rows).astype(np.int32)


class ReplayBuffer:
    """Thread-safe; inserts and sample requests wait on one condition."""

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
        shard: int = 0,
        max_waiting_inserts: int = 0,
    ) -> None:
        self.job_id = job_id
        #: Inserts the rate limiter may hold waiting at once (0: no bound); one more that
        #: would wait is answered `RateLimited` at once. Each waiting insert holds a
        #: serving thread: unbounded, they took every one and the learner's sample,
        #: the one request that lets them go, found none (32 collectors on 16 threads).
        self.max_waiting_inserts = max_waiting_inserts
        self.config = config
        self.capacity = config.replay_buffer_size
        #: Which of the job's `config.shards` buffers this is: it holds the segments
        #: `segment_shard` gives it (sharding.py).
        self.shard = shard
        self.table = ItemTable(self.capacity, shard=shard, shards=config.shards)
        self.sampler = make_sampler(config)
        self.remover = make_remover(config)
        self.limiter = RateLimiter(
            config.samples_per_insert, config.min_size_to_sample, error_buffer
        )
        self._files = files
        self._clock = clock
        self._release_grace_s = release_grace_s
        self._rng = np.random.default_rng(seed)
        self._cond = threading.Condition()
        self._closed = False
        self._segments: dict[int, _Segment] = {}
        # Segments added and removed since the last cut (what a delta saves of them).
        self._segments_added: dict[int, str] = {}
        self._segments_removed: set[int] = set()
        self._segment_ids: dict[str, int] = {}
        self._next_segment_id = 0
        # Highest accepted sequence number per collector folder: a re-sent segment whose
        # items already left the buffer is still recognised as a duplicate.
        self._last_seq: dict[str, int] = {}
        # Paths the orphan sweep indexed (a forced insert) that no insert has named
        # since: the first insert naming one claims it (`InsertResult.claimed`). Bounded
        # by the segments held: a path leaves with its segment.
        self._unclaimed: set[str] = set()
        self._dead: set[int] = set()
        self._learner_version = 0
        # Sampled items by policy lag (learner version - collecting version), the last
        # bucket holding LAG_BUCKETS and more.
        self._lag_counts = np.zeros(LAG_BUCKETS + 1, dtype=np.int64)
        self._counters = _Counters()
        self._waiting = {"sample": 0, "insert": 0}
        self._holds: dict[str, _Hold] = {}
        # Hold ids name this buffer's life too: a restarted buffer process (its holds
        # given back at restore) never hands out an id a learner may still acknowledge.
        self._hold_prefix = f"hold-{secrets.token_hex(4)}-"
        self._next_hold = 0
        self._inserted_env_steps = 0
        # The last snapshot's buffer: the next one writes over it if nobody holds it.
        self._snapshot_spare: np.ndarray | None = None

    @property
    def size(self) -> int:
        return self.table.size

    @property
    def sampled_lag_histogram(self) -> list[int]:
        """Sampled items by policy lag (`BufferStats.sampled_lag_histogram`), a
        counter read without computing the rest of the stats."""
        with self._cond:
            return self._lag_counts.tolist()

    @property
    def inserted_env_steps(self) -> int:
        """Env steps of every segment accepted so far (forced inserts too; a duplicate
        counts once), saved with the buffer: a snapshot's value is that of its cut."""
        with self._cond:
            return self._inserted_env_steps

    # --- inserts -------------------------------------------------------------------

    def insert_would_wait(self, num_items: int) -> bool:
        """Whether the rate limiter holds an insert of `num_items` items now."""
        with self._cond:
            return not self.limiter.can_insert(num_items)

    def insert(
        self, refs: list[SegmentRef], *, timeout_s: float = 0.0, force: bool = False
    ) -> InsertResult:
        """Index the items of `refs`; a path seen before counts once.

        Args:
            force: skip the rate limiter (re-indexing files found on disk after a restart:
                that data was already collected, and waiting would only stall recovery).

        Raises:
            ValueError: a path is not a segment of this job, or its episodes are wrong.
            RateLimited: the limiter did not allow it within `timeout_s`.
            BufferClosed: the job has ended.
        """
        parsed = [(ref, self._parse_path(ref.path), self._item_spans(ref)) for ref in refs]
        deadline = self._clock() + timeout_s
        with self._cond:

            def fresh_refs() -> dict[str, tuple[SegmentRef, tuple[str, int], Any]]:
                return {
                    ref.path: (ref, key, spans)
                    for ref, key, spans in parsed
                    if not self._is_duplicate(*key, ref.path)
                }

            fresh = fresh_refs()
            num_items = sum(len(spans[0]) for _, _, spans in fresh.values())
            if not force and fresh:

                def can_insert() -> bool:
                    return self.limiter.can_insert(num_items)

                if self._insert_waits_full() and not can_insert():
                    raise RateLimited(retry_after_s=random.uniform(0.5, 1.5) * FULL_RETRY_S)
                self._wait("insert", can_insert, deadline)
                # Waiting let go of the lock: another insert, or the orphan sweep, may
                # have indexed some of these since. Decide again, in this same hold
                # of the lock as the index update, so no file is ever indexed twice.
                fresh = fresh_refs()
                num_items = sum(len(spans[0]) for _, _, spans in fresh.values())
            for ref, (worker, seq), (rows, lengths) in fresh.values():
                self._add_segment(ref, rows, lengths)
                self._last_seq[worker] = max(seq, self._last_seq.get(worker, -1))
                self._inserted_env_steps += ref.env_steps
            if force:
                self._unclaimed.update(fresh)
                claimed = 0
            else:
                claimed = self._claim(ref.path for ref in refs if ref.path not in fresh)
            self.limiter.inserted += num_items
            self._release_dead()
            self._cond.notify_all()
        return InsertResult(
            accepted=len(fresh),
            duplicates=len(refs) - len(fresh) - claimed,
            accepted_refs=[ref for ref, _, _ in fresh.values()],
            claimed=claimed,
        )

    def _claim(self, paths: Iterable[str]) -> int:
        """Take the sweep's unclaimed paths among `paths` (held under the condition)."""
        if not self._unclaimed:
            return 0
        claimed = self._unclaimed.intersection(paths)
        self._unclaimed -= claimed
        return len(claimed)

    def _insert_waits_full(self) -> bool:
        """Whether `max_waiting_inserts` inserts are waiting for the limiter now."""
        bound = self.max_waiting_inserts
        return bool(bound) and self._waiting["insert"] >= bound

    def _wait(self, side: str, ready: Callable[[], bool], deadline: float) -> None:
        """Wait (holding the condition) until `ready()`, the deadline, or close."""
        self._waiting[side] += 1
        try:
            while True:
                if self._closed:
                    raise BufferClosed(f"job {self.job_id} has ended")
                if ready():
                    return
                remaining = deadline - self._clock()
                if remaining <= 0:
                    if side == "insert":
                        raise RateLimited(retry_after_s=0.05)
                    raise SampleTimeout(
                        f"no sample before the deadline (size {self.size}, "
                        f"inserted {self.limiter.inserted}, sampled {self.limiter.sampled})"
                    )
                self._cond.wait(remaining)
        finally:
            self._waiting[side] -= 1

    def _parse_path(self, path: str) -> tuple[str, int]:
        match = _SEGMENT.match(path)
        if match is None or match["job"] != self.job_id:
            raise ValueError(
                f"path '{path}' is not '{self.job_id}/segments/<worker_id>/<seq>.safetensors'"
            )
        shard = _shard_of(match, self.config.shards)
        if shard != self.shard:
            raise ValueError(
                f"path '{path}' belongs to shard {shard} of {self.config.shards}, not {self.shard}"
            )
        return match["worker"], int(match["seq"])

    def owns(self, path: str) -> bool:
        """Whether a segment path of this job is this shard's (one that is no segment's
        name is shard 0's, to sweep)."""
        match = _SEGMENT.match(path)
        if match is None:
            return self.shard == 0
        return _shard_of(match, self.config.shards) == self.shard

    def _item_spans(self, ref: SegmentRef) -> tuple[np.ndarray, np.ndarray]:
        """(first row, rows) of each item of a segment."""
        if self.config.item == "transition":
            return np.arange(ref.rows, dtype=np.int32), np.ones(ref.rows, dtype=np.int32)
        if not ref.episodes:
            raise ValueError(f"{ref.path}: an episode buffer needs the segment's episodes")
        spans = np.asarray(ref.episodes, dtype=np.int64)
        starts, lengths = spans[:, 0], spans[:, 1]
        if (starts + lengths > ref.rows).any():
            raise ValueError(f"{ref.path}: an episode runs past the segment's {ref.rows} rows")
        order = np.argsort(starts)
        if (starts[order][1:] < (starts + lengths)[order][:-1]).any():
            raise ValueError(f"{ref.path}: episodes overlap")
        if self.config.item == "sequence":
            return sequence_windows(
                starts, lengths, self.config.sequence_length, self.config.overlap
            )
        return starts.astype(np.int32), lengths.astype(np.int32)

    def classify(self, path: str) -> str:
        """What the buffer makes of a segment file: "known" (indexed now), "stale"
        (its collector has moved past it: an old or released file), or "new"."""
        worker, seq = self._parse_path(path)
        with self._cond:
            if path in self._segment_ids:
                return "known"
            return "stale" if seq <= self._last_seq.get(worker, -1) else "new"

    def _is_duplicate(self, worker: str, seq: int, path: str) -> bool:
        return path in self._segment_ids or seq <= self._last_seq.get(worker, -1)

    def _add_segment(self, ref: SegmentRef, rows: np.ndarray, lengths: np.ndarray) -> None:
        table = self.table
        n = len(rows)
        if n > self.capacity:  # keep the newest items of a segment bigger than the buffer
            rows, lengths, n = rows[-self.capacity :], lengths[-self.capacity :], self.capacity
        shortfall = n - table.free_count
        if shortfall > 0:
            # The freed slots are handed out again just below (the free list is a
            # stack), where `sampler.inserted` overwrites their weights: skip one update.
            evicted = self.remover.select(shortfall, table, self._rng)
            self._remove(evicted, "capacity", tell_sampler=False)
        segment_id = self._next_segment_id
        self._next_segment_id += 1
        slots, _ = table.add(n)
        table.write("segment", slots, segment_id)
        table.write("row", slots, rows)
        table.write("length", slots, lengths)
        table.write("version", slots, ref.policy_version)
        table.write("priority", slots, getattr(self.sampler, "max_priority", 1.0))
        self.sampler.inserted(slots)
        self._segments[segment_id] = _Segment(path=ref.path, live_items=n)
        self._segments_added[segment_id] = ref.path
        self._segment_ids[ref.path] = segment_id
        if self.config.max_staleness is not None:
            stale = ref.policy_version < self._learner_version - self.config.max_staleness
            if stale:
                self._remove(slots, "staleness")

    def _remove(self, slots: np.ndarray, reason: str, *, tell_sampler: bool = True) -> None:
        if len(slots) == 0:
            return
        table = self.table
        self._counters.evictions[reason] += len(slots)
        self._unref_segments(table.segment[slots])
        if tell_sampler:
            self.sampler.removed(slots)
        table.remove(slots)

    # --- samples -------------------------------------------------------------------

    def sample(self, batch_size: int, num_batches: int, *, timeout_s: float) -> list[SampledBatch]:
        """Draw `num_batches` batches, waiting up to `timeout_s` for data and the limiter.

        Raises:
            SampleTimeout: not enough data, or the limiter held sampling back.
            BufferClosed: the job has ended.
        """
        return self.sample_for(None, batch_size, num_batches, timeout_s=timeout_s).reply().batches

    def sample_for(
        self,
        holder: str | None,
        batch_size: int,
        num_batches: int,
        *,
        timeout_s: float,
        items: int | None = None,
    ) -> SampledItems:
        """`sample` on behalf of `holder` (a learn task): the items a consuming sampler
        hands out are held for it until `acknowledge`, and go back to the buffer with
        `give_back` if it never trains on them. Returns the items as arrays, with the
        hold's id (None when nothing is held: a non-consuming sampler, or no holder).

        `items`: this shard's part of a draw over all of a job's shards (sharding.py):
        that many items, as one batch, while the draw's `num_batches` count toward
        the annealing of importance weights as they would in one table (a consuming
        buffer waits for all of them, as for a whole request)."""
        if items == 0:
            with self._cond:
                if self._closed:
                    raise BufferClosed(f"job {self.job_id} has ended")
                return self._draw(0, 1, counted_batches=0)
        if items is not None:
            batch_size, counted_batches = items, num_batches
            need = items if self.sampler.consumes else 1
            num_batches = 1
        else:
            counted_batches = num_batches
            need = batch_size * num_batches if self.sampler.consumes else batch_size
        num_items = batch_size * num_batches
        deadline = self._clock() + timeout_s
        with self._cond:
            self._wait(
                "sample",
                lambda: (
                    self.sampler.available(self.table) >= need
                    and self.limiter.can_sample(num_items)
                ),
                deadline,
            )
            hold_id = None
            if holder is not None and self.sampler.consumes:
                hold_id = f"{self._hold_prefix}{self._next_hold}"
                self._next_hold += 1
            items = self._draw(batch_size, num_batches, hold_id, holder, counted_batches)
            self.limiter.sampled += num_items
            self._counters.sample_requests += 1
            self._cond.notify_all()
        return items

    def acknowledge(self, holder: str, hold_ids: list[str]) -> int:
        """`holder` trained on these holds: their items leave for good. Unknown ids, or
        another holder's, are ignored (an acknowledgement may be sent twice).

        Returns:
            How many items were acknowledged.
        """
        with self._cond:
            done = 0
            for hold_id in hold_ids:
                hold = self._holds.get(hold_id)
                if hold is None or hold.holder != holder:
                    continue
                del self._holds[hold_id]
                self._counters.evictions["max_use"] += len(hold.segment)
                self._unref_segments(hold.segment)
                done += len(hold.segment)
            self._release_dead()
            return done

    def close_holds(self, holder: str, *, trained: list[str], untrained: list[str]) -> None:
        """What a sample request says of `holder`'s earlier holds: it trained on the
        items of `trained` (they leave), and will not on those of `untrained` (they go
        back to the queue)."""
        if trained:
            self.acknowledge(holder, trained)
        if untrained:
            self.give_back(holder, untrained)

    def give_back(self, holder: str, hold_ids: list[str] | None = None) -> int:
        """Every item still held for `holder` returns to the buffer (its task ended
        before training on them), so nothing a collector delivered is lost; with
        `hold_ids`, only those holds' (a draw over shards that failed on another
        shard gives its parts back). Unknown ids, or another holder's, are ignored.

        Returns:
            How many items came back.
        """
        with self._cond:
            ids = [
                h
                for h, hold in self._holds.items()
                if hold.holder == holder and (hold_ids is None or h in hold_ids)
            ]
            returned = 0
            for hold_id in ids:
                hold = self._holds.pop(hold_id)
                returned += self._readd(hold.segment, hold.row, hold.length, hold.version)
            if returned:
                self._cond.notify_all()
            return returned

    def _readd(
        self, segment: np.ndarray, row: np.ndarray, length: np.ndarray, version: np.ndarray
    ) -> int:
        """Put held items back as new items (the newest), undoing their sample."""
        n = len(segment)
        if n == 0:
            return 0
        if n > self.capacity:
            self._unref_segments(segment[: n - self.capacity])
            segment, row, length, version = (
                a[-self.capacity :] for a in (segment, row, length, version)
            )
            n = self.capacity
        shortfall = n - self.table.free_count
        if shortfall > 0:
            self._remove(self.remover.select(shortfall, self.table, self._rng), "capacity")
        slots, _ = self.table.add(n)
        self.table.write("segment", slots, segment)
        self.table.write("row", slots, row)
        self.table.write("length", slots, length)
        self.table.write("version", slots, version)
        self.table.write("priority", slots, getattr(self.sampler, "max_priority", 1.0))
        self.sampler.inserted(slots)
        self.limiter.sampled = max(0, self.limiter.sampled - n)
        if self.config.max_staleness is not None:
            # Items the learner has moved past while they were held leave as stale.
            limit = self._learner_version - self.config.max_staleness
            self._remove(slots[self.table.version[slots] < limit], "staleness")
            self._release_dead()
        return n

    def _unref_segments(self, segment_ids: np.ndarray) -> None:
        """Items of these segments left the buffer: a segment with none left is dead."""
        ids, counts = np.unique(segment_ids, return_counts=True)
        for sid, count in zip(ids.tolist(), counts.tolist(), strict=True):
            entry = self._segments[sid]
            entry.live_items -= count
            if entry.live_items == 0:
                self._dead.add(sid)

    def _draw(
        self,
        batch_size: int,
        num_batches: int,
        hold_id: str | None = None,
        holder: str = "",
        counted_batches: int | None = None,
    ) -> SampledItems:
        """All of a request's items in one vectorized draw, then put in batches."""
        table = self.table
        if batch_size * num_batches:
            slots, weights = self.sampler.sample(batch_size * num_batches, table, self._rng)
        else:  # a shard asked only for its state
            slots, weights = np.empty(0, np.int64), np.empty(0, np.float32)
        # What the weights were normalized by, for a draw over shards to renormalize.
        weight_scale = self.sampler.weight_scale()
        self.sampler.batches_drawn += num_batches if counted_batches is None else counted_batches
        rows, lengths = table.row[slots], table.length[slots]
        sequence_length = self.config.sequence_length
        if self.config.item == "episode":
            # A sub-sequence inside the episode: it never crosses into another one.
            room = np.maximum(lengths - sequence_length, 0) + 1
            rows = rows + (self._rng.random(len(slots)) * room).astype(np.int32)
            lengths = np.minimum(lengths, sequence_length)
        keys = table.key[slots]
        segment_ids = table.segment[slots]
        lag = np.clip(self._learner_version - table.version[slots], 0, LAG_BUCKETS)
        self._lag_counts += np.bincount(lag, minlength=LAG_BUCKETS + 1)
        used, times = np.unique(slots, return_counts=True)
        table.write("uses", used, table.uses[used] + times.astype(np.int32))
        if hold_id is not None:
            table = self.table
            self._holds[hold_id] = _Hold(
                holder, *(getattr(table, c)[slots].copy() for c in _HOLD_COLUMNS)
            )
            self.sampler.removed(slots)
            table.remove(slots)
        elif self.sampler.consumes:
            self._remove(slots, "max_use")
        elif self.config.max_use is not None:
            self._remove(used[table.uses[used] >= self.config.max_use], "max_use")
        items = self._group(batch_size, keys, segment_ids, rows, lengths, weights, hold_id)
        # A shard short of its first `min_size_to_sample` items is given no part of the
        # next draw: asked for its state only, until it has them.
        warm = table.size and self.limiter.can_sample(1)
        items.shard = ShardState(
            mass=self.sampler.mass(table) if warm else 0.0,
            consumes=self.sampler.consumes,
            min_weight=weight_scale[0] if np.isfinite(weight_scale[0]) else 1.0,
            beta=weight_scale[1],
        )
        return items

    def _group(
        self,
        batch_size: int,
        keys: np.ndarray,
        segment_ids: np.ndarray,
        rows: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray,
        hold_id: str | None,
    ) -> SampledItems:
        """The drawn items in batches of `batch_size`, each batch's items grouped by
        segment (a learner reads each segment once), all batches in one vectorized pass;
        keys and weights follow the same order. Each sampled segment's `last_sampled_s`
        is set here (its file outlives its items a while after that)."""
        if len(keys) == 0:
            return SampledItems.empty(hold_id)
        order = batch_then_segment(segment_ids, batch_size)
        used, index = np.unique(segment_ids, return_inverse=True)
        now = self._clock()
        paths = []
        for sid in used.tolist():
            entry = self._segments[sid]
            entry.last_sampled_s = now
            paths.append(entry.path)
        return SampledItems(
            batch_size=batch_size,
            keys=keys[order],
            weights=weights[order],
            segment=index.reshape(-1)[order].astype(np.int32),
            rows=rows[order],
            lengths=lengths[order] if self.config.item != "transition" else None,
            paths=paths,
            hold_id=hold_id,
        )

    def update_priorities(self, keys: list[int], priorities: list[float]) -> int:
        """New priorities by key; keys of items that already left are ignored.

        Returns:
            How many keys were still live.
        """
        if len(keys) != len(priorities):
            raise ValueError(f"{len(keys)} keys but {len(priorities)} priorities")
        values = np.asarray(priorities, dtype=np.float64)
        if (values < 0).any() or not np.isfinite(values).all():
            raise ValueError("priorities must be finite and non-negative")
        with self._cond:
            slots, live = self.table.slots_of(np.asarray(keys, dtype=np.int64))
            values = values[live] + self.config.priority_eps
            self.table.write("priority", slots, values)
            self.sampler.update(slots, values)
            return len(slots)

    def set_elsewhere(self, inserted: int, sampled: int) -> None:
        """The job's other shards' items inserted and sampled, as last relayed: the
        rate limiter keeps the job's ratio (limiter.py)."""
        with self._cond:
            self.limiter.elsewhere_inserted, self.limiter.elsewhere_sampled = inserted, sampled
            self._cond.notify_all()  # a side held back may go now

    def set_learner_version(self, version: int) -> int:
        """The learner's newest policy version; evicts items now too stale.

        Returns:
            How many items were evicted.
        """
        with self._cond:
            self._learner_version = max(self._learner_version, version)
            limit = self.config.max_staleness
            if limit is None:
                return 0
            table = self.table
            stale = np.flatnonzero(
                (table.key >= 0) & (table.version < self._learner_version - limit)
            )
            self._remove(stale, "staleness")
            self._release_dead()
            self._cond.notify_all()
            return len(stale)

    # --- lifecycle -------------------------------------------------------------------

    def _release_dead(self, *, grace_s: float | None = None) -> None:
        """Delete the files of segments with no items left and no recent sample."""
        if not self._dead:
            return
        cutoff = self._clock() - (self._release_grace_s if grace_s is None else grace_s)
        for sid in [s for s in self._dead if self._segments[s].last_sampled_s <= cutoff]:
            entry = self._segments.pop(sid)
            if self._segments_added.pop(sid, None) is None:
                self._segments_removed.add(sid)
            # Total: the path leaves the index only if it still names this segment.
            if self._segment_ids.get(entry.path) == sid:
                del self._segment_ids[entry.path]
                self._unclaimed.discard(entry.path)
            self._dead.discard(sid)
            self._files.delete(entry.path)
            self._counters.released_segments += 1

    def collect_garbage(self) -> None:
        """Release what the grace period held back (called periodically)."""
        with self._cond:
            self._release_dead()

    def close(self) -> None:
        """End of job: wake every waiter and refuse further inserts and samples."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def release_all(self) -> None:
        """After the job: delete every segment file the buffer still references."""
        with self._cond:
            self._closed = True
            self._holds.clear()
            self._dead.update(self._segments)
            self._release_dead(grace_s=float("-inf"))
            self._cond.notify_all()

    def final_stats(self) -> BufferStats:
        """The stats of a closed buffer as `release_all` leaves them (every segment
        released): what an ended job records before its files are deleted."""
        with self._cond:
            stats = self.stats()
            released = self._counters.released_segments + len(self._segments)
        return dataclasses.replace(stats, live_segments=0, released_segments=released)

    def stats(self) -> BufferStats:
        """Counters, and use, staleness and priority over the live items: exact up to
        `STATS_SAMPLE` items, estimated from that many drawn at random above it, so
        reading stats never holds the buffer for time that grows with its size."""
        with self._cond:
            table = self.table
            if table.size <= STATS_SAMPLE:
                live = table.live_slots()
            else:
                # A fixed seed: stats never move the sampler's random state.
                drawn = np.random.default_rng(table.counter).integers(
                    0, table.capacity, 2 * STATS_SAMPLE
                )
                live = drawn[table.key[drawn] >= 0][:STATS_SAMPLE]
            uses = table.uses[live]
            lag = self._learner_version - table.version[live]
            priority = table.priority[live]
            inserted, sampled = self.limiter.inserted, self.limiter.sampled
            prioritized = self.config.type == "prioritized" and len(live) > 0
            return BufferStats(
                size=table.size,
                capacity=self.capacity,
                sampler=self.config.type,
                eviction=self.config.eviction,
                item=self.config.item,
                inserts=inserted,
                samples=sampled,
                sample_requests=self._counters.sample_requests,
                evictions=dict(self._counters.evictions),
                use_count_mean=float(uses.mean()) if len(live) else 0.0,
                use_count_max=int(uses.max()) if len(live) else 0,
                learner_version=self._learner_version,
                staleness_mean=float(lag.mean()) if len(live) else 0.0,
                staleness_max=int(lag.max()) if len(live) else 0,
                sampled_lag_histogram=self._lag_counts.tolist(),
                priority_min=float(priority.min()) if prioritized else None,
                priority_mean=float(priority.mean()) if prioritized else None,
                priority_max=float(priority.max()) if prioritized else None,
                samples_per_insert_ratio=sampled / inserted if inserted else None,
                limiter=self.limiter.state(),
                can_sample=self.limiter.can_sample(1) and table.size > 0,
                can_insert=self.limiter.can_insert(1),
                waiting_samplers=self._waiting["sample"],
                waiting_inserters=self._waiting["insert"],
                live_segments=len(self._segments) - len(self._dead),
                released_segments=self._counters.released_segments,
                held_items=sum(len(h.segment) for h in self._holds.values()),
            )

    # --- persistence -----------------------------------------------------------------

    def cut(
        self,
        at_cut: Callable[[], T] | None = None,
        *,
        cut_lock: AbstractContextManager[Any] | None = None,
    ) -> BufferSnapshot[T]:
        """The whole state at one instant (the cut), made while the buffer goes on.

        At the cut, under the buffer's lock, the small state is taken, `at_cut` is
        called, and a journal of column writes is opened. The columns are then copied
        without the lock; each write meanwhile first journals the values it overwrites,
        and undoing the journal on the copy gives the columns as they were at the cut.
        The lock is held twice, briefly (the cut, then closing the journal), never for
        time that grows with the buffer's size; serializing lets the GIL go.

        Args:
            at_cut: called at the cut with the buffer's lock held, to take the
                caller's own record in the same cut. It must take no lock that another
                thread may hold while it waits for the buffer's: pass such a lock as
                `cut_lock` instead.
            cut_lock: entered just before the buffer's lock at the cut and left just
                after it: a lock taken before the buffer's (the coordinator's), held
                only for the cut, not for the copy.

        Returns:
            The arrays as safetensors bytes, the JSON record that names their digest,
            and what `at_cut` returned.
        """
        started = time.perf_counter()
        with cut_lock if cut_lock is not None else contextlib.nullcontext(), self._cond:
            cut_at = time.perf_counter()
            meta, rest = self._cut_state()
            spare, self._snapshot_spare = self._snapshot_spare, None
            journal = self.table.open_journal()
            # The next `delta` saves what changes from this instant on.
            self.table.record_changes()
            self._segments_added, self._segments_removed = {}, set()
            try:
                record = at_cut() if at_cut is not None else None
            except BaseException:
                self.table.close_journal(journal)
                raise
            holds = [time.perf_counter() - cut_at]
        try:
            arrays = self._small_arrays(*rest)
            # Widest dtypes first: every array stays aligned.
            big = sorted(COLUMNS, key=lambda c: -getattr(self.table, c).dtype.itemsize)
            small = sorted(arrays, key=lambda name: -arrays[name].dtype.itemsize)
            if spare is not None and sys.getrefcount(spare) > 2:
                spare = None  # the last snapshot's bytes are still held (not only here)
            out = ArrayFileBuilder(
                {c: (getattr(self.table, c).dtype, self.capacity) for c in big}
                | {name: (arrays[name].dtype, len(arrays[name])) for name in small},
                spare,
            )
            del spare
            for name, array in arrays.items():
                out.arrays[name][:] = array
            for column in COLUMNS:
                # No lock: a slot written meanwhile may be copied torn, but every such
                # write is in the journal, which puts back the slot's value at the cut.
                np.copyto(out.arrays[column], getattr(self.table, column))
        finally:
            with self._cond:
                closed_at = time.perf_counter()
                self.table.close_journal(journal)
                holds.append(time.perf_counter() - closed_at)
        undo(journal, out.arrays)
        data = out.finish()
        meta["arrays_sha256"] = hashlib.sha256(data).hexdigest()
        self._snapshot_spare = out.buffer
        return BufferSnapshot(
            data=data,
            meta=meta,
            at_cut=record,
            longest_lock_hold_s=max(holds),
            duration_s=time.perf_counter() - started,
        )

    def delta(
        self,
        at_cut: Callable[[], T] | None = None,
        *,
        cut_lock: AbstractContextManager[Any] | None = None,
    ) -> BufferSnapshot[T] | None:
        """What changed since the last `cut` or `delta`, at one instant: each column's
        slots written and their last values, the segments added and removed, and the
        small state whole. Restoring the last `cut` and its deltas in order gives the
        state at the last delta. Costs what changed, not the buffer's size.

        Args:
            at_cut, cut_lock: as for `cut`.

        Returns:
            The delta, or None when there is no cut to build on (none was made, or the
            changes outgrew what is kept between snapshots): make a `cut` instead.
        """
        started = time.perf_counter()
        with cut_lock if cut_lock is not None else contextlib.nullcontext(), self._cond:
            cut_at = time.perf_counter()
            changes = self.table.take_changes()
            if changes is None:
                return None
            meta, (holds, _, dead) = self._cut_state(with_segments=False)
            added, self._segments_added = self._segments_added, {}
            removed, self._segments_removed = self._segments_removed, set()
            record = at_cut() if at_cut is not None else None
            hold_s = time.perf_counter() - cut_at
        arrays = squash(changes, self.capacity)
        arrays |= self._holds_arrays(holds)
        arrays |= _segment_arrays(added, prefix="added_")
        arrays["removed_segments"] = np.array(sorted(removed), dtype=np.int64)
        arrays["dead_segments"] = np.array(sorted(dead), dtype=np.int64)
        data = memoryview(st_save(arrays))
        meta["delta"] = True
        meta["changed"] = bool(changes or added or removed)
        meta["arrays_sha256"] = hashlib.sha256(data).hexdigest()
        return BufferSnapshot(
            data=data,
            meta=meta,
            at_cut=record,
            longest_lock_hold_s=hold_s,
            duration_s=time.perf_counter() - started,
        )

    def snapshot(self) -> tuple[memoryview, dict[str, Any]]:
        """`cut` without a record of the caller's: (arrays' bytes, JSON record)."""
        taken = self.cut()
        return taken.data, taken.meta

    def _cut_state(self, *, with_segments: bool = True) -> tuple[dict[str, Any], _Containers]:
        """(The JSON record, what the arrays are made from): what is not a column. Called
        with the lock held: copies of containers only, their contents read after (the
        segments only `with_segments`: a delta saves only their changes)."""
        meta = {
            "format": SNAPSHOT_FORMAT,
            "job_id": self.job_id,
            "capacity": self.capacity,
            "table": self.table.counters(),
            "next_segment_id": self._next_segment_id,
            "last_seq": dict(self._last_seq),
            "learner_version": self._learner_version,
            "lag_counts": self._lag_counts.tolist(),
            "limiter": {"inserted": self.limiter.inserted, "sampled": self.limiter.sampled},
            "sampler": self.sampler.state(),
            "counters": {
                "sample_requests": self._counters.sample_requests,
                "evictions": dict(self._counters.evictions),
                "released_segments": self._counters.released_segments,
            },
            "rng": self._rng.bit_generator.state,
            "inserted_env_steps": self._inserted_env_steps,
        }
        # Holds and a segment's path never change once made: shallow copies suffice.
        segments = self._segments.copy() if with_segments else {}
        return meta, (list(self._holds.values()), segments, set(self._dead))

    def _small_arrays(
        self, holds: list[_Hold], segments: dict[int, _Segment], dead: set[int]
    ) -> dict[str, np.ndarray]:
        """What a snapshot saves besides the columns: held items (saved as items to give
        back: a restored coordinator has no tasks, so nobody would acknowledge them),
        and each segment's id and path (its live items are counted again at restore)."""
        arrays = self._holds_arrays(holds)
        arrays |= _segment_arrays({sid: entry.path for sid, entry in segments.items()})
        arrays["dead_segments"] = np.array(sorted(dead), dtype=np.int64)
        return arrays

    def _holds_arrays(self, holds: list[_Hold]) -> dict[str, np.ndarray]:
        arrays = {}
        for column in _HOLD_COLUMNS:
            parts = [getattr(h, column) for h in holds]
            dtype = getattr(self.table, column).dtype
            arrays[f"held_{column}"] = np.concatenate(parts) if parts else np.zeros(0, dtype)
        return arrays

    def restore_snapshot(
        self,
        data: bytes | memoryview,
        meta: dict[str, Any],
        *,
        deltas: Sequence[tuple[bytes | memoryview, dict[str, Any]]] = (),
    ) -> None:
        """Load a state from `cut` or `snapshot`, and the `delta`s made after it in
        order, into this (empty, same-capacity) buffer. Snapshots of the first format
        (segments listed in the record, the free list and arrival order saved as
        arrays) are read too.

        Raises:
            ValueError: the arrays do not match their record, or it is another buffer's.
        """
        arrays = self._checked_arrays(data, meta)
        if deltas:
            # Writable columns and a segment map to apply the changes to.
            arrays = {name: np.array(a) for name, a in arrays.items()}
            segments = _segments_from(arrays)
            for delta_data, delta_meta in deltas:
                change = self._checked_arrays(delta_data, delta_meta)
                apply_changes(arrays, change)
                for sid in change["removed_segments"].tolist():
                    segments.pop(sid, None)
                segments |= _segments_from(change, prefix="added_")
                for name in ("dead_segments", *(f"held_{c}" for c in _HOLD_COLUMNS)):
                    arrays[name] = change[name]
                meta = delta_meta
            arrays |= _segment_arrays(segments)
        with self._cond:
            self.table.restore(arrays, meta["table"])
            if "segments" in meta:  # the first format
                segments = {
                    int(sid): _Segment(path=path, live_items=int(live))
                    for sid, path, live in meta["segments"]
                }
                dead = {int(s) for s in meta["dead"]}
            else:
                segments = self._restored_segments(arrays)
                dead = set(arrays["dead_segments"].tolist())
            self._segments = segments
            self._segment_ids = {s.path: sid for sid, s in self._segments.items()}
            self._unclaimed = set()
            self._dead = dead
            self._next_segment_id = int(meta["next_segment_id"])
            self._last_seq = {k: int(v) for k, v in meta["last_seq"].items()}
            self._learner_version = int(meta["learner_version"])
            self._lag_counts[:] = meta["lag_counts"]
            self.limiter.restore(**meta["limiter"])
            self.sampler.restore(meta["sampler"], self.table)
            counters = meta["counters"]
            self._counters = _Counters(
                sample_requests=int(counters["sample_requests"]),
                evictions={k: int(v) for k, v in counters["evictions"].items()},
                released_segments=int(counters["released_segments"]),
            )
            self._rng.bit_generator.state = meta["rng"]
            self._inserted_env_steps = int(meta.get("inserted_env_steps", 0))
            self._holds = {}
            if "held_segment" in arrays:
                self._readd(*(arrays[f"held_{c}"] for c in _HOLD_COLUMNS))

    def _checked_arrays(self, data: bytes | memoryview, meta: dict[str, Any]) -> dict:
        if hashlib.sha256(data).hexdigest() != meta["arrays_sha256"]:
            raise ValueError("buffer arrays do not match their record")
        if meta["capacity"] != self.capacity or meta["job_id"] != self.job_id:
            raise ValueError("buffer state saved for another buffer")
        if meta.get("format", 1) > SNAPSHOT_FORMAT:
            raise ValueError(f"buffer snapshot format {meta['format']} is not supported")
        return st_load(data if isinstance(data, bytes) else bytes(data))

    def _restored_segments(self, arrays: dict[str, np.ndarray]) -> dict[int, _Segment]:
        """Segments from their ids and paths; a segment's live items are its items in
        the table and those held (held ones are still counted in their segments).

        Raises:
            ValueError: an item names a segment the snapshot does not have.
        """
        ids = arrays["segment_ids"]
        paths = list(_segments_from(arrays).values())
        table = self.table
        owners = np.concatenate([table.segment[table.key >= 0], arrays["held_segment"]])
        where = np.searchsorted(ids, owners)
        if len(owners) and (where.max() >= len(ids) or (ids[where] != owners).any()):
            raise ValueError("buffer items name a segment the snapshot does not have")
        live = np.bincount(where, minlength=len(ids)).tolist()
        return {
            sid: _Segment(path=path, live_items=count)
            for sid, path, count in zip(ids.tolist(), paths, live, strict=True)
        }

    def save(self, files: SegmentFiles, prefix: str) -> None:
        """Write the state as `<prefix>.safetensors` and `<prefix>.json` (a whole state
        in one pair of files, for tests; the coordinator's snapshots are `cut` and
        `delta` chains, services/coordinator/snapshot.py)."""
        data, meta = self.snapshot()
        files.write_bytes(f"{prefix}.safetensors", data)
        files.write_bytes(f"{prefix}.json", json.dumps(meta).encode())

    def restore(self, files: SegmentFiles, prefix: str) -> None:
        """Load a state written by `save` (for tests, as `save`)."""
        meta = json.loads(files.read_bytes(f"{prefix}.json"))
        self.restore_snapshot(files.read_bytes(f"{prefix}.safetensors"), meta)


def _segment_arrays(segments: dict[int, str], prefix: str = "") -> dict[str, np.ndarray]:
    """Segments by id as arrays: ids ascending, each path's length, the paths' bytes."""
    ids = np.fromiter(segments, dtype=np.int64, count=len(segments))
    order = np.argsort(ids, kind="stable")
    paths = [segments[sid].encode() for sid in ids[order].tolist()]
    return {
        f"{prefix}segment_ids": ids[order],
        f"{prefix}segment_path_bytes": np.fromiter(map(len, paths), np.int64, len(paths)),
        f"{prefix}segment_paths": np.frombuffer(b"".join(paths), dtype=np.uint8),
    }


def _segments_from(arrays: dict[str, np.ndarray], prefix: str = "") -> dict[int, str]:
    """`_segment_arrays` read back."""
    ends = np.cumsum(arrays[f"{prefix}segment_path_bytes"]).tolist()
    blob = arrays[f"{prefix}segment_paths"].tobytes()
    starts = [0, *ends[:-1]] if ends else []  # no segments: no paths
    ids = arrays[f"{prefix}segment_ids"].tolist()
    return {sid: blob[a:b].decode() for sid, a, b in zip(ids, starts, ends, strict=True)}


class _NoFiles:
    """The files of a buffer that never holds one."""

    def delete(self, rel: str) -> bool:
        raise AssertionError(f"an empty buffer deletes no file ({rel})")

    def write_bytes(self, rel: str, data: bytes | memoryview) -> Any:
        raise AssertionError(f"an empty buffer writes no file ({rel})")

    def read_bytes(self, rel: str) -> bytes:
        raise AssertionError(f"an empty buffer reads no file ({rel})")


def empty_stats(config: ReplayBufferConfig) -> BufferStats:
    """What an empty buffer of `config` reports: a job that replays nothing (an
    evaluation) has no buffer, and shows this."""
    return ReplayBuffer("", config, _NoFiles(), error_buffer=0.0).stats()
