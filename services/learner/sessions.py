"""A learn task's loop, in the mode its spec says: `BatchSession` trains on batches as
the buffer samples them (`LearnSpec.mode` batches: the async workflow), `RoundSession`
on one whole on-policy round per policy version (rounds: the sync workflow).

A session asks the coordinator for data, trains on it through its `Trainer`, publishes
a policy version every `publish_every_iters` (a round: after each) and writes a
checkpoint every `checkpoint_every_iters`, keeping the newest `KEEP_CHECKPOINTS`. Its
files carry its learn lease's epoch (`LearnSpec.epoch`): policy versions are written
once, and checkpoints are named by epoch and never deleted by an older epoch, so a
learner whose lease was taken over, waking late, cannot spoil its successor's files
(docs/architecture.md, "Fencing"). In a learner group it runs on rank 0, which sends
the other ranks each batch or round just before training on it
(services/learner/aggregator.py).

Usage (what `LearnerRunner` does)::

    result = BatchSession(ctx, config, store, learner, version, group).run()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry

from algorithms.base import Learner
from common.checkpoint_file import Checkpoint, write_checkpoint
from common.config import JobConfig
from common.errors import ApiError
from common.messages import LearnSpec, PolicyRef, SampleReply, dump
from common.storage import SharedStore
from common.storage_full import retry_while_full
from jobconfig import algorithm_of, sequence_length_of
from services.learner.background import BackgroundWrites, copy_state
from services.learner.feeder import ProcessFeed, feeder_start
from services.learner.group import GroupBroken, RankGroup
from services.learner.guards import NonFiniteWeights, finite, priorities_of, set_progress
from services.learner.metrics import LearnerMetrics
from services.learner.sampling import JobOver, Outbox, Sampler
from services.learner.segments import UNUSABLE, SegmentCache, SegmentSchema
from services.learner.tensorboard import TrainBoard
from services.learner.training import Trainer
from services.slave.core import TaskContext, patiently

log = logging.getLogger(__name__)
T = TypeVar("T")

KEEP_CHECKPOINTS = 2
#: Train iterations between two points of the learner's TensorBoard scalars (a round of
#: the sync workflow writes one at its end).
TB_EVERY_ITERS = 10


class BatchSession:
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
        feed_process: bool = False,
    ) -> None:
        """`feed_process`: batches come from a feeder process (services/learner/
        feeder.py) instead of a sampling thread of this one (a learner alone only:
        `learn.feed`)."""
        self.ctx = ctx
        self.metrics = metrics or LearnerMetrics(CollectorRegistry())
        self.config = config
        self.store = store
        self.learner = learner
        #: The newest policy version taken (by `_policy_snapshot`, or a write that
        #: found its number taken); `_versions` guards it between the two threads.
        self.version = version
        self._versions = threading.Lock()
        #: The newest version this session wrote (the writes thread's).
        self.written_version = version
        self.group = group
        self.job_id = ctx.task.job_id
        #: This learn lease's epoch: in every file this session writes.
        self.epoch = ctx.task.spec.epoch if isinstance(ctx.task.spec, LearnSpec) else 0
        schema = SegmentSchema.for_policy(
            config.policy, algorithm_of(config).column_names_for(config.policy)
        )
        self.cache = SegmentCache(
            store,
            self.job_id,
            schema,
            unusable=ctx.unusable_segments,
            sequence_length=sequence_length_of(config),
        )
        self.trainer = Trainer(
            learner, self.cache, group, takes_sequences=algorithm_of(config).recurrent
        )
        #: What the next sample request tells the coordinator (holds trained on, new
        #: priorities), added to by the training thread, taken by the sampling one.
        self.outbox = Outbox()
        self.sampler = Sampler(
            ctx.data,
            self.job_id,
            ctx.task.task_id,
            self.outbox,
            sample_timeout_s=config.policy.learn.sample_timeout_s,
            stop=ctx.stop,
        )
        self.feed_process = feed_process
        self.prioritized = config.policy.other.replay_buffer.type == "prioritized"
        self.board = TrainBoard(store, self.job_id, learner.train_iter)
        #: Publishes and checkpoints written while training goes on (`publish_soon`,
        #: `checkpoint_soon`); `run` waits for the last one before it returns.
        self.writes = BackgroundWrites("writes")

    def run(self) -> dict[str, Any]:
        learn = self.config.policy.learn
        ctx, learner = self.ctx, self.learner
        started, start_iter = time.monotonic(), learner.train_iter
        feed = self._process_feed() if self.feed_process else ThreadFeed(self)
        try:
            self.publish()  # collectors act with the resumed (or fresh) network at once
            while not ctx.stopped():
                waited = time.monotonic()
                reply = feed.next()
                trained = time.monotonic()
                self.board.wait_s += trained - waited
                if reply is None or ctx.stopped():
                    break
                batches = reply.batches
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
                    self.writes.check()  # a failed publish or checkpoint ends the task here
                    if learner.train_iter % learn.publish_every_iters == 0:
                        self.publish_soon()
                    if learner.train_iter % learn.checkpoint_every_iters == 0:
                        self.checkpoint_soon()
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
                # Sent with the next request that has not left yet: a priority is
                # applied a request or two after its item trained (two or three with
                # the feeder process, which asks for a reply while it hands one over).
                feed.trained(reply.hold_id, *self.new_priorities(keys, td_abs))
            self.writes.wait()  # the last version is announced before the task ends
        except JobOver as exc:
            log.info("learning stops: %s", exc)
            ctx.stop.set()
        except GroupBroken:
            self.writes.close()
            self.checkpoint()  # the state after the last update every rank took
            raise
        finally:
            try:
                feed.close()  # the last priorities are sent
            finally:
                self.writes.close()
                self.board.log.close()
        self.checkpoint()
        return {"train_iter": learner.train_iter, "policy_version": self.version}

    def _process_feed(self) -> ProcessFeed:
        learn = self.config.policy.learn
        start = feeder_start(
            self.ctx.data,
            self.job_id,
            self.ctx.task.task_id,
            str(self.store.root),
            self.cache.schema,
            batch_size=learn.batch_size,
            num_batches=learn.num_batches,
            sample_timeout_s=learn.sample_timeout_s,
            sequence_length=self.cache.sequence_length,
        )
        feed = ProcessFeed.start(start, self.ctx.stop, self.cache.unusable)
        # Its requests carry the task's credential: renewed there as heartbeats renew it.
        self.ctx.on_renew.append(feed.renew)
        return feed

    def fetch(self) -> SampleReply | None:
        """The next sample request (on the prefetch thread, while the batches of the
        one before train: those trained on are one request older than the newest the
        buffer could give, a staleness a replay buffer's sampling has anyway), its
        segments' reads started as soon as it is answered."""
        learn = self.config.policy.learn
        reply = self.sample(learn.batch_size, learn.num_batches)
        if reply is not None:
            self.trainer.start_reads(reply.batches)
        return reply

    def hold_trained(self, hold_id: str) -> None:
        """Note a hold whose items are trained on, for the next request to acknowledge."""
        self.outbox.add(hold_id, [], [])

    def new_priorities(
        self, keys: list[int], td_abs: list[np.ndarray]
    ) -> tuple[list[int], list[float]]:
        """The keys and new priorities of items just trained on (none unless the buffer
        is prioritized)."""
        if not (self.prioritized and keys):
            return [], []
        return keys, priorities_of(np.concatenate(td_abs))

    def sample(self, batch_size: int, num_batches: int) -> SampleReply | None:
        """One long-poll for data (`Sampler.sample`); None when there was none in time."""
        return self.sampler.sample(batch_size, num_batches)

    def publish(self) -> None:
        """Write the next policy version and announce it to the coordinator.

        Raises:
            NonFiniteWeights: a weight is NaN or inf; nothing is written or announced.
        """
        self.write_policy(*self._policy_snapshot())

    def publish_soon(self) -> None:
        """`publish`, its file written and announced on `self.writes`' thread while
        training goes on: the weights are copied here first, and the version is taken
        here, so versions stay in order and a NonFiniteWeights is raised here at once.
        A failure of the write or the announce is raised at the training thread's
        next `writes.check()`."""
        self.writes.submit(self.write_policy, *self._policy_snapshot())

    def _policy_snapshot(self) -> tuple[int, int, dict[str, np.ndarray]]:
        """(the next version, its train_iter, a copy of the online network's weights);
        the version is this session's from now on.

        Raises:
            NonFiniteWeights: a weight is NaN or inf (the version is not taken).
        """
        learner = self.learner
        tensors = {k: v.numpy() for k, v in copy_state(learner.online.state_dict()).items()}
        if not finite(tensors):
            raise NonFiniteWeights(f"non-finite weights after train_iter {learner.train_iter}")
        with self._versions:
            self.version += 1
            return self.version, learner.train_iter, tensors

    def while_full(self, write: Callable[[], T], what: str) -> T:
        """`write()`, tried again while the shared volume is full, up to the job's
        `system.storage_grace_s` (common/storage_full.py)."""
        return retry_while_full(
            write,
            grace_s=self.config.system.storage_grace_s,
            what=what,
            stopped=self.ctx.dropping,
            sleep=self.ctx.pause,
            progress=self.ctx.progress,
        )

    def write_policy(self, version: int, train_iter: int, tensors: dict[str, np.ndarray]) -> None:
        """Write `version` (or the first free number past it) and announce it."""
        while True:
            version = max(version, self.written_version + 1)
            try:
                path, sha = self.while_full(
                    lambda version=version: self.store.write_policy(
                        self.job_id,
                        version,
                        train_iter,
                        self.config.policy.type,
                        tensors,
                        epoch=self.epoch,
                    ),
                    f"policy version {version}",
                )
                break
            except FileExistsError:
                # Written by another learner: one whose lease this one took over and
                # that woke late (its announce is refused), or one whose announce
                # never arrived. Its file stays as it is; this one goes past it.
                log.warning("policy version %d exists: publishing a later one", version)
                self.written_version = version
        self.written_version = version
        with self._versions:
            self.version = max(self.version, version)
        ref = PolicyRef(
            version=version, path=path, sha256=sha, train_iter=train_iter, epoch=self.epoch
        )
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
        self.metrics.policy_version.set(version)
        set_progress(self.ctx.progress, policy_version=version)

    def checkpoint(self) -> None:
        """Write a checkpoint and keep the newest `KEEP_CHECKPOINTS`.

        Raises:
            NonFiniteWeights: a weight (or optimizer moment) is NaN or inf: a learner
                resuming from it could never train again, so nothing is written.
        """
        self.write_checkpoint(*self._checkpoint_state(self.learner.state_dict()))

    def checkpoint_soon(self) -> None:
        """`checkpoint`, written on `self.writes`' thread from a copy of the state made
        here (NonFiniteWeights is raised here at once)."""
        self.writes.submit(
            self.write_checkpoint, *self._checkpoint_state(copy_state(self.learner.state_dict()))
        )

    def _checkpoint_state(self, state: dict[str, Any]) -> tuple[int, Checkpoint]:
        if not finite(state):
            raise NonFiniteWeights(f"non-finite weights after train_iter {self.learner.train_iter}")
        checkpoint = Checkpoint(
            model=state, policy_version=self.version, algo=self.config.policy.type
        )
        return self.learner.train_iter, checkpoint

    def write_checkpoint(self, train_iter: int, checkpoint: Checkpoint) -> None:
        _, size = self.while_full(
            lambda: write_checkpoint(
                self.store, self.job_id, train_iter, checkpoint, epoch=self.epoch
            ),
            f"the checkpoint of train_iter {train_iter}",
        )
        self.metrics.checkpoints.inc()
        self.metrics.checkpoint_bytes.inc(size)
        # The newest few of this lease and those before it: a later lease's files are
        # its successor's, never this learner's to delete.
        ours = self.store.checkpoints(self.job_id, up_to_epoch=self.epoch)
        for old in ours[:-KEEP_CHECKPOINTS]:
            self.store.delete(f"{self.job_id}/checkpoints/{old}")


class RoundSession(BatchSession):
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
                    self.hold_trained(reply.hold_id)
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
            except UNUSABLE as exc:  # KeyError: no version recorded
                self.cache.skip(segment.path, f"unreadable header: {exc!r}")
        columns = self.trainer.round_share(batch)
        return columns, [v for path, v in versions.items() if path not in self.cache.unusable]


class ThreadFeed:
    """A session's batches asked for on a prefetch thread of the learner's own process:
    the next request goes out as the batches of the one before start training."""

    def __init__(self, session: BatchSession) -> None:
        self.session = session
        self._prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._future: Future[SampleReply | None] = self._prefetch.submit(session.fetch)

    def next(self) -> SampleReply | None:
        """The next reply (no batches: none came in time); None once the task stops."""
        reply = self._future.result()
        if self.session.ctx.stopped():
            return None
        self._future = self._prefetch.submit(self.session.fetch)
        return reply if reply is not None else SampleReply(batches=[])

    def trained(self, hold_id: str | None, keys: list[int], priorities: list[float]) -> None:
        self.session.outbox.add(hold_id, keys, priorities)

    def close(self) -> None:
        self._prefetch.shutdown(wait=False, cancel_futures=True)
        self.session.sampler.send_last_priorities()


def set_rank_rates(progress: dict[str, float], rank_samples_per_s: list[float]) -> None:
    """The learner's throughput in a task's progress: items trained per second in all,
    and, for a group, by each rank (`rank_0_samples_per_s`, ...) and its world size."""
    set_progress(progress, samples_per_s=round(sum(rank_samples_per_s), 1))
    if len(rank_samples_per_s) > 1:
        set_progress(progress, world_size=len(rank_samples_per_s))
        for rank, rate in enumerate(rank_samples_per_s):
            set_progress(progress, **{f"rank_{rank}_samples_per_s": round(rate, 1)})
