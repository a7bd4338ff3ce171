"""Saving and restoring the coordinator's jobs (the file layout is snapshot.py's).

Every running job is snapshotted every few seconds, most times as a delta: what
changed since the last snapshot, so a snapshot costs what changed, not the buffer's
size (snapshot.py). An ended job's snapshot files are removed (its durable record
holds all that is kept of it). At start, every job folder under the shared root is
restored: an ended job as its durable record says (no
index is built for it; one ended past its retention is not loaded at all), a running
one from its newest snapshot plus the segment files and policy versions written
after it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from common.messages import TERMINAL_PHASES, dump
from common.storage import CorruptFileError
from jobconfig import from_resolved
from services.buffer.core import BufferSnapshot
from services.coordinator.data import DataPlane
from services.coordinator.jobs import JobBook, ending_record, job_record
from services.coordinator.policies import PolicyPointer
from services.coordinator.snapshot import (
    SnapshotChain,
    cut_path,
    delta_path,
    prune_snapshot_files,
    read_job_record,
    read_job_snapshot,
    remove_job_snapshot,
    state_path,
    write_job_record,
    write_snapshot_state,
)
from services.coordinator.state import CoordinatorState, Job

log = logging.getLogger(__name__)

#: A new whole cut is written once the deltas after the last one add up to this many
#: times its size: snapshots then write about twice what changed, and a restore reads
#: at most about twice a cut.
COMPACT_AT = 1.0
#: ... or once this many deltas follow it (a buffer that barely changes).
MAX_DELTAS = 1000


class Persistence:
    def __init__(
        self, state: CoordinatorState, jobs: JobBook, data: DataPlane, policies: PolicyPointer
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.data = data
        self.policies = policies
        self._generation = 0
        #: Each job's snapshot on disk (a job with none gets a whole cut next).
        self._chains: dict[str, SnapshotChain] = {}
        #: A new cut once the deltas after the last one add up to this many times its
        #: size (0: a whole cut every time).
        self.compact_at = COMPACT_AT
        #: One snapshot at a time (the periodic thread, and the last one at shutdown).
        self._one_at_a_time = threading.Lock()

    def snapshot_jobs(self) -> dict[str, tuple[float, float]]:
        """Write every running job's state (and each finished job's once). Returns, by
        job, the longest the locks were held for it and its whole time, in seconds."""
        with self._one_at_a_time:
            return self._snapshot_jobs()

    def _snapshot_jobs(self) -> dict[str, tuple[float, float]]:
        state = self.state
        timings: dict[str, tuple[float, float]] = {}
        with state.guard.changing():
            for job in state.jobs.values():
                if job.ending is not None and not job.terminal_durable:
                    # Its end could not be written before: try again.
                    record = ending_record(job)
                    state.guard.defer(
                        lambda job=job, record=record: self.jobs.complete_end(job, record)
                    )
            todo = [job for job in state.jobs.values() if job.replay is not None]
            ended = [j for j in state.jobs.values() if j.terminal_durable and not j.final_snapshot]
        for job in ended:
            # Its record says all that is kept: the last snapshot is of no more use.
            remove_job_snapshot(state.store, job.job_id)
            job.final_snapshot = True
        for job in todo:
            started = time.perf_counter()
            try:
                hold_s = self._snapshot_job(job)
            except BaseException:
                # What the failed snapshot took from the buffer's change log is not on
                # disk: the next one must be a whole cut.
                self._chains.pop(job.job_id, None)
                raise
            if hold_s is not None:
                timings[job.job_id] = (hold_s, time.perf_counter() - started)
        for job_id in [j for j in self._chains if j not in {job.job_id for job in todo}]:
            del self._chains[job_id]  # ended or forgotten
        return timings

    def _snapshot_job(self, job: Job) -> float | None:
        """Write the job's delta, or a whole cut when the deltas since the last one
        add up to its size (or there is none to build on). Returns the longest the
        locks were held, or None when nothing changed and nothing was written."""
        state, chain = self.state, self._chains.get(job.job_id)
        cut_lock = state.guard.lock
        # One cut of record and buffer: the record is taken holding the coordinator's
        # lock and the buffer's, for a moment; the arrays are built after both are let
        # go (the API never waits on a copy).
        at_cut = lambda job=job: self._record_at_cut(job)  # noqa: E731
        if (
            chain is not None
            and len(chain.deltas) < MAX_DELTAS
            and (chain.delta_bytes < chain.cut_bytes * self.compact_at)
        ):
            change = job.buffer.delta(at_cut, cut_lock=cut_lock)
            if change is not None:
                return self._write_delta(job.job_id, chain, change)
        taken = job.buffer.cut(at_cut, cut_lock=cut_lock)
        record = taken.at_cut
        assert record is not None
        # Generations only grow, also across restarts: never reuse a file name.
        self._generation = max(self._generation + 1, int(state.wall() * 1000))
        chain = SnapshotChain(
            generation=self._generation,
            cut_file=cut_path(job.job_id, self._generation),
            cut_meta=taken.meta,
            cut_bytes=len(taken.data),
        )
        state.store.write_bytes(chain.cut_file, taken.data)
        hold_s = taken.longest_lock_hold_s
        del taken  # its bytes are reused by the next cut once let go
        write_snapshot_state(state.store, job.job_id, record, chain)
        prune_snapshot_files(state.store, job.job_id, chain)
        self._chains[job.job_id] = chain
        return hold_s

    def _write_delta(
        self, job_id: str, chain: SnapshotChain, change: BufferSnapshot[dict[str, Any]]
    ) -> float | None:
        record, meta = change.at_cut, change.meta
        assert record is not None
        unchanged = {k: v for k, v in meta.items() if k not in ("arrays_sha256", "changed")}
        if not meta["changed"] and chain.last_written == (record, unchanged):
            return None  # nothing happened since the last snapshot: nothing to write
        store = self.state.store
        rel = delta_path(job_id, chain.generation, len(chain.deltas))
        store.write_bytes(rel, change.data)
        chain.deltas.append({"file": rel, "meta": meta})
        chain.delta_bytes += len(change.data)
        write_snapshot_state(store, job_id, record, chain)
        chain.last_written = (record, unchanged)
        return change.longest_lock_hold_s

    @staticmethod
    def _record_at_cut(job: Job) -> dict[str, Any]:
        """The job's record at the cut (both locks held). An insert the buffer took
        but the coordinator has not counted yet is counted: its items are in the cut."""
        record = job_record(job)
        record["env_steps"] = max(job.env_steps, job.buffer.inserted_env_steps)
        return record

    def restore_jobs(self) -> list[str]:
        """Load every job under the shared root (at start); returns their ids.

        Running jobs continue: their buffers come back as saved, and segment files the
        snapshot does not know are indexed (or deleted when stale), so nothing that was
        acknowledged is lost and nothing leaks.
        """
        state = self.state
        restored = []
        for job_id in state.store.list_dir(""):
            try:
                job = self._restore_job(job_id)
            except (ValueError, KeyError, TypeError, OSError, CorruptFileError) as exc:
                log.error("cannot restore job %s: %s", job_id, exc)
                continue
            if job is None:
                continue
            # The job is not published yet: its disk work needs no lock.
            if job.phase not in TERMINAL_PHASES:  # running, or queued
                self.policies.recover(job)
                self.data.sweep_orphans(job, grace_s=0.0)
            else:
                job.terminal_durable = True
                self.jobs.write_missing_summary(job)
                self.jobs.sweep_segments(job, now=True)
            with state.guard.changing():
                state.jobs[job.job_id] = job
                self.jobs.forget_old()  # past the count kept: the oldest ended go
                state.guard.notify()
            restored.append(job.job_id)
            log.info(
                "restored job %s (%s): %d env steps, buffer of %d",
                job.job_id,
                job.phase,
                job.env_steps,
                job.replay.size if job.replay is not None else 0,
            )
        with state.guard.changing():
            return [job_id for job_id in restored if job_id in state.jobs]

    def _restore_job(self, job_id: str) -> Job | None:
        """A job from its folder: ended if its durable record says so; else as its
        newest snapshot left it; else (a job submitted just before a crash) fresh.
        None for a folder that holds no job."""
        store = self.state.store
        record = read_job_record(store, job_id)
        if record is not None and record["phase"] in TERMINAL_PHASES:
            finished_at = record["finished_at"] or 0.0
            if finished_at < self.state.wall() - self.state.limits.ended_job_retention_s:
                return None  # past its retention: forgotten, its folder untouched
            if record.get("buffer") is None:
                record = self._with_final_buffer(record)
            return self.jobs.from_record(record)
        if store.exists(state_path(job_id)):
            saved = read_job_snapshot(store, job_id)
            job = self.jobs.from_record(saved.record)
            job.buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
            return job
        return self.jobs.from_record(record) if record is not None else None

    def _with_final_buffer(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record of a job that ended before its buffer's final statistics were
        kept, with them: from its last snapshot (an empty buffer's without one), saved
        once, so no later start builds its index again."""
        store, job_id = self.state.store, record["job_id"]
        buffer = self.jobs.new_buffer(job_id, from_resolved(record["config"]))
        if store.exists(state_path(job_id)):
            saved = read_job_snapshot(store, job_id)
            buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
        record = {**record, "buffer": dump(buffer.stats())}
        write_job_record(store, job_id, record)
        return record
