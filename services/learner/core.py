"""The learner's work: a `learn` task. No Flask.

The learner asks the coordinator for `num_batches` batches at once, prefetching the
next request while it trains on the current one; reads the sampled rows from the
segment files (caching them: segments are immutable); trains; every
`publish_every_iters` writes a new policy version and announces it; every
`checkpoint_every_iters` writes a checkpoint, from which a restarted learner resumes.

Segment files are written by other machines and trusted for nothing: each is checked
against the job's `SegmentSchema` before any row of it is trained on, and one that
does not fit costs its rows, never the task. Non-finite weights are never published
or checkpointed, and everything reported (progress, priorities) is finite.

In a learner group (services/learner/aggregator.py) this runs on every rank: rank 0's
sessions also send each reply's batches to the other ranks, and each rank's
`Trainer` trains on its own share of every global batch, reading it itself.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch
from prometheus_client import CollectorRegistry, Counter, Gauge

from algorithms.base import BatchLearner, Learner, RoundLearner
from algorithms.registry import ALGORITHMS
from algorithms.sync import AllReduceSync
from common.checkpoint_file import Checkpoint, read_checkpoint, write_checkpoint
from common.columns import ColumnSpec, column_spec
from common.config import JobConfig, PolicyConfig
from common.errors import ApiError
from common.frames import INDEX_SUFFIX, POOL, is_packed, take
from common.http import ServiceUnavailable
from common.messages import (
    MAX_ABS_FLOAT,
    MAX_PRIORITY,
    LearnSpec,
    PolicyRef,
    SampledBatch,
    SampleReply,
    dump,
)
from common.models import state_to_numpy
from common.storage import CHECKPOINT_SUFFIX, CorruptFileError, SharedStore, WrongAlgorithm
from common.tensorboard import ScalarLog, job_tb_dir
from jobconfig import algorithm_of, read_job_config
from jobconfig.ranks import split_error
from services.learner.group import GroupBroken, RankGroup, share_bounds, share_of
from services.learner.reads import READS, Read
from services.slave.core import TaskContext, patiently

log = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2
#: Train iterations between two points of the learner's TensorBoard scalars (a round of
#: the sync workflow writes one at its end).
TB_EVERY_ITERS = 10
#: The longest a segment file's read may take, from when it was asked for, before the
#: segment is skipped as unusable (a bound, not an expected time: a read takes
#: milliseconds). A read that never returns (a hung mount, a FIFO opened the blocking
#: way) holds one of the reading threads (services/learner/reads.py), never training.
READ_TIMEOUT_S = 5.0


#: What torchrun sets in a learner group's ranks: how many times it restarted the group.
RESTART_COUNT_VAR = "TORCHELASTIC_RESTART_COUNT"


class LearnerMetrics:
    """What a learner counts, in its service's registry (created once per process:
    the counters live as long as it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.train_iterations = Counter(
            "drover_train_iterations",
            "Training iterations run (the learner's train_iter steps)",
            registry=registry,
        )
        self.policy_version = Gauge(
            "drover_policy_version",
            "The policy version this learner last published",
            registry=registry,
        )
        self.publishes = Counter(
            "drover_policy_publishes",
            "Policy versions written and announced",
            registry=registry,
        )
        self.checkpoints = Counter(
            "drover_checkpoint_writes",
            "Checkpoints written",
            registry=registry,
        )
        self.checkpoint_bytes = Counter(
            "drover_checkpoint_bytes",
            "Bytes of checkpoints written",
            registry=registry,
        )
        restarts = Gauge(
            "drover_learner_group_restarts",
            f"Times torchrun restarted this learner group ({RESTART_COUNT_VAR}; 0 outside one)",
            registry=registry,
        )
        try:
            restarts.set(int(os.environ.get(RESTART_COUNT_VAR, "0")))
        except ValueError:
            restarts.set(0)


class JobOver(Exception):
    """The job ended (or was forgotten): the task stops."""


class NonFiniteWeights(RuntimeError):
    """Training produced NaN or inf weights: they are neither published nor saved."""


@dataclass(frozen=True)
class SegmentSchema:
    """The columns an algorithm trains on, each with its kind, row shape and dtype,
    built from the job config; `check` holds a segment to them.

    Usage::

        schema = SegmentSchema.for_policy(config.policy, algorithm_of(config).column_names)
        columns = schema.check(store.read_segment(path))   # or CorruptFileError
    """

    columns: dict[str, ColumnSpec]

    @classmethod
    def for_policy(cls, policy: PolicyConfig, names: tuple[str, ...]) -> SegmentSchema:
        """The schema of `names`, columns the job's algorithm declares
        (`AlgorithmSpec.columns`: each column's kind gives its shape and dtype for the
        job, `common.columns.column_spec`). Rows of the `unrolls` unit (IMPALA's) are
        unrolls, so their per-step columns have a time axis of `unroll_len` first."""
        algorithm = ALGORITHMS[policy.type]
        declared = {column.name: column for column in algorithm.columns}
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
        return checked


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
    return array.astype(spec.dtype, copy=False)


#: What reading and checking a segment raises for a bad file (PathError and
#: CorruptFileError are ValueErrors).
_UNUSABLE = (OSError, ValueError, TypeError, KeyError, OverflowError)


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
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.schema = schema
        self.columns = tuple(schema.columns)
        self.max_segments = max_segments
        self.read_timeout_s = read_timeout_s
        #: Paths skipped (shared with the task context, which reports them).
        self.unusable: set[str] = unusable if unusable is not None else set()
        self._cache: collections.OrderedDict[str, dict[str, np.ndarray]] = collections.OrderedDict()
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
        with self._lock:
            columns = self._cache.get(path)
            if columns is not None:
                self._cache.move_to_end(path)
                return columns
            if path in self.unusable:
                return None
            read, deadline = self._start(path)
        try:
            result: dict[str, np.ndarray] | None = READS.result(read, deadline - time.monotonic())
            return result
        except TimeoutError:
            self.skip(path, f"not read within {self.read_timeout_s:g} s")  # first: no new read
            with self._lock:
                self._loading.pop(path, None)
            return None

    def start_reads(self, paths: list[str]) -> None:
        """Start reading the segments of `paths` that are neither cached nor being
        read, without waiting for them (reads overlap: each releases the GIL)."""
        with self._lock:
            for path in paths:
                if path not in self._cache and path not in self.unusable:
                    self._start(path)

    def _start(self, path: str) -> tuple[Read, float]:
        """The read of `path` under way, started now if it is not (holding the lock)."""
        loading = self._loading.get(path)
        if loading is None:
            read = READS.submit(functools.partial(self._load, path))
            loading = self._loading[path] = (read, time.monotonic() + self.read_timeout_s)
        return loading

    def _load(self, path: str) -> dict[str, np.ndarray] | None:
        """Read and check one segment (on its reading thread) and cache it."""
        columns: dict[str, np.ndarray] | None = None
        try:
            self.store.resolve(path, under=f"{self.job_id}/segments")
            columns = self.schema.check(self.store.read_segment(path))
        except _UNUSABLE as exc:
            self.skip(path, exc)
        finally:
            with self._lock:
                self._loading.pop(path, None)
                if path in self.unusable:  # also when its read outlived the bound
                    columns = None
                elif columns is not None:
                    self._cache[path] = columns
                    if len(self._cache) > self.max_segments:
                        self._cache.popitem(last=False)
        return columns

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
        except _UNUSABLE as exc:
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
        instead of their keys."""
        items = sum(len(segment.rows) for segment in batch.segments)
        if len(batch.keys) != items or len(batch.weights) != items:
            log.warning(
                "sampled batch of %d rows has %d keys, %d weights: skipped",
                items,
                len(batch.keys),
                len(batch.weights),
            )
            return {}, np.zeros(0, np.float32), np.zeros(0, bool)
        parts: list[dict[str, np.ndarray]] = []
        keep: list[bool] = []
        self.start_reads([segment.path for segment in batch.segments])
        for segment in batch.segments:
            columns = self.get(segment.path)
            rows = None
            if columns is not None:
                rows = _row_index(segment.rows, self._rows(columns))
                if rows is None:
                    self.skip(segment.path, "sampled rows out of range")
                else:
                    parts.append({k: take(columns, k, rows) for k in self.columns})
            keep.extend([rows is not None] * len(segment.rows))
        mask = np.asarray(keep, dtype=bool)
        if not parts:
            return {}, np.zeros(0, np.float32), np.zeros(len(keep), bool)
        joined = {k: np.concatenate([p[k] for p in parts]) for k in self.columns}
        weights = np.asarray(batch.weights, dtype=np.float32)[mask]
        return joined, weights, mask


def _row_index(rows: list[int], length: int) -> np.ndarray | None:
    """`rows` as an index into a segment of `length` rows; None when one is outside."""
    try:
        index = np.asarray(rows, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None
    if index.ndim != 1 or (index.size and (index.min() < 0 or index.max() >= length)):
        return None
    return index


def _finite(state: Any) -> bool:
    """Whether every floating value in a (nested) state dict, tensor or array is finite."""
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, np.ndarray):
        return state.dtype.kind != "f" or bool(np.isfinite(state).all())
    if isinstance(state, dict):
        return all(_finite(value) for value in state.values())
    if isinstance(state, list | tuple):
        return all(_finite(value) for value in state)
    if isinstance(state, float):
        return math.isfinite(state)
    return True


def set_progress(progress: dict[str, float], **values: float) -> None:
    """Put values into a task's progress, which heartbeats carry as JSON: a value that
    is not finite or beyond `MAX_ABS_FLOAT` is left out (and an older one removed)."""
    for key, value in values.items():
        if math.isfinite(value) and abs(value) <= MAX_ABS_FLOAT:
            progress[key] = value
        else:
            progress.pop(key, None)


L = TypeVar("L", bound=Learner)


def _as(learner: Learner, protocol: type[L]) -> L:
    """The learner, checked to offer what the task's mode calls.

    Raises:
        TypeError: it does not (the algorithm's collect unit and the task's mode disagree).
    """
    if not isinstance(learner, protocol):
        raise TypeError(f"{type(learner).__name__} is no {protocol.__name__}")
    return learner


def priorities_of(td_abs: np.ndarray) -> list[float]:
    """TD errors as priorities the coordinator accepts: in `[0, MAX_PRIORITY]`, with a
    non-finite error (a diverging update) given the highest priority."""
    values = np.asarray(td_abs, dtype=np.float64)
    values = np.where(np.isfinite(values), values, MAX_PRIORITY)
    return np.clip(values, 0.0, MAX_PRIORITY).tolist()


@dataclass(frozen=True)
class BatchOutcome:
    """One update on a global batch, as rank 0 reports it (merged over the ranks)."""

    #: The keys of the items trained on, and their new |TD errors|, in batch order.
    keys: list[int]
    td_abs: np.ndarray
    loss: float
    q_mean: float
    #: Items each rank trains per second since the task started, in rank order.
    rank_samples_per_s: list[float]
    #: The algorithm's TensorBoard scalars (`BatchReport.scalars`), averaged over ranks.
    scalars: dict[str, float]


@dataclass(frozen=True)
class RoundOutcome:
    """One on-policy round's updates, merged over the ranks."""

    loss: float
    entropy: float
    approx_kl: float
    rank_samples_per_s: list[float]
    #: The algorithm's TensorBoard scalars (`RoundReport.scalars`), averaged over ranks.
    scalars: dict[str, float]


#: A batch position a rank did not train on (its segment was unusable there).
_DROPPED = -1.0


class Trainer:
    """One rank's training: it reads its own share of each global batch from the
    shared file system and trains on it; with a group, the ranks agree on each update
    and rank 0 gets the merged outcome (every rank's TD errors, by batch position, so
    each sampled item gets exactly one new priority).

    A learner on its own (`group` None) trains on the whole batch.
    """

    def __init__(self, learner: Learner, cache: SegmentCache, group: RankGroup | None) -> None:
        self.learner = learner
        self.cache = cache
        self.group = group
        self._started = time.monotonic()
        self._samples = 0

    def _rate(self, samples: int) -> float:
        self._samples += samples
        return self._samples / max(time.monotonic() - self._started, 1e-9)

    def train_batch(self, batch: SampledBatch) -> BatchOutcome | None:
        """One update on the batch (this rank's share of it), merged over the ranks;
        None when no rank had a usable row (no rank stepped), and on ranks other than
        0, which only take part."""
        learner = _as(self.learner, BatchLearner)
        group = self.group
        if group is None:
            columns, weights, keys = self.cache.gather(batch)
            if not len(weights):
                return None
            info = learner.learn_batch(columns, weights)
            rate = self._rate(len(weights))
            return BatchOutcome(keys, info.td_abs, info.loss, info.q_mean, [rate], info.scalars)
        mine = share_of(batch, group.rank, group.world_size)
        columns, weights, kept = self.cache.gather_kept(mine)
        # A rank with nothing to train on cannot take part in the gradient all-reduce:
        # all skip the batch together.
        if group.all_min(len(weights)) == 0:
            return None
        info = learner.learn_batch(columns, weights)
        width = share_bounds(len(batch.keys), 0, group.world_size)[1]
        td = np.full(width, _DROPPED)
        td[: len(kept)][kept] = np.asarray(info.td_abs, dtype=np.float64)
        # Every rank's learner reports the same tags in the same order.
        scalars = list(info.scalars.values())
        head = [info.loss, info.q_mean, self._rate(len(weights)), *scalars]
        table = group.all_gather(np.concatenate([head, td]))
        if group.rank != 0:
            return None  # rank 0 alone reports and sends the priorities
        keys: list[int] = []
        td_abs: list[float] = []
        for rank, row in enumerate(table):
            start, stop = share_bounds(len(batch.keys), rank, group.world_size)
            for position, value in enumerate(row[len(head) : len(head) + stop - start]):
                if value != _DROPPED:  # NaN (a diverging update) is kept: MAX_PRIORITY
                    keys.append(batch.keys[start + position])
                    td_abs.append(value)
        return BatchOutcome(
            keys=keys,
            td_abs=np.asarray(td_abs),
            loss=float(table[:, 0].mean()),
            q_mean=float(table[:, 1].mean()),
            rank_samples_per_s=table[:, 2].tolist(),
            scalars=_rank_means(info.scalars, table[:, 3 : len(head)]),
        )

    def read_ahead(self, batches: list[SampledBatch]) -> None:
        """Load this rank's segments of batches to come (`SegmentCache.read_ahead`)."""
        group = self.group
        if group is not None:
            batches = [share_of(b, group.rank, group.world_size) for b in batches]
        self.cache.read_ahead(batches)

    def round_share(self, batch: SampledBatch) -> dict[str, np.ndarray]:
        """This rank's usable rows of an on-policy round (all of them on its own)."""
        if self.group is not None:
            batch = share_of(batch, self.group.rank, self.group.world_size)
        columns, _, _ = self.cache.gather(batch)
        return columns

    def train_round(self, columns: dict[str, np.ndarray]) -> RoundOutcome | None:
        """All updates on one on-policy round, given this rank's `round_share` of it,
        merged over the ranks; None when no rank had a usable row, and on ranks other
        than 0."""
        learner = _as(self.learner, RoundLearner)
        rows = len(next(iter(columns.values()))) if columns else 0
        group = self.group
        if group is None:
            if not rows:
                return None
            info = learner.train_round(columns)
            return RoundOutcome(
                info.loss, info.entropy, info.approx_kl, [self._rate(rows)], info.scalars
            )
        # Every rank must take the same number of minibatch steps: all train on as many
        # rows as the rank with the fewest usable ones.
        rows = group.all_min(rows)
        if rows == 0:
            return None
        info = learner.train_round({k: v[:rows] for k, v in columns.items()})
        table = group.all_gather(
            np.array(
                [info.loss, info.entropy, info.approx_kl, self._rate(rows)]
                + list(info.scalars.values())
            )
        )
        if group.rank != 0:
            return None
        mean = table.mean(axis=0)
        return RoundOutcome(
            mean[0], mean[1], mean[2], table[:, 3].tolist(), _rank_means(info.scalars, table[:, 4:])
        )


def _rank_means(scalars: dict[str, float], table: np.ndarray) -> dict[str, float]:
    """Each of `scalars`' tags with its mean over the ranks (a table row each), the
    ranks whose value is not finite (a skipped step's gradient norm) left out."""
    with warnings.catch_warnings():  # a tag no rank has a finite value of: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean(np.where(np.isfinite(table), table, np.nan), axis=0)
    return dict(zip(scalars, means.tolist(), strict=True))


@dataclass(frozen=True)
class Resumed:
    """Where a learner resumed from: what every rank of a group loads alike."""

    #: The newest policy version in use; the next publish goes past it.
    version: int
    #: The checkpoint loaded (its path under the shared root), if any.
    checkpoint: str | None = None
    #: The published policy whose weights were taken over the checkpoint's, if any.
    policy: PolicyRef | None = None


def load_checkpoint(store: SharedStore, learner: Learner, path: str, algo: str) -> int:
    """Load a checkpoint of the job's algorithm `algo` into `learner`; returns the
    policy version it was written at.

    Raises:
        Exception: it cannot be read, was written by another algorithm, or holds
            non-finite weights.
    """
    checkpoint = read_checkpoint(store, path, algo=algo, device=learner.device)
    if not _finite(checkpoint.model):
        raise NonFiniteWeights("non-finite weights")
    learner.load_state_dict(checkpoint.model)
    return checkpoint.policy_version


def load_policy(store: SharedStore, learner: Learner, ref: PolicyRef, algo: str) -> None:
    """Take a published version's weights and train iteration.

    Raises:
        OSError, CorruptFileError, RuntimeError: it cannot be read or does not fit.
        WrongAlgorithm: another algorithm than the job's `algo` wrote it.
    """
    policy = store.read_policy(ref.path, sha256=ref.sha256, algo=algo)
    if not _finite(policy.tensors):
        raise CorruptFileError(f"{ref.path}: non-finite weights")
    learner.load_policy(policy.tensors)
    learner.train_iter = policy.train_iter


def new_learner(config: JobConfig, seed: int, group: RankGroup | None) -> Learner:
    """The job's learner, seeded, on the job's device. In a group, a rank trains on the
    GPU of its local rank (for a CUDA job), its minibatches are its share of the
    global ones, and its optimizer steps average gradients across the ranks."""
    torch.manual_seed(seed)
    policy = config.policy
    algorithm = ALGORITHMS[policy.type]
    if group is None:
        return algorithm.make_learner(policy, torch.device(policy.torch_device))
    local = replace(policy.learn, batch_size=policy.learn.batch_size // group.world_size)
    learner = algorithm.make_learner(
        replace(policy, learn=local), group.ranks.device(policy.torch_device)
    )
    learner.sync = AllReduceSync(None, group.world_size)
    return learner


class LearnerRunner:
    """Runs `learn` tasks (the TaskRunner of a learner, and of a learner group's rank
    0, which passes `group`: services/learner/aggregator.py)."""

    kinds = frozenset({"learn"})

    def __init__(
        self,
        store: SharedStore,
        group: RankGroup | None = None,
        *,
        metrics: LearnerMetrics | None = None,
    ) -> None:
        self.store = store
        self.group = group
        #: Counted in the service's registry (a private one when None: tests).
        self.metrics = metrics or LearnerMetrics(CollectorRegistry())

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        job_id = ctx.task.job_id
        config = read_job_config(self.store, job_id)
        torch.set_num_threads(config.system.torch_num_threads)
        spec = ctx.task.spec
        return self.learn(ctx, config, spec)

    def learn(self, ctx: TaskContext, config: JobConfig, spec: LearnSpec) -> dict[str, Any]:
        """Train the job's algorithm from where its last learner stopped, in the mode
        the task says (the coordinator's workflow chose it), until the task stops."""
        group = self.group
        if group is not None:
            error = split_error(config.policy, group.world_size)
            if error is not None:  # before any rank builds anything
                raise ValueError(f"{error[0]}: {error[1]}")
        learner = new_learner(config, spec.seed, group)
        resumed = self._resume(ctx.task.job_id, config.policy.type, learner, ctx)
        if group is not None:
            group.send(
                {
                    "kind": "task",
                    "job_id": ctx.task.job_id,
                    "seed": spec.seed,
                    "checkpoint": resumed.checkpoint,
                    "policy": dump(resumed.policy) if resumed.policy else None,
                }
            )
            group.broadcast_state(learner.state_dict())
        session = _RoundSession if spec.mode == "rounds" else _LearnSession
        try:
            result = session(
                ctx, config, self.store, learner, resumed.version, group, metrics=self.metrics
            ).run()
        except GroupBroken:
            raise
        except Exception:
            self._end_group()
            raise
        self._end_group()
        return result

    def _end_group(self) -> None:
        if self.group is not None:
            self.group.send({"kind": "end"})

    def _resume(self, job_id: str, algo: str, learner: Learner, ctx: TaskContext) -> Resumed:
        """Continue where the job's last learner stopped.

        The newest readable checkpoint gives networks, optimizer and counters. When a
        newer policy was published after it, its weights and train iteration are taken
        too (the target network restarts from them), so little training is repeated.
        A file another algorithm than the job's `algo` wrote is passed over.
        """
        version = 0
        checkpoint: str | None = None
        folder = f"{job_id}/checkpoints"
        names = [n for n in self.store.list_dir(folder) if n.endswith(CHECKPOINT_SUFFIX)]
        for name in reversed(names):
            try:
                version = load_checkpoint(self.store, learner, f"{folder}/{name}", algo)
                checkpoint = f"{folder}/{name}"
                log.info("resumed from %s at train_iter %d", name, learner.train_iter)
                break
            except Exception as exc:  # a damaged checkpoint: try the one before it
                log.warning("checkpoint %s unusable: %s", name, exc)
        try:
            latest = patiently(ctx.stop, ctx.coordinator.latest_policy, job_id)
        except (ApiError, ServiceUnavailable) as exc:
            raise JobOver(f"cannot read the newest policy version: {exc}") from exc
        taken: PolicyRef | None = None
        if latest is not None and latest.train_iter > learner.train_iter:
            try:
                load_policy(self.store, learner, latest, algo)
                taken = latest
                log.info(
                    "took version %d's weights (train_iter %d)", latest.version, learner.train_iter
                )
            except (OSError, CorruptFileError, WrongAlgorithm, RuntimeError) as exc:
                log.warning("newest policy %d unusable: %s", latest.version, exc)
        # A version written but never announced (the coordinator restarted) still owns
        # its file name: never write that version again.
        on_disk = [
            int(name.split(".")[0])
            for name in self.store.list_dir(f"{job_id}/policies")
            if name.endswith(".safetensors") and name.split(".")[0].isdigit()
        ]
        newest = max([version, latest.version if latest else 0, *on_disk])
        return Resumed(version=newest, checkpoint=checkpoint, policy=taken)


class _LearnSession:
    """Batches as the buffer samples them (`LearnSpec.mode` batches). In a learner
    group this runs on rank 0, which sends each sample reply's batches to the other
    ranks and trains its own share."""

    def __init__(
        self,
        ctx: TaskContext,
        config: JobConfig,
        store: SharedStore,
        learner: Learner,
        version: int,
        group: RankGroup | None = None,
        *,
        metrics: LearnerMetrics | None = None,
    ) -> None:
        self.ctx = ctx
        self.metrics = metrics or LearnerMetrics(CollectorRegistry())
        self.config = config
        self.store = store
        self.learner = learner
        self.version = version
        self.group = group
        self.job_id = ctx.task.job_id
        schema = SegmentSchema.for_policy(config.policy, algorithm_of(config).column_names)
        self.cache = SegmentCache(store, self.job_id, schema, unusable=ctx.unusable_segments)
        self.trainer = Trainer(learner, self.cache, group)
        self.sample_timeouts = 0
        #: Holds (fifo items kept for this task) trained on and not yet acknowledged.
        self.trained_holds: list[str] = []
        self.prioritized = config.policy.other.replay_buffer.type == "prioritized"
        self.board = TrainBoard(store, self.job_id, learner.train_iter)

    def run(self) -> dict[str, Any]:
        learn = self.config.policy.learn
        ctx, learner = self.ctx, self.learner
        started, start_iter = time.monotonic(), learner.train_iter
        prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        # Priorities go back on their own thread, so training never waits for them.
        priorities = ThreadPoolExecutor(max_workers=1, thread_name_prefix="priorities")
        # Segments of the batches after the first are read on their own thread while
        # the batches before them train.
        reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead")
        future: Future[SampleReply | None] = prefetch.submit(self.fetch)
        try:
            self.publish()  # collectors act with the resumed (or fresh) network at once
            while not ctx.stopped():
                waited = time.monotonic()
                reply = future.result()
                trained = time.monotonic()
                self.board.wait_s += trained - waited
                if ctx.stopped():
                    break
                future = prefetch.submit(self.fetch)
                batches = reply.batches if reply else []
                if len(batches) > 1:
                    reader.submit(self.trainer.read_ahead, batches[1:])
                if self.group is not None and not batches:
                    self.group.send({"kind": "idle"})  # the ranks hear from us all the same
                keys: list[int] = []
                td_abs: list[np.ndarray] = []
                for batch in batches:
                    if self.group is not None:
                        # One message a batch, just before it is trained: between two
                        # batches (a publish, the job's end) the other ranks wait for
                        # the next message, never in a training collective.
                        self.group.send({"kind": "batch", "batch": dump(batch)})
                    outcome = self.trainer.train_batch(batch)
                    if outcome is None:
                        continue
                    self.metrics.train_iterations.inc()
                    keys += outcome.keys
                    td_abs.append(outcome.td_abs)
                    if learner.train_iter % learn.publish_every_iters == 0:
                        self.publish()
                    if learner.train_iter % learn.checkpoint_every_iters == 0:
                        self.checkpoint()
                    elapsed = time.monotonic() - started
                    set_progress(
                        ctx.progress,
                        train_iter=learner.train_iter,
                        train_iters_per_s=round((learner.train_iter - start_iter) / elapsed, 1),
                        loss=round(outcome.loss, 5),
                        q_mean=round(outcome.q_mean, 4),
                        unusable_segments=len(self.cache.unusable),
                        skipped_updates=learner.skipped_updates,
                    )
                    set_rank_rates(ctx.progress, outcome.rank_samples_per_s)
                    self.board.train_s += time.monotonic() - trained
                    trained = time.monotonic()
                    self.board.add(
                        learner.train_iter,
                        outcome.scalars,
                        outcome.rank_samples_per_s,
                        every_iters=TB_EVERY_ITERS,
                    )
                if self.prioritized and keys:
                    priorities.submit(self.send_priorities, keys, np.concatenate(td_abs))
                if reply is not None and reply.hold_id is not None:
                    self.trained_holds.append(reply.hold_id)
        except JobOver as exc:
            log.info("learning stops: %s", exc)
            ctx.stop.set()
        except GroupBroken:
            self.checkpoint()  # the state after the last update every rank took
            raise
        finally:
            prefetch.shutdown(wait=False, cancel_futures=True)
            reader.shutdown(wait=False, cancel_futures=True)
            priorities.shutdown(wait=False, cancel_futures=True)
            self.board.log.close()
        self.checkpoint()
        return {"train_iter": learner.train_iter, "policy_version": self.version}

    def fetch(self) -> SampleReply | None:
        learn = self.config.policy.learn
        return self.sample(learn.batch_size, learn.num_batches)

    def sample(self, batch_size: int, num_batches: int) -> SampleReply | None:
        """One long-poll for data; None when there was none in time (or no coordinator).

        It acknowledges the holds this session has trained on since the last request:
        items of a fifo buffer are held for this task until then, and go back to the
        buffer if the task ends first.
        """
        acknowledge, self.trained_holds = self.trained_holds, []
        try:
            return self.ctx.coordinator.sample(
                self.job_id,
                batch_size=batch_size,
                num_batches=num_batches,
                timeout_s=self.config.policy.learn.sample_timeout_s,
                task_id=self.ctx.task.task_id,
                acknowledge=acknowledge,
            )
        except ApiError as exc:
            if exc.status == 503:  # sample_timeout, or a coordinator restarting
                self.sample_timeouts += 1
                self.trained_holds = acknowledge + self.trained_holds  # say it again
                return None
            if exc.status in (401, 403, 404, 409):  # the job ended, or this task did
                raise JobOver(exc.message) from exc
            raise
        except ServiceUnavailable as exc:
            self.trained_holds = acknowledge + self.trained_holds
            log.warning("sampling failed (%s); retrying", exc)
            self.ctx.stop.wait(1.0)
            return None

    def send_priorities(self, keys: list[int], td_abs: np.ndarray) -> None:
        try:
            self.ctx.coordinator.update_priorities(
                self.job_id, keys, priorities_of(td_abs), task_id=self.ctx.task.task_id
            )
        except (ApiError, ServiceUnavailable) as exc:
            # Stale priorities only make sampling a little less sharp: carry on.
            log.warning("priority update failed: %s", exc)

    def publish(self) -> None:
        """Write the next policy version and announce it to the coordinator.

        Raises:
            NonFiniteWeights: a weight is NaN or inf; nothing is written or announced.
        """
        learner = self.learner
        tensors = state_to_numpy(learner.online)
        if not _finite(tensors):
            raise NonFiniteWeights(f"non-finite weights after train_iter {learner.train_iter}")
        self.version += 1
        path, sha = self.store.write_policy(
            self.job_id, self.version, learner.train_iter, self.config.policy.type, tensors
        )
        ref = PolicyRef(version=self.version, path=path, sha256=sha, train_iter=learner.train_iter)
        try:
            # Patient: a coordinator restarting must not cost this task (the version is
            # on disk either way, and a restored coordinator adopts it).
            patiently(
                self.ctx.stop,
                lambda: self.ctx.coordinator.announce_policy(
                    self.job_id, ref, task_id=self.ctx.task.task_id
                ),
            )
        except ApiError as exc:
            if exc.code in ("job_finished", "task_not_active") or exc.status in (401, 403, 404):
                raise JobOver(exc.message) from exc
            raise
        self.metrics.publishes.inc()
        self.metrics.policy_version.set(self.version)
        set_progress(self.ctx.progress, policy_version=self.version)

    def checkpoint(self) -> None:
        """Write a checkpoint and keep the newest `KEEP_CHECKPOINTS`.

        Raises:
            NonFiniteWeights: a weight (or optimizer moment) is NaN or inf: a learner
                resuming from it could never train again, so nothing is written.
        """
        state = self.learner.state_dict()
        if not _finite(state):
            raise NonFiniteWeights(f"non-finite weights after train_iter {self.learner.train_iter}")
        checkpoint = Checkpoint(
            model=state, policy_version=self.version, algo=self.config.policy.type
        )
        _, size = write_checkpoint(self.store, self.job_id, self.learner.train_iter, checkpoint)
        folder = f"{self.job_id}/checkpoints"
        self.metrics.checkpoints.inc()
        self.metrics.checkpoint_bytes.inc(size)
        for old in self.store.list_dir(folder)[:-KEEP_CHECKPOINTS]:
            self.store.delete(f"{folder}/{old}")


class _RoundSession(_LearnSession):
    """The sync workflow (PPO): each round, exactly `n_sample` items collected with the
    current version, `epoch_per_collect` passes over them, then the next version.

    The buffer is a fifo queue that evicts anything older than the newest version, so
    no item collected by an older policy is ever trained on.
    """

    def run(self) -> dict[str, Any]:
        ctx, learner = self.ctx, self.learner
        learn = self.config.policy.learn
        started = time.monotonic()
        try:
            self.publish()  # version v: the collectors start the first round with it
            while not ctx.stopped():
                waited = time.monotonic()
                reply = self.fetch_round()
                self.board.wait_s += time.monotonic() - waited
                if reply is None:
                    if self.group is not None:
                        self.group.send({"kind": "idle"})
                    continue
                columns, versions = self.round_data(reply)
                if set(versions) - {self.version}:
                    # The buffer evicts older data; this guards the promise itself.
                    raise RuntimeError(f"round of version {self.version} held {set(versions)}")
                if self.group is not None:
                    self.group.send({"kind": "round", "batch": dump(reply.batches[0])})
                previous = learner.train_iter
                # A round of unusable segments only trains nothing, but the collectors
                # wait for the next version all the same.
                trained = time.monotonic()
                outcome = self.trainer.train_round(columns)
                self.board.train_s += time.monotonic() - trained
                self.metrics.train_iterations.inc(max(0, learner.train_iter - previous))
                self.publish()
                if reply.hold_id is not None:
                    self.trained_holds.append(reply.hold_id)
                if (
                    learner.train_iter // learn.checkpoint_every_iters
                    > previous // learn.checkpoint_every_iters
                ):
                    self.checkpoint()
                set_progress(
                    ctx.progress,
                    train_iter=learner.train_iter,
                    train_iters_per_s=round(learner.train_iter / (time.monotonic() - started), 1),
                    unusable_segments=len(self.cache.unusable),
                    skipped_updates=learner.skipped_updates,
                )
                if outcome is not None:
                    set_progress(
                        ctx.progress,
                        loss=round(outcome.loss, 5),
                        entropy=round(outcome.entropy, 4),
                        approx_kl=round(outcome.approx_kl, 5),
                    )
                    set_rank_rates(ctx.progress, outcome.rank_samples_per_s)
                    self.board.add(
                        learner.train_iter,
                        outcome.scalars,
                        outcome.rank_samples_per_s,
                        every_iters=1,
                    )
        except JobOver as exc:
            log.info("learning stops: %s", exc)
            ctx.stop.set()
        except GroupBroken:
            self.checkpoint()
            raise
        finally:
            self.board.log.close()
        self.checkpoint()
        return {"train_iter": learner.train_iter, "policy_version": self.version}

    def fetch_round(self) -> SampleReply | None:
        return self.sample(self.config.policy.collect.n_sample, 1)

    def round_data(self, reply: SampleReply) -> tuple[dict[str, np.ndarray], list[int]]:
        """This rank's usable rows of the round, and the policy versions of the round's
        segments that are not known to be unusable (a segment whose header cannot be
        read is skipped like any unusable one)."""
        (batch,) = reply.batches
        versions: dict[str, int] = {}
        for segment in batch.segments:
            if segment.path in self.cache.unusable or segment.path in versions:
                continue
            header = self.cache.header(segment.path)
            if header is None:
                continue  # skipped
            try:
                versions[segment.path] = int(header["policy_version"])
            except _UNUSABLE as exc:  # KeyError: no version recorded
                self.cache.skip(segment.path, f"unreadable header: {exc!r}")
        columns = self.trainer.round_share(batch)
        return columns, [v for path, v in versions.items() if path not in self.cache.unusable]


class TrainBoard:
    """The learner's TensorBoard scalars, in `<job_id>/tb/learner/`, against train_iter:
    the algorithm's own tags (`BatchReport.scalars`: each loss term, value estimates,
    entropy, KL, gradient norm, learning rate), each the mean over the updates since
    the last point; `train/updates_per_s` (since the last point),
    `train/samples_per_s` (items trained per second, all ranks), and
    `train/sample_wait_fraction` (of the time since the last point, the part spent
    waiting for samples rather than training)."""

    def __init__(self, store: SharedStore, job_id: str, train_iter: int) -> None:
        self.log = ScalarLog(store, job_tb_dir(job_id, "learner"))
        self._since, self._iter = time.monotonic(), train_iter
        #: Seconds spent waiting for samples, and training, since the last point.
        self.wait_s = self.train_s = 0.0
        #: Per tag, the sum and count of its finite values since the last point.
        self._sums: dict[str, list[float]] = {}

    def add(
        self,
        train_iter: int,
        scalars: dict[str, float],
        rank_samples_per_s: list[float],
        *,
        every_iters: int,
    ) -> None:
        """Take one update's (or round's) `scalars`; write a point when `every_iters`
        train iterations passed since the last one."""
        for tag, value in scalars.items():
            if math.isfinite(value):
                total = self._sums.setdefault(tag, [0.0, 0])
                total[0] += value
                total[1] += 1
        if train_iter - self._iter < every_iters:
            return
        now = time.monotonic()
        busy = self.wait_s + self.train_s
        values: dict[str, float | None] = {tag: s / n for tag, (s, n) in self._sums.items()}
        values["train/updates_per_s"] = (train_iter - self._iter) / max(now - self._since, 1e-9)
        values["train/samples_per_s"] = sum(rank_samples_per_s)
        values["train/sample_wait_fraction"] = self.wait_s / busy if busy > 0 else None
        self.log.scalars(train_iter, values)
        self._since, self._iter = now, train_iter
        self.wait_s = self.train_s = 0.0
        self._sums.clear()


def set_rank_rates(progress: dict[str, float], rank_samples_per_s: list[float]) -> None:
    """The learner's throughput in a task's progress: items trained per second in all,
    and, for a group, by each rank (`rank_0_samples_per_s`, ...) and its world size."""
    set_progress(progress, samples_per_s=round(sum(rank_samples_per_s), 1))
    if len(rank_samples_per_s) > 1:
        set_progress(progress, world_size=len(rank_samples_per_s))
        for rank, rate in enumerate(rank_samples_per_s):
            set_progress(progress, **{f"rank_{rank}_samples_per_s": round(rate, 1)})
