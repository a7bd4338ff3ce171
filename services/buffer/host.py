"""A buffer process's core: one job's replay index served to the job's workers, off the
coordinator's interpreter. No Flask.

The coordinator starts one such process for each running job (buffers.py there) and
hands each collect and learn task the process's address and a credential for that
task (credentials.py). `ShardHost` is the `BufferHost` of the process's buffer routes
(services/buffer/api; the coordinator passes an operator's requests on to them):

- an insert or a sample must come from a task the credential names, that has not
  ended (the coordinator says which ended: `task_ended`); a collector inserts only
  into its own folder, and a reference must describe its file;
- at most `max_concurrent_inserts` inserts are indexed at once, and at most
  `max_waiting_samples` sample long-polls wait;
- what the coordinator counts a job by (env steps, episodes, the buffer's size) it
  reads with `report`; the job's end is its to decide (`close`, `final_stats`,
  `release_all`).

Durable on its own: `snapshot` writes the buffer's chain (chain.py) into its folder,
`restore` reads it back (or, the first time, the chain an older coordinator kept of a
buffer it hosted itself) and indexes the segment files written since, so a process killed at
any moment loses no acknowledged insert. Deletes of released segments run on a thread
of their own, never under the buffer's lock.

    host = ShardHost.open(store, job_id, replay_config, error_buffer=..., seed=0,
                          grants=TaskGrants(key, job_id), limits=ShardLimits())
    host.restore()
    reply = host.insert_segments(job_id, insert, caller="collector-ab12")
    report = host.report(since=0)
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.array_bodies import SampledItems
from common.config import ReplayBufferConfig
from common.errors import ApiError, bad_request, conflict
from common.http import Caller
from common.messages import (
    BufferStats,
    InsertReply,
    LimiterCounts,
    PriorityUpdate,
    SampleRequest,
    SegmentInsert,
    SegmentRef,
    ShardReport,
)
from common.storage import SharedStore
from services.buffer import chain
from services.buffer.checks import (
    InsertSlot,
    InsertSlots,
    check_own_folder,
    check_sample_request,
    check_segment_file,
    sweep_orphans,
)
from services.buffer.core import BufferClosed, RateLimited, ReplayBuffer, SampleTimeout
from services.buffer.credentials import Stale, TaskGrant, TaskGrants
from services.buffer.sharding import shard_config

log = logging.getLogger(__name__)

#: Episode returns a report carries at most (the coordinator keeps the last 100).
REPORTED_RETURNS = 100


@dataclass(frozen=True, kw_only=True)
class ShardLimits:
    """What one buffer process lets its clients hold (the coordinator's own limits of
    the same names, for one job)."""

    max_concurrent_inserts: int = 4
    max_waiting_samples: int = 4
    #: Inserts waiting for the rate limiter at once (`ReplayBuffer.max_waiting_inserts`).
    max_waiting_inserts: int = 6
    #: A segment file no insert claimed for this long is indexed (or deleted).
    orphan_grace_s: float = 30.0


def shard_folder(job_id: str, shard: int = 0) -> str:
    """Where a buffer process keeps its snapshot."""
    return f"{job_id}/buffer-{shard}"


class BackgroundDeletes:
    """The buffer's segment files: a file released under the buffer's lock is deleted
    on a thread of its own, so no request waits on the disk."""

    def __init__(self, store: SharedStore) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="deletes", daemon=True)
        self._thread.start()

    def delete(self, rel: str) -> bool:
        self._queue.put(rel)
        return True

    def write_bytes(self, rel: str, data: bytes | memoryview) -> Any:
        return self._store.write_bytes(rel, data)

    def read_bytes(self, rel: str) -> bytes:
        return self._store.read_bytes(rel)

    def close(self, timeout_s: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while (rel := self._queue.get()) is not None:
            try:
                self._store.delete(rel)
            except Exception:  # noqa: BLE001 - a file left behind is swept later
                log.exception("deleting %s failed", rel)


class ShardHost:
    """One job's buffer, served to the job's tasks by their credentials."""

    def __init__(
        self,
        store: SharedStore,
        buffer: ReplayBuffer,
        files: BackgroundDeletes,
        *,
        grants: TaskGrants,
        limits: ShardLimits,
        shard: int = 0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.job_id = buffer.job_id
        self.buffer = buffer
        self.grants = grants
        self.limits = limits
        self.folder = shard_folder(self.job_id, shard)
        self._files = files
        self.insert_slots = InsertSlots(limits.max_concurrent_inserts)
        self._lock = threading.Lock()
        self._waiting_samples = 0
        #: (sequence number, return) of the last episodes that ended, newest last.
        self._returns: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=REPORTED_RETURNS
        )
        self._returns_seq = 0
        #: What was served (ShardReport's counters), by their names there.
        self._served: collections.Counter[str] = collections.Counter()
        #: The task each credential seen names, so a request is checked against the
        #: task its credential was signed for.
        self._seen: dict[str, TaskGrant] = {}
        self._closed = False
        self._released = False
        self.chains = chain.SnapshotChains(store, wall)

    @classmethod
    def open(
        cls,
        store: SharedStore,
        job_id: str,
        config: ReplayBufferConfig,
        *,
        error_buffer: float,
        seed: int,
        grants: TaskGrants,
        limits: ShardLimits,
        shard: int = 0,
    ) -> ShardHost:
        files = BackgroundDeletes(store)
        buffer = ReplayBuffer(
            job_id,
            shard_config(config),
            files,
            error_buffer=error_buffer,
            seed=seed,
            shard=shard,
            max_waiting_inserts=limits.max_waiting_inserts,
        )
        return cls(store, buffer, files, grants=grants, limits=limits, shard=shard)

    # --- who may call ------------------------------------------------------------------

    def for_credential(self, credential: str) -> Caller | None:
        """The worker a task credential speaks for (None: not a live task of this
        job's)."""
        try:
            grant = self.grants.grant(credential)
        except Stale as exc:
            # A live task's next heartbeat brings a fresh one: retry, do not fail.
            raise ApiError(
                503,
                "credential_stale",
                f"the task credential was {exc}: its worker's next heartbeat renews it",
                retry_after_s=1.0,
            ) from None
        if grant is None:
            return None
        with self._lock:
            self._seen[grant.task_id] = grant
        return Caller("worker", worker_id=grant.worker_id, role=grant.role)

    def _check_open(self) -> None:
        """Raises BufferClosed (409 job_finished) once the job ended."""
        if self._closed:
            raise BufferClosed(f"job {self.job_id} has ended")

    def _check_sender(
        self, job_id: str, task_id: str | None, kind: str, caller: str | None
    ) -> None:
        if job_id != self.job_id:
            raise ApiError(404, "not_found", f"this buffer serves {self.job_id}, not {job_id}")
        if caller is None:
            # An operator (the cluster token): a task it names must not have ended.
            if task_id is not None and self.grants.revoked(task_id):
                raise conflict("task_not_active", f"task {task_id} has ended")
            return
        if task_id is None:
            raise bad_request("task_id", f"a worker sends the {kind} task it acts for")
        with self._lock:
            grant = self._seen.get(task_id)
        if grant is None or grant.worker_id != caller or grant.kind != kind:
            raise conflict("task_not_active", f"{kind} task {task_id} is not {caller}'s")
        if self.grants.revoked(task_id):
            raise conflict("task_not_active", f"task {task_id} has ended")

    # --- the routes' BufferHost ----------------------------------------------------------

    def insert_slot(self) -> InsertSlot:
        return self.insert_slots.take_or_busy(lambda: self._tally("inserts_busy"))

    def insert_segments(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply:
        slot = self.insert_slot()
        try:
            self._check_open()
            self._check_sender(job_id, insert.task_id, "collect", caller)
            if caller is not None:
                check_own_folder(job_id, insert.segments, caller, insert.task_id)
            for i, ref in enumerate(insert.segments):
                check_segment_file(self.store, job_id, ref, f"segments.{i}")
            rows = sum(ref.rows for ref in insert.segments)
            if insert.timeout_s > 0 and self.buffer.insert_would_wait(rows):
                slot.release()  # waiting for learners costs nothing: other inserts go on
            try:
                result = self.buffer.insert(insert.segments, timeout_s=insert.timeout_s)
            except ValueError as exc:
                raise bad_request("segments", str(exc)) from None
            except RateLimited:
                self._tally("inserts_rate_limited")
                raise
            self._count(result.accepted_refs)
            self._tally("segments_inserted", result.accepted)
            return result.reply(self.buffer.inserted_env_steps)
        finally:
            slot.release()

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampledItems:
        check_sample_request(request)
        self._check_open()
        self._check_sender(job_id, request.task_id, "learn", caller)
        with self._lock:
            if request.timeout_s > 0 and self._waiting_samples >= self.limits.max_waiting_samples:
                raise ApiError(
                    503,
                    "too_many_waiting",
                    f"{self._waiting_samples} sample requests are already waiting for job {job_id}",
                    retry_after_s=1.0,
                )
            self._waiting_samples += 1
        try:
            if request.task_id is not None:
                self.buffer.close_holds(
                    request.task_id,
                    trained=list(request.acknowledge),
                    untrained=list(request.give_back),
                )
            if request.priority_keys:
                self.buffer.update_priorities(request.priority_keys, request.priorities)
            items = self.buffer.sample_for(
                request.task_id,
                request.batch_size,
                request.num_batches,
                timeout_s=request.timeout_s,
                items=request.items,
            )
        except SampleTimeout:
            self._tally("sample_timeouts")
            raise
        finally:
            with self._lock:
                self._waiting_samples -= 1
        if items.hold_id is not None and self.grants.revoked(request.task_id or ""):
            # The task ended while this request waited: nobody will train on them.
            self.buffer.give_back(request.task_id or "")
            raise conflict("task_not_active", f"task {request.task_id} has ended")
        self._tally("samples_served", len(items.keys))
        return items

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int:
        self._check_sender(job_id, update.task_id, "learn", caller)
        try:
            return self.buffer.update_priorities(update.keys, update.priorities)
        except ValueError as exc:
            raise bad_request("priorities", str(exc)) from None

    def buffer_stats(self, job_id: str) -> BufferStats:
        if job_id != self.job_id:
            raise ApiError(404, "not_found", f"this buffer serves {self.job_id}, not {job_id}")
        return self.buffer.stats()

    # --- what the coordinator asks -------------------------------------------------------

    def _count(self, refs: list[SegmentRef]) -> None:
        with self._lock:
            for ref in refs:
                for value in ref.episode_returns:
                    self._returns_seq += 1
                    self._returns.append((self._returns_seq, value))

    def _tally(self, name: str, count: int = 1) -> None:
        with self._lock:
            self._served[name] += count

    def report(self, since: int = 0) -> ShardReport:
        """The job's counts: env steps, the buffer's size, the returns of episodes
        counted after sequence number `since`, and what was served."""
        with self._lock:
            returns = [value for seq, value in self._returns if seq > since]
            seq = self._returns_seq
            served = dict(self._served)
        limiter = self.buffer.limiter
        return ShardReport(
            env_steps=self.buffer.inserted_env_steps,
            size=self.buffer.size,
            episode_returns=returns,
            returns_seq=seq,
            limiter=LimiterCounts(inserted=limiter.inserted, sampled=limiter.sampled),
            sampled_lag_histogram=self.buffer.sampled_lag_histogram,
            **served,
        )

    def task_ended(self, task_ids: list[str]) -> int:
        """Refuse these tasks' credentials from now on; what a learn task held goes
        back to the buffer. Returns the items given back."""
        self.grants.revoke(task_ids)
        returned = 0
        with self._lock:
            for task_id in task_ids:
                self._seen.pop(task_id, None)
        for task_id in task_ids:
            try:
                returned += self.buffer.give_back(task_id)
            except BufferClosed:
                break
        return returned

    def set_learner_version(self, version: int) -> None:
        self.buffer.set_learner_version(version)

    def set_elsewhere(self, counts: LimiterCounts) -> None:
        self.buffer.set_elsewhere(counts.inserted, counts.sampled)

    def close(self) -> BufferStats:
        """The job ended: no more data in or out; its final statistics."""
        self._closed = True
        self.buffer.close()
        return self.buffer.final_stats()

    def release_all(self) -> None:
        """The job's end is on disk: let go of every segment (their files go), and of
        the snapshot, which is never written again."""
        self._released = True
        self.buffer.release_all()
        chain.remove(self.store, self.folder)

    # --- durability --------------------------------------------------------------------

    def snapshot(self) -> float | None:
        """Write the buffer's delta (or a new cut) into this process's folder (nothing
        once the job's files were released: a delta would name a removed cut)."""
        if self._released:
            return None
        return self.chains.write(self.folder, self.buffer, self._record)

    def _record(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "env_steps": self.buffer.inserted_env_steps}

    def restore(self) -> int:
        """The buffer as its newest snapshot left it (this process's, or, the first
        time, that of a coordinator that hosted it), then the segment files written
        since indexed. Returns the segments indexed from files."""
        # A coordinator's chain holds all of a job's items: only a single shard takes it.
        first = [f"{self.job_id}/coordinator"] if self.buffer.config.shards == 1 else []
        for folder in (self.folder, *first):
            if self.store.exists(f"{folder}/{chain.STATE}"):
                saved = chain.read_chain(self.store, folder)
                self.buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
                log.info(
                    "restored %s's buffer from %s: %d items", self.job_id, folder, self.buffer.size
                )
                break
        return self.sweep(grace_s=0.0)

    def sweep(self, grace_s: float | None = None) -> int:
        """Index segment files no insert claimed (those `grace_s` old; every one at a
        restore), and delete the unusable ones once past the orphan grace."""
        grace = self.limits.orphan_grace_s if grace_s is None else grace_s
        return sweep_orphans(
            self.store,
            self.job_id,
            self.buffer,
            grace,
            self._count,
            delete_after_s=self.limits.orphan_grace_s,
        )

    def stop(self) -> None:
        self._files.close()
