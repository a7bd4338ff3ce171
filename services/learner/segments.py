"""The segment files a learner trains on: the job's `SegmentSchema` (the columns its
algorithm reads, each with its kind, row shape and dtype), which every segment is
checked against, and the `SegmentCache`, which reads, checks and keeps segments and
gathers a sampled batch's rows from them.

Segment files are written by other machines and trusted for nothing: one that does not
fit the schema, cannot be read, or is not read within `READ_TIMEOUT_S` costs its rows,
never the task.

Usage::

    names = algorithm_of(config).column_names_for(config.policy)
    schema = SegmentSchema.for_policy(config.policy, names)
    cache = SegmentCache(store, job_id, schema)
    columns, weights, keys = cache.gather(batch)   # the batch's usable rows
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import threading
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.columns import ColumnSpec, column_spec
from common.config import PolicyConfig
from common.frames import INDEX_SUFFIX, POOL, is_packed, take
from common.messages import SampledBatch
from common.storage import CorruptFileError, SharedStore
from services.learner.reads import READS, Read

log = logging.getLogger(__name__)

#: The longest a segment file's read may take, from when it was asked for, before the
#: segment is skipped as unusable (a bound, not an expected time: a read takes
#: milliseconds). A read that never returns (a hung mount, a FIFO opened the blocking
#: way) holds one of the reading threads (services/learner/reads.py), never training.
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SegmentSchema:
    """The columns an algorithm trains on, each with its kind, row shape and dtype,
    built from the job config; `check` holds a segment to them.

    Usage::

        names = algorithm_of(config).column_names_for(config.policy)
        schema = SegmentSchema.for_policy(config.policy, names)
        columns = schema.check(store.read_segment(path))   # or CorruptFileError
    """

    columns: dict[str, ColumnSpec]

    @classmethod
    def for_policy(cls, policy: PolicyConfig, names: tuple[str, ...]) -> SegmentSchema:
        """The schema of `names`, columns the job's algorithm declares
        (`AlgorithmSpec.columns`: each column's kind gives its shape and dtype for the
        job, `common.columns.column_spec`). Rows of the `unrolls` unit (IMPALA's) are
        unrolls, so their per-step columns have a time axis of `unroll_len` first."""
        # Imported here: the feeder process reads segments without the algorithms' torch.
        from algorithms.registry import ALGORITHMS

        algorithm = ALGORITHMS[policy.type]
        declared = {column.name: column for column in algorithm.columns_for(policy)}
        undeclared = [name for name in names if name not in declared]
        if undeclared:
            raise ValueError(f"{policy.type} declares no column {', '.join(undeclared)}")
        unrolls = algorithm.collect_unit == "unrolls"
        steps = (policy.collect.unroll_len,) if unrolls else ()  # type: ignore[attr-defined]
        return cls({name: column_spec(declared[name], policy, steps) for name in names})

    def check(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The schema's columns of a segment, checked and cast to their training dtypes
        (other columns are dropped).

        Raises:
            CorruptFileError: a column is missing, or of the wrong kind, shape or
                length, or holds a value out of range (NaN, inf, an unknown action).
        """
        missing = [
            name
            for name, spec in self.columns.items()
            if name not in columns and not (spec.kind == "pixels" and is_packed(columns, name))
        ]
        if missing:
            raise CorruptFileError(f"no column {', '.join(missing)}")
        checked: dict[str, np.ndarray] = {}
        lengths: dict[str, int] = {}
        for name, spec in self.columns.items():
            if spec.kind == "pixels" and is_packed(columns, name):
                index_name = name + INDEX_SUFFIX
                checked[index_name] = _check_frame_index(
                    name, columns[index_name], columns[POOL], spec
                )
                checked[POOL] = columns[POOL]
                lengths[name] = len(checked[index_name])
            else:
                checked[name] = _check_column(name, columns[name], spec)
                lengths[name] = len(checked[name])
        if len(set(lengths.values())) > 1:
            raise CorruptFileError(f"columns differ in length: {lengths}")
        self._check_legal(checked)
        return checked

    def _check_legal(self, checked: dict[str, np.ndarray]) -> None:
        """Every discrete action a segment holds was legal under the mask it holds for
        the same step (a policy never takes a masked action; a row that says it did is
        not the game's)."""
        masks = [name for name, spec in self.columns.items() if spec.kind == "mask"]
        actions = [name for name, spec in self.columns.items() if spec.kind == "index"]
        for mask_name, action_name in zip(masks, actions, strict=False):
            mask, action = checked[mask_name], checked[action_name]
            taken = np.take_along_axis(mask, action[..., None], axis=-1)
            if not (taken == 1).all():
                raise CorruptFileError(f"{action_name} holds actions that {mask_name} masks")


def _check_frame_index(
    name: str, index: np.ndarray, pool: np.ndarray, spec: ColumnSpec
) -> np.ndarray:
    """A packed image column's indexes, checked against the pool they point into."""
    frame_shape, planes_shape = spec.shape[-2:], spec.shape[:-2]
    if pool.dtype != np.uint8 or pool.ndim != 3 or pool.shape[1:] != frame_shape:
        raise CorruptFileError(
            f"{POOL} is {pool.dtype} {list(pool.shape)}, not uint8 [frames, "
            f"{', '.join(map(str, frame_shape))}]"
        )
    if index.dtype.kind not in "iu" or index.shape[1:] != planes_shape:
        expected = ", ".join(["rows", *map(str, planes_shape)])
        raise CorruptFileError(
            f"{name}{INDEX_SUFFIX} is {index.dtype} {list(index.shape)}, not integer [{expected}]"
        )
    if index.size and (index.min() < 0 or index.max() >= len(pool)):
        raise CorruptFileError(f"{name}{INDEX_SUFFIX} points outside the {len(pool)} frames")
    return index.astype(np.intp, copy=False)


def _check_column(name: str, array: np.ndarray, spec: ColumnSpec) -> np.ndarray:
    if array.ndim != 1 + len(spec.shape) or array.shape[1:] != spec.shape:
        expected = ", ".join(["rows", *map(str, spec.shape)])
        raise CorruptFileError(f"{name} has shape {list(array.shape)}, not [{expected}]")
    kind = array.dtype.kind
    if spec.kind == "pixels":
        if array.dtype != np.uint8:
            raise CorruptFileError(f"{name} is {array.dtype}, not uint8 (image observations)")
        return array
    if spec.kind == "float":
        if kind != "f":
            raise CorruptFileError(f"{name} is {array.dtype}, not floating point")
        with np.errstate(over="ignore"):  # a float64 can overflow float32: inf, refused
            cast = array.astype(spec.dtype, copy=False)
        if not np.isfinite(cast).all():
            raise CorruptFileError(f"{name} holds NaN or infinite values")
        return cast
    if spec.kind == "index":
        if kind not in "iu":
            raise CorruptFileError(f"{name} is {array.dtype}, not integer (discrete actions)")
        if array.size and (array.min() < 0 or array.max() >= spec.high):
            raise CorruptFileError(f"{name} holds values outside [0, {spec.high})")
        return array.astype(spec.dtype, copy=False)
    if kind not in "biuf":
        raise CorruptFileError(f"{name} is {array.dtype}, not bool or numeric")
    if not ((array == 0) | (array == 1)).all():
        raise CorruptFileError(f"{name} holds values other than 0 and 1")
    if spec.kind == "mask" and array.size and not array.any(axis=-1).all():
        raise CorruptFileError(f"{name} has rows that allow no action")
    return array.astype(spec.dtype, copy=False)


#: The column of sequence batches (`SegmentCache.sequence_length`) that says which of
#: each item's steps are real rows (1) and which are padding (0).
VALID = "valid"

#: What reading and checking a segment raises for a bad file (PathError and
#: CorruptFileError are ValueErrors).
UNUSABLE = (OSError, ValueError, TypeError, KeyError, OverflowError)


class SegmentCache:
    """Recently read segments, by path, checked against the job's `SegmentSchema`.
    Segments never change, so no invalidation.

    A segment that cannot be read, or does not fit the schema, costs its rows, not the
    job: it is skipped, listed in `unusable`, and not read again. So does one whose read
    takes longer than `read_timeout_s`: reads run on their own threads
    (services/learner/reads.py), waited for with that bound, so a file whose read never
    returns holds a thread of those, never the batch it is in nor the batches after it.
    """

    def __init__(
        self,
        store: SharedStore,
        job_id: str,
        schema: SegmentSchema,
        max_segments: int = 4096,
        unusable: set[str] | None = None,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        sequence_length: int | None = None,
    ) -> None:
        self.store = store
        #: Episode and sequence items: each sampled item is a span of rows, gathered as
        #: `[items, sequence_length, ...]` columns with a `VALID` mask (None: rows).
        self.sequence_length = sequence_length
        self.job_id = job_id
        self.schema = schema
        self.columns = tuple(schema.columns)
        self.max_segments = max_segments
        self.read_timeout_s = read_timeout_s
        #: Paths skipped (shared with the task context, which reports them).
        self.unusable: set[str] = unusable if unusable is not None else set()
        self._cache: collections.OrderedDict[str, _Cached] = collections.OrderedDict()
        self._lock = threading.Lock()
        #: Segments being read now: each read, and the monotonic time past which nobody
        #: waits for it.
        self._loading: dict[str, tuple[Read, float]] = {}

    def skip(self, path: str, reason: object) -> None:
        """List a segment as unusable: none of its rows is used from now on."""
        with self._lock:
            self._cache.pop(path, None)
            listed = path in self.unusable
            self.unusable.add(path)
        if not listed:
            log.warning("skipping unusable segment %s: %s", path, reason)

    def get(self, path: str) -> dict[str, np.ndarray] | None:
        """The segment's checked columns; None when it is unusable.

        Thread-safe: `read_ahead` loads segments on another thread while training
        asks for them here; a segment being read is waited for, not read twice, and
        never past `read_timeout_s` from when its read was asked for."""
        entry = self._entry(path)
        return entry.columns if entry is not None else None

    def _entry(self, path: str) -> _Cached | None:
        """`get`, as the cache keeps the segment (with its rows and record)."""
        return self._entries([path])[path]

    def _entries(self, paths: list[str]) -> dict[str, _Cached | None]:
        """`_entry` of each distinct path in `paths`, under one hold of the lock (a
        batch names dozens of segments, each often several times): every read not under
        way starts before the first is waited for."""
        found: dict[str, _Cached | None] = {}
        reads: dict[str, tuple[Read, float]] = {}
        with self._lock:
            for path in dict.fromkeys(paths):
                entry = self._cache.get(path)
                if entry is not None:
                    self._cache.move_to_end(path)
                    found[path] = entry
                elif path in self.unusable:
                    found[path] = None
                else:
                    reads[path] = self._start(path)
        for path, (read, deadline) in reads.items():
            found[path] = self._wait(path, read, deadline)
        return found

    def _wait(self, path: str, read: Read, deadline: float) -> _Cached | None:
        """The entry `read` makes for `path`, waited for until `deadline` (monotonic);
        None when it is unusable or not read by then (it is then skipped)."""
        try:
            result: _Cached | None = READS.result(read, deadline - time.monotonic())
            return result
        except (TimeoutError, CancelledError):  # cancelled: another waiter's bound passed
            self.skip(path, f"not read within {self.read_timeout_s:g} s")  # first: no new read
            with self._lock:
                self._loading.pop(path, None)
            return None

    def start_reads(self, batches: list[SampledBatch]) -> None:
        """Start reading the segments of `batches` that are neither cached nor being
        read, without waiting for them (reads overlap: each releases the GIL)."""
        with self._lock:
            for batch in batches:
                for segment in batch.segments:
                    if segment.path not in self._cache and segment.path not in self.unusable:
                        self._start(segment.path)

    def _start(self, path: str) -> tuple[Read, float]:
        """The read of `path` under way, started now if it is not (holding the lock)."""
        loading = self._loading.get(path)
        if loading is None:
            read = READS.submit(functools.partial(self._load, path))
            loading = self._loading[path] = (read, time.monotonic() + self.read_timeout_s)
        return loading

    def _load(self, path: str) -> _Cached | None:
        """Read and check one segment (on its reading thread) and cache it."""
        entry: _Cached | None = None
        try:
            self.store.resolve(path, under=f"{self.job_id}/segments")
            columns = self.schema.check(self.store.read_segment(path))
            record, fields = _record(columns)
            if record is not None and fields is not None:
                # The columns become views of the records, so the rows are held once.
                # A gather copies out of them, so no caller sees their strides.
                columns = {name: record.view(fields)[name] for name in columns}
            entry = _Cached(columns, self._rows(columns), record, fields)
        except UNUSABLE as exc:
            self.skip(path, exc)
        finally:
            with self._lock:
                self._loading.pop(path, None)
                if path in self.unusable:  # also when its read outlived the bound
                    entry = None
                elif entry is not None:
                    self._cache[path] = entry
                    if len(self._cache) > self.max_segments:
                        self._cache.popitem(last=False)
        return entry

    def header(self, path: str) -> dict[str, Any] | None:
        """The record the segment's header holds (`SharedStore.read_segment_header`;
        empty when it holds none), read within `read_timeout_s`; None when the segment
        is unusable or its header cannot be read in time (it is then skipped)."""
        if path in self.unusable:
            return None
        read = READS.submit(functools.partial(self.store.read_segment_header, path))
        try:
            header: dict[str, Any] | None = READS.result(read, self.read_timeout_s)
            return header or {}
        except TimeoutError:
            self.skip(path, f"header not read within {self.read_timeout_s:g} s")
        except UNUSABLE as exc:
            self.skip(path, f"unreadable header: {exc!r}")
        return None

    def read_ahead(self, batches: list[SampledBatch]) -> None:
        """Load the segments of batches about to be trained, so that reading files
        (which releases the GIL) overlaps the training of the batches before them.
        Never raises for what a file holds."""
        for batch in batches:
            for segment in batch.segments:
                self.get(segment.path)

    def _rows(self, columns: dict[str, np.ndarray]) -> int:
        first = self.columns[0]
        return len(columns[first] if first in columns else columns[first + INDEX_SUFFIX])

    def gather(self, batch: SampledBatch) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
        """The batch's rows as columns, with their weights and keys (rows of unusable
        segments left out). Never raises for what a file holds."""
        columns, weights, kept = self.gather_kept(batch)
        keys = [k for k, keep in zip(batch.keys, kept, strict=True) if keep] if kept.size else []
        return columns, weights, keys

    def gather_kept(
        self, batch: SampledBatch
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """As `gather`, with which of the batch's items were kept (a bool per item)
        instead of their keys. Episode and sequence items (`sequence_length`) come as
        `[items, sequence_length, ...]` columns, each item's rows from its first one,
        padded past its end (the padding repeats its last row) and marked by `VALID`."""
        if self.sequence_length is not None:
            return self._gather_sequences(batch, self.sequence_length)
        return self._gather_rows(batch)

    def _gather_sequences(
        self, batch: SampledBatch, steps: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        items = sum(len(segment.rows) for segment in batch.segments)
        if len(batch.keys) != items or len(batch.weights) != items:
            return self._gather_rows(batch)  # refused there, with the same warning
        offsets = np.arange(steps)
        segments = []
        lengths: list[int] = []
        for segment in batch.segments:
            spans = segment.lengths
            if spans is None or len(spans) != len(segment.rows):
                spans = [0] * len(segment.rows)  # no lengths: every item refused below
            rows: list[int] = []
            for first, length in zip(segment.rows, spans, strict=True):
                if isinstance(length, int) and 1 <= length <= steps and isinstance(first, int):
                    rows.extend((first + np.minimum(offsets, length - 1)).tolist())
                else:  # a span the learner cannot take: the segment's rows fail the check
                    rows.extend([-1] * steps)
                lengths.append(length if isinstance(length, int) else 0)
            segments.append(dataclasses.replace(segment, rows=rows, lengths=None))
        expanded = dataclasses.replace(
            batch,
            keys=[key for key in batch.keys for _ in offsets],
            weights=[w for w in batch.weights for _ in offsets],
            segments=segments,
        )
        columns, weights, keep = self._gather_rows(expanded)
        kept = keep.reshape(items, steps)[:, 0] if keep.size else np.zeros(items, bool)
        if not kept.any():
            return {}, np.zeros(0, np.float32), kept
        count = int(kept.sum())
        out = {k: v.reshape(count, steps, *v.shape[1:]) for k, v in columns.items()}
        valid = offsets[None, :] < np.asarray(lengths)[kept][:, None]
        out[VALID] = valid.astype(np.float32)
        return out, weights.reshape(count, steps)[:, 0].copy(), kept

    def _gather_rows(
        self, batch: SampledBatch
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """The batch's rows (one a item), from each usable segment."""
        # One pass over the batch's dozens of entries for each list, not one per use.
        paths = [segment.path for segment in batch.segments]
        row_lists = [segment.rows for segment in batch.segments]
        counts = np.fromiter(map(len, row_lists), np.int64, len(row_lists))
        items = int(counts.sum())
        if len(batch.keys) != items or len(batch.weights) != items:
            log.warning(
                "sampled batch of %d rows has %d keys, %d weights: skipped",
                items,
                len(batch.keys),
                len(batch.weights),
            )
            return {}, np.zeros(0, np.float32), np.zeros(0, bool)
        by_path = self._entries(paths)
        index = _flat_rows(row_lists, items)
        if index is None:  # a row that is no int64 at all: checked segment by segment
            return self._gather_each(batch)
        entries = [by_path[path] for path in paths]
        # Each entry's lowest and highest row, and its segment's rows, for all at once.
        starts = np.cumsum([0, *counts[:-1]])
        nonempty = counts > 0
        lows = np.zeros(len(counts), np.int64)
        highs = np.zeros(len(counts), np.int64)
        if nonempty.any():
            lows[nonempty] = np.minimum.reduceat(index, starts[nonempty])
            highs[nonempty] = np.maximum.reduceat(index, starts[nonempty])
        # Rows in each entry's segment; -1: the segment is unusable.
        sizes = np.fromiter((e.rows if e is not None else -1 for e in entries), np.int64)
        usable = sizes >= 0
        lengths = np.maximum(sizes, 0)
        outside = usable & nonempty & ((lows < 0) | (highs >= lengths))
        if outside.any():  # such a segment is skipped: none of its entries is kept
            bad = {paths[i] for i in np.flatnonzero(outside).tolist()}
            for path in bad:
                self.skip(path, "sampled rows out of range")
            usable &= np.fromiter((path not in bad for path in paths), bool, len(usable))
        keep = np.repeat(usable, counts)
        if not usable.any():
            return {}, np.zeros(0, np.float32), keep
        found = [e for e, use in zip(entries, usable.tolist(), strict=True) if use]
        weights = np.asarray(batch.weights, dtype=np.float32)[keep]
        kept = index[keep]
        # One layout for all (`_fields` gives equal layouts as one object).
        layout = found[0].fields
        if layout is not None and all(e.fields is layout for e in found):
            # Every column in one take; each field is copied out as a column of its own
            # (a copy, not `ascontiguousarray`: one row counts as contiguous with its
            # record's stride, which torch refuses).
            records = [e.record for e in found]
            if sum(r.nbytes for r in records) <= JOIN_WHOLE_BYTES:
                # The kept rows as one index into the segments laid end to end.
                offsets = np.cumsum([0, *lengths[usable][:-1]])
                joined = np.concatenate(records)[kept + np.repeat(offsets, counts[usable])]
            else:  # whole segments would be too much to copy: their rows only
                taken = zip(records, _per_segment(kept, counts[usable]), strict=True)
                joined = np.concatenate([r[i] for r, i in taken])
            joined = joined.view(layout)
            return {k: joined[k].copy() for k in self.columns}, weights, keep
        rows = _Rows([e.columns for e in found], _per_segment(kept, counts[usable]))
        return {k: rows.join(k) for k in self.columns}, weights, keep

    def _gather_each(
        self, batch: SampledBatch
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """`gather_kept`, each segment's rows checked on their own (a batch holding a
        row that is not an int64, whose segment alone is skipped)."""
        found: list[dict[str, np.ndarray]] = []
        kept_rows: list[np.ndarray] = []
        keep: list[bool] = []
        for segment in batch.segments:
            columns = self.get(segment.path)
            rows = None
            if columns is not None:
                rows = _row_index(segment.rows, self._rows(columns))
                if rows is None:
                    self.skip(segment.path, "sampled rows out of range")
                else:
                    found.append(columns)
                    kept_rows.append(rows)
            keep.extend([rows is not None] * len(segment.rows))
        mask = np.asarray(keep, dtype=bool)
        if not found:
            return {}, np.zeros(0, np.float32), mask
        rows = _Rows(found, kept_rows)
        joined = {k: rows.join(k) for k in self.columns}
        weights = np.asarray(batch.weights, dtype=np.float32)[mask]
        return joined, weights, mask


#: Up to how many bytes of a column `_Rows.join` copies whole segments to gather their rows
#: with one index (far cheaper in calls than a take per segment when a batch spreads
#: over dozens of small segments, as a batch of a big replay does).
JOIN_WHOLE_BYTES = 1 << 20


def _per_segment(rows: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """`rows` cut into each segment's, `counts[i]` of them for the i-th."""
    return np.split(rows, np.cumsum(counts)[:-1])


@dataclass(slots=True)
class _Cached:
    """A checked segment as the cache keeps it: its columns, their rows, and, for a
    segment of small rows, the same rows as one record array (`_record`), of which the
    columns are then views."""

    columns: dict[str, np.ndarray]
    rows: int
    #: Each row's bytes as one opaque item (numpy joins and takes those far faster
    #: than structured rows), and the structured type whose fields are the columns.
    record: np.ndarray | None
    fields: np.dtype | None


#: Up to how many bytes a row the cache also keeps a segment as one record array: a
#: batch of small rows spreads over dozens of segments, and taking every column in one
#: call costs far less than a call per column and segment.
RECORD_ROW_BYTES = 1024


def _record(columns: dict[str, np.ndarray]) -> tuple[np.ndarray | None, np.dtype | None]:
    """The columns' rows as opaque records, and the structured type that reads them
    (a field per column); None, None unless every column is rows of its own (no image
    packed into a pool of planes) and a row is at most RECORD_ROW_BYTES."""
    if not columns or POOL in columns:  # packed images: a pool is no rows of its own
        return None, None
    if len({len(a) for a in columns.values()}) != 1:
        return None, None
    fields = _fields(tuple((name, a.dtype.str, a.shape[1:]) for name, a in columns.items()))
    if fields.itemsize > RECORD_ROW_BYTES:
        return None, None
    record = np.empty(len(next(iter(columns.values()))), fields)
    for name, array in columns.items():
        record[name] = array
    return record.view(np.dtype((np.void, fields.itemsize))), fields


@functools.lru_cache(maxsize=64)
def _fields(layout: tuple[tuple[str, str, tuple[int, ...]], ...]) -> np.dtype:
    """The structured type of `layout` (name, dtype, row shape per column): one object
    for equal layouts, so a gather tells them equal by identity."""
    return np.dtype([(name, np.dtype(dtype), shape) for name, dtype, shape in layout])


class _Rows:
    """The rows a batch takes of each of its usable segments, and how `join` puts them
    together."""

    def __init__(self, found: list[dict[str, np.ndarray]], rows: list[np.ndarray]) -> None:
        self.found, self.rows = found, rows
        self._index: np.ndarray | None = None

    def whole_index(self, lengths: list[int]) -> np.ndarray:
        """The rows as one index into the segments' columns laid end to end."""
        if self._index is None:
            offsets = np.cumsum([0, *lengths[:-1]])
            counts = [len(r) for r in self.rows]
            self._index = np.concatenate(self.rows) + np.repeat(offsets, counts)
        return self._index

    def join(self, name: str) -> np.ndarray:
        """Column `name`'s rows of each segment, in order, as one array."""
        found = self.found
        if not any(is_packed(columns, name) for columns in found):
            arrays = [columns[name] for columns in found]
            if sum(a.nbytes for a in arrays) <= JOIN_WHOLE_BYTES:
                index = self.whole_index([len(a) for a in arrays])
                return np.concatenate(arrays)[index]
        return np.concatenate([take(c, name, r) for c, r in zip(found, self.rows, strict=True)])


def _flat_rows(row_lists: list[list[int]], items: int) -> np.ndarray | None:
    """Every entry's rows (`items` in all) in one int64 array; None when a row cannot
    be an int64."""
    try:
        return np.fromiter(itertools.chain.from_iterable(row_lists), np.int64, count=items)
    except (OverflowError, TypeError, ValueError):
        return None


def _row_index(rows: list[int], length: int) -> np.ndarray | None:
    """`rows` as an index into a segment of `length` rows; None when one is outside."""
    try:
        index = np.asarray(rows, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None
    if index.ndim != 1 or (index.size and (index.min() < 0 or index.max() >= length)):
        return None
    return index
