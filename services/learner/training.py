"""One rank's training: the job's learner built for a task (`new_learner`), and the
`Trainer`, which reads this rank's share of each global batch or round through the
`SegmentCache` and trains on it. In a learner group the ranks agree on every update,
and rank 0 gets the outcome merged over them (`BatchOutcome`, `RoundOutcome`).

Usage::

    learner = new_learner(config, seed, group)    # group None: a learner on its own
    trainer = Trainer(learner, cache, group)
    outcome = trainer.train_batch(batch)          # None: nothing trained, or rank > 0
"""

from __future__ import annotations

import functools
import time
import warnings
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch

from algorithms.base import BatchLearner, BatchReport, Learner, RoundLearner
from algorithms.registry import ALGORITHMS
from algorithms.sync import AllReduceSync
from common.config import JobConfig
from common.messages import SampledBatch
from services.learner.feeder import ReadyBatch
from services.learner.group import RankGroup, share_bounds, share_of
from services.learner.segments import VALID, SegmentCache

L = TypeVar("L", bound=Learner)


def _as(learner: Learner, protocol: type[L]) -> L:
    """The learner, checked to offer what the task's mode calls.

    Raises:
        TypeError: it does not (the algorithm's collect unit and the task's mode disagree).
    """
    if not isinstance(learner, protocol):
        raise TypeError(f"{type(learner).__name__} is no {protocol.__name__}")
    return learner


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

    def __init__(
        self,
        learner: Learner,
        cache: SegmentCache,
        group: RankGroup | None,
        *,
        takes_sequences: bool = False,
    ) -> None:
        """`takes_sequences`: the learner trains on `[items, time]` batches (a recurrent
        algorithm's); otherwise sequence items are trained on as their rows."""
        self.learner = learner
        self.takes_sequences = takes_sequences
        self.cache = cache
        self.group = group
        self._started = time.monotonic()
        self._samples = 0

    # Checked once: an isinstance check against a runtime protocol walks its members,
    # tens of microseconds that an update of a small network would pay each time.
    @functools.cached_property
    def _batch_learner(self) -> BatchLearner:
        return _as(self.learner, BatchLearner)

    @functools.cached_property
    def _round_learner(self) -> RoundLearner:
        return _as(self.learner, RoundLearner)

    def _rate(self, samples: int) -> float:
        self._samples += samples
        return self._samples / max(time.monotonic() - self._started, 1e-9)

    def train_batch(self, batch: SampledBatch | ReadyBatch) -> BatchOutcome | None:
        """One update on the batch (this rank's share of it), merged over the ranks;
        None when no rank had a usable row (no rank stepped), and on ranks other than
        0, which only take part. A learner alone may be given the batch already
        gathered (by its feeder process)."""
        learner = self._batch_learner
        group = self.group
        if isinstance(batch, ReadyBatch) and group is not None:
            raise TypeError("a learner group gathers its own shares of each batch")
        if group is None:
            if isinstance(batch, ReadyBatch):
                columns, weights, keys = batch.columns, batch.weights, batch.keys
            else:
                columns, weights, keys = self.cache.gather(batch)
            if not len(weights):
                return None
            info = self._learn(learner, columns, weights)
            rate = self._rate(len(weights))
            return BatchOutcome(keys, info.td_abs, info.loss, info.q_mean, [rate], info.scalars)
        mine = share_of(batch, group.rank, group.world_size)
        columns, weights, kept = self.cache.gather_kept(mine)
        # A rank with nothing to train on cannot take part in the gradient all-reduce:
        # all skip the batch together.
        if group.all_min(len(weights)) == 0:
            return None
        info = self._learn(learner, columns, weights)
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

    def _learn(
        self, learner: BatchLearner, columns: dict[str, np.ndarray], weights: np.ndarray
    ) -> BatchReport:
        """One update. Sequence items (`[items, time]` columns with a `VALID` mask) go
        as they are to a learner that takes sequences (a recurrent one); any other
        learns on their valid rows as transitions, and an item's new priority is its
        rows' highest."""
        if VALID not in columns or self.takes_sequences:
            return learner.learn_batch(columns, weights)
        valid = columns[VALID].astype(bool)
        flat = {k: v[valid] for k, v in columns.items() if k != VALID}
        items = np.nonzero(valid)[0]
        info = learner.learn_batch(flat, weights[items])
        td_abs = np.zeros(len(weights))
        np.maximum.at(td_abs, items, np.asarray(info.td_abs, dtype=np.float64))
        return ItemReport(info.loss, info.q_mean, td_abs, info.scalars)

    def start_reads(self, batches: list[SampledBatch]) -> None:
        """Start reading this rank's segments of batches to come that are neither cached
        nor being read, without waiting (`SegmentCache.start_reads`): the reads run on
        the reading threads while the batches before them train, and `train_batch`
        waits for any still under way, within the cache's bound."""
        group = self.group
        if group is not None:
            batches = [share_of(b, group.rank, group.world_size) for b in batches]
        self.cache.start_reads(batches)

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
        learner = self._round_learner
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
class ItemReport:
    """A `BatchReport` whose `td_abs` is one per item of a sequence batch."""

    loss: float
    q_mean: float
    td_abs: np.ndarray
    scalars: dict[str, float]


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
