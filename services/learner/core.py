"""The learner's work: a `learn` task. No Flask.

The learner asks the coordinator for `num_batches` batches at once, prefetching the
next request while it trains on the current one; reads the sampled rows from the
segment files (caching them: segments are immutable); trains; every
`publish_every_iters` writes a new policy version and announces it; every
`checkpoint_every_iters` writes a checkpoint, from which a restarted learner resumes.
"""

from __future__ import annotations

import collections
import io
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from common.config import JobConfig, read_job_config
from common.errors import ApiError
from common.http import ServiceUnavailable
from common.messages import PolicyRef, SampledBatch, SampleReply
from common.models import load_numpy_state, state_to_numpy
from common.slave import TaskContext
from common.storage import CorruptFileError, SharedStore
from services.learner.algorithms.dqn import DQN
from services.learner.algorithms.impala import Impala
from services.learner.algorithms.ppo import PPO
from services.learner.algorithms.sac import SAC

log = logging.getLogger(__name__)

KEEP_CHECKPOINTS = 2


class JobOver(Exception):
    """The job ended (or was forgotten): the task stops."""


class SegmentCache:
    """Recently read segments, by path. Segments never change, so no invalidation.

    A segment that cannot be read, or lacks the columns the algorithm trains on, costs
    its rows, not the job: it is skipped, counted, and not read again.
    """

    def __init__(
        self,
        store: SharedStore,
        job_id: str,
        columns: tuple[str, ...],
        max_segments: int = 4096,
        unusable: set[str] | None = None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.columns = columns
        self.max_segments = max_segments
        #: Paths skipped (shared with the task context, which reports them).
        self.unusable: set[str] = unusable if unusable is not None else set()
        self._cache: collections.OrderedDict[str, dict[str, np.ndarray]] = collections.OrderedDict()

    def get(self, path: str) -> dict[str, np.ndarray] | None:
        columns = self._cache.get(path)
        if columns is not None:
            self._cache.move_to_end(path)
            return columns
        if path in self.unusable:
            return None
        try:
            self.store.resolve(path, under=f"{self.job_id}/segments")
            columns = self.store.read_segment(path)
            missing = [c for c in self.columns if c not in columns]
            if missing:
                raise CorruptFileError(f"no column {', '.join(missing)}")
            if len({len(columns[c]) for c in self.columns}) != 1:
                raise CorruptFileError("columns differ in length")
        except (OSError, CorruptFileError, ValueError) as exc:
            self.unusable.add(path)
            log.warning("skipping unusable segment %s: %s", path, exc)
            return None
        self._cache[path] = columns
        if len(self._cache) > self.max_segments:
            self._cache.popitem(last=False)
        return columns

    def gather(self, batch: SampledBatch) -> tuple[dict[str, np.ndarray], np.ndarray, list[int]]:
        """The batch's rows as columns, with their weights and keys (rows of unreadable
        segments left out)."""
        parts: list[dict[str, np.ndarray]] = []
        keep: list[bool] = []
        for segment in batch.segments:
            columns = self.get(segment.path)
            keep.extend([columns is not None] * len(segment.rows))
            if columns is not None:
                rows = np.asarray(segment.rows)
                if rows.size and (rows.min() < 0 or rows.max() >= len(columns[self.columns[0]])):
                    keep[-len(segment.rows) :] = [False] * len(segment.rows)
                    self.unusable.add(segment.path)
                    log.warning("rows out of range in %s: skipped", segment.path)
                    continue
                parts.append({k: columns[k][rows] for k in self.columns})
        if not parts:
            return {}, np.zeros(0, dtype=np.float32), []
        mask = np.asarray(keep)
        joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        weights = np.asarray(batch.weights, dtype=np.float32)[mask]
        keys = [k for k, kept in zip(batch.keys, keep, strict=True) if kept]
        return joined, weights, keys


class LearnerRunner:
    """Runs `learn` tasks (the TaskRunner of a learner)."""

    kinds = frozenset({"learn"})

    def __init__(self, store: SharedStore) -> None:
        self.store = store

    def run(self, ctx: TaskContext) -> dict[str, Any]:
        job_id = ctx.task.job_id
        config = read_job_config(self.store, job_id)
        torch.set_num_threads(config.system.torch_num_threads)
        spec = ctx.task.typed_spec()
        torch.manual_seed(spec.seed)
        device = torch.device(config.policy.torch_device)
        if config.policy.type == "ppo":
            ppo = PPO(config.policy, device)
            version = self._resume(job_id, ppo, ctx)
            return _RoundSession(ctx, config, self.store, ppo, version).run()
        algorithms = {"dqn": DQN, "impala": Impala, "sac": SAC}
        algo = algorithms[config.policy.type](config.policy, device)
        version = self._resume(job_id, algo, ctx)
        return _LearnSession(ctx, config, self.store, algo, version).run()

    def _resume(self, job_id: str, dqn: DQN | PPO | Impala | SAC, ctx: TaskContext) -> int:
        """Continue where the job's last learner stopped; return the newest policy
        version in use, which the next publish goes past (versions stay monotonic).

        The newest readable checkpoint gives networks, optimizer and counters. When a
        newer policy was published after it, its weights and train iteration are taken
        too (the target network restarts from them), so little training is repeated.
        """
        version = 0
        folder = f"{job_id}/checkpoints"
        for name in reversed(self.store.list_dir(folder)):
            try:
                data = self.store.read_bytes(f"{folder}/{name}")
                state = torch.load(io.BytesIO(data), map_location=dqn.device, weights_only=True)
                dqn.load_state_dict(state["model"])
                version = int(state["policy_version"])
                log.info("resumed from %s at train_iter %d", name, dqn.train_iter)
                break
            except Exception as exc:  # a damaged checkpoint: try the one before it
                log.warning("checkpoint %s unusable: %s", name, exc)
        try:
            latest = ctx.coordinator.latest_policy(job_id)
        except (ApiError, ServiceUnavailable) as exc:
            raise JobOver(f"cannot read the newest policy version: {exc}") from exc
        if latest is not None and latest.train_iter > dqn.train_iter:
            try:
                policy = self.store.read_policy(latest.path, sha256=latest.sha256)
                load_numpy_state(dqn.online, policy.tensors)
                if isinstance(dqn, DQN):
                    dqn.target.load_state_dict(dqn.online.state_dict())
                dqn.train_iter = policy.train_iter
                log.info(
                    "took version %d's weights (train_iter %d)", latest.version, policy.train_iter
                )
            except (OSError, CorruptFileError, RuntimeError) as exc:
                log.warning("newest policy %d unusable: %s", latest.version, exc)
        # A version written but never announced (the coordinator restarted) still owns
        # its file name: never write that version again.
        on_disk = [
            int(name.split(".")[0])
            for name in self.store.list_dir(f"{job_id}/policies")
            if name.endswith(".safetensors") and name.split(".")[0].isdigit()
        ]
        return max([version, latest.version if latest else 0, *on_disk])


class _LearnSession:
    def __init__(
        self, ctx: TaskContext, config: JobConfig, store: SharedStore, dqn: DQN, version: int
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.store = store
        self.dqn = dqn
        self.version = version
        self.job_id = ctx.task.job_id
        self.cache = SegmentCache(store, self.job_id, dqn.COLUMNS, unusable=ctx.unusable_segments)
        self.sample_timeouts = 0
        self.prioritized = config.policy.other.replay_buffer.type == "prioritized"

    def run(self) -> dict[str, Any]:
        learn = self.config.policy.learn
        ctx, dqn = self.ctx, self.dqn
        started, start_iter = time.monotonic(), dqn.train_iter
        prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        # Priorities go back on their own thread, so training never waits for them.
        priorities = ThreadPoolExecutor(max_workers=1, thread_name_prefix="priorities")
        future: Future[SampleReply | None] = prefetch.submit(self.fetch)
        try:
            self.publish()  # collectors act with the resumed (or fresh) network at once
            while not ctx.stopped():
                reply = future.result()
                if ctx.stopped():
                    break
                future = prefetch.submit(self.fetch)
                keys: list[int] = []
                td_abs: list[np.ndarray] = []
                for batch in reply.batches if reply else []:
                    columns, weights, batch_keys = self.cache.gather(batch)
                    if not len(weights):
                        continue
                    info = dqn.learn_batch(columns, weights)
                    keys += batch_keys
                    td_abs.append(info.td_abs)
                    if dqn.train_iter % learn.publish_every_iters == 0:
                        self.publish()
                    if dqn.train_iter % learn.checkpoint_every_iters == 0:
                        self.checkpoint()
                    elapsed = time.monotonic() - started
                    ctx.progress.update(
                        train_iter=dqn.train_iter,
                        train_iters_per_s=round((dqn.train_iter - start_iter) / elapsed, 1),
                        loss=round(info.loss, 5),
                        q_mean=round(info.q_mean, 4),
                        unusable_segments=len(self.cache.unusable),
                    )
                if self.prioritized and keys:
                    priorities.submit(self.send_priorities, keys, np.concatenate(td_abs))
        except JobOver as exc:
            log.info("learning stops: %s", exc)
            ctx.stop.set()
        finally:
            prefetch.shutdown(wait=False, cancel_futures=True)
            priorities.shutdown(wait=False, cancel_futures=True)
        self.checkpoint()
        return {"train_iter": dqn.train_iter, "policy_version": self.version}

    def fetch(self) -> SampleReply | None:
        learn = self.config.policy.learn
        return self.sample(learn.batch_size, learn.num_batches)

    def sample(self, batch_size: int, num_batches: int) -> SampleReply | None:
        """One long-poll for data; None when there was none in time (or no coordinator)."""
        try:
            return self.ctx.coordinator.sample(
                self.job_id,
                batch_size=batch_size,
                num_batches=num_batches,
                timeout_s=self.config.policy.learn.sample_timeout_s,
            )
        except ApiError as exc:
            if exc.status == 503:  # sample_timeout, or a coordinator restarting
                self.sample_timeouts += 1
                return None
            if exc.status in (401, 403, 404, 409):  # the job ended, or this task did
                raise JobOver(exc.message) from exc
            raise
        except ServiceUnavailable as exc:
            log.warning("sampling failed (%s); retrying", exc)
            self.ctx.stop.wait(1.0)
            return None

    def send_priorities(self, keys: list[int], td_abs: np.ndarray) -> None:
        try:
            self.ctx.coordinator.update_priorities(self.job_id, keys, td_abs.tolist())
        except (ApiError, ServiceUnavailable) as exc:
            # Stale priorities only make sampling a little less sharp: carry on.
            log.warning("priority update failed: %s", exc)

    def publish(self) -> None:
        """Write the next policy version and announce it to the coordinator."""
        self.version += 1
        path, sha = self.store.write_policy(
            self.job_id, self.version, self.dqn.train_iter, "dqn", state_to_numpy(self.dqn.online)
        )
        ref = PolicyRef(version=self.version, path=path, sha256=sha, train_iter=self.dqn.train_iter)
        try:
            self.ctx.coordinator.announce_policy(self.job_id, ref, task_id=self.ctx.task.task_id)
        except ApiError as exc:
            if exc.code in ("job_finished", "task_not_active") or exc.status in (401, 403, 404):
                raise JobOver(exc.message) from exc
            raise
        self.ctx.progress["policy_version"] = self.version

    def checkpoint(self) -> None:
        buffer = io.BytesIO()
        torch.save({"model": self.dqn.state_dict(), "policy_version": self.version}, buffer)
        folder = f"{self.job_id}/checkpoints"
        path = self.store.checkpoint_path(self.job_id, self.dqn.train_iter)
        self.store.write_bytes(path, buffer.getvalue())
        for old in self.store.list_dir(folder)[:-KEEP_CHECKPOINTS]:
            self.store.delete(f"{folder}/{old}")


class _RoundSession(_LearnSession):
    """The sync workflow (PPO): each round, exactly `n_sample` items collected with the
    current version, `epoch_per_collect` passes over them, then the next version.

    The buffer is a fifo queue that evicts anything older than the newest version, so
    no item collected by an older policy is ever trained on.
    """

    def __init__(
        self, ctx: TaskContext, config: JobConfig, store: SharedStore, ppo: PPO, version: int
    ) -> None:
        super().__init__(ctx, config, store, ppo, version)  # type: ignore[arg-type]
        self.cache = SegmentCache(store, self.job_id, PPO.COLUMNS, unusable=ctx.unusable_segments)

    def run(self) -> dict[str, Any]:
        ctx, ppo = self.ctx, self.dqn
        learn = self.config.policy.learn
        started = time.monotonic()
        try:
            self.publish()  # version v: the collectors start the first round with it
            while not ctx.stopped():
                reply = self.fetch_round()
                if reply is None:
                    continue
                columns, versions = self.round_data(reply)
                if set(versions) != {self.version}:
                    # The buffer evicts older data; this guards the promise itself.
                    raise RuntimeError(f"round of version {self.version} held {set(versions)}")
                info = ppo.train_round(columns)
                previous = ppo.train_iter - info.updates
                self.publish()
                if (
                    ppo.train_iter // learn.checkpoint_every_iters
                    > previous // learn.checkpoint_every_iters
                ):
                    self.checkpoint()
                ctx.progress.update(
                    train_iter=ppo.train_iter,
                    train_iters_per_s=round(ppo.train_iter / (time.monotonic() - started), 1),
                    loss=round(info.loss, 5),
                    entropy=round(info.entropy, 4),
                    approx_kl=round(info.approx_kl, 5),
                    unusable_segments=len(self.cache.unusable),
                )
        except JobOver as exc:
            log.info("learning stops: %s", exc)
            ctx.stop.set()
        self.checkpoint()
        return {"train_iter": ppo.train_iter, "policy_version": self.version}

    def fetch_round(self) -> SampleReply | None:
        return self.sample(self.config.policy.collect.n_sample, 1)

    def round_data(self, reply: SampleReply) -> tuple[dict[str, np.ndarray], list[int]]:
        (batch,) = reply.batches
        columns, _, _ = self.cache.gather(batch)
        versions = [
            int(self.store.read_segment_header(s.path)["policy_version"]) for s in batch.segments
        ]
        return columns, versions
