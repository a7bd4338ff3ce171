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

from common.messages import (
    TERMINAL_PHASES,
    BufferStats,
    EvalSummary,
    MetricsPoint,
    dump,
    parse,
)
from common.storage import CorruptFileError
from jobconfig import from_resolved
from services.buffer.chain import SnapshotChains
from services.coordinator.admission import Admission
from services.coordinator.data import DataPlane
from services.coordinator.job_views import JobViews
from services.coordinator.jobs import (
    JobBook,
    ending_record,
    job_record,
    let_go_of_series,
    workflow_record,
)
from services.coordinator.policies import PolicyPointer
from services.coordinator.snapshot import (
    eval_from,
    policy_from,
    read_job_record,
    read_job_snapshot,
    remove_job_snapshot,
    snapshot_folder,
    state_path,
    write_job_record,
)
from services.coordinator.state import CoordinatorState, Job, Share
from services.coordinator.workflows import workflow_of

log = logging.getLogger(__name__)


class Persistence:
    def __init__(
        self,
        state: CoordinatorState,
        jobs: JobBook,
        admission: Admission,
        views: JobViews,
        data: DataPlane,
        policies: PolicyPointer,
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.admission = admission
        self.views = views
        self.data = data
        self.policies = policies
        #: Each job's snapshot on disk (a job with none gets a whole cut next).
        self.chains = SnapshotChains(state.store, state.wall)
        #: The records last written of jobs whose buffers run in processes of their own.
        self._records_written: dict[str, dict[str, Any]] = {}
        #: One snapshot at a time (the periodic thread, and the last one at shutdown).
        self._one_at_a_time = threading.Lock()

    def snapshot_jobs(self) -> dict[str, tuple[float, float]]:
        """Write every running job's state (and each finished job's once). Returns, by
        job, the longest the locks were held for it and its whole time, in seconds."""
        with self._one_at_a_time:
            # Pointer and record writes that found no room before: their turn first.
            self.state.guard.retry_kept()
            if self.state.reserve is not None:
                self.state.reserve.keep()  # taken again once there is room
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
            records = {job.job_id: (job, job_record(job)) for job in todo if job.remote is not None}
            todo = [job for job in todo if job.remote is None]
            ended = [j for j in state.jobs.values() if j.terminal_durable and not j.final_snapshot]
        for job in ended:
            # Its record says all that is kept: the last snapshot is of no more use.
            remove_job_snapshot(state.store, job.job_id)
            job.final_snapshot = True
        for job in todo:
            started = time.perf_counter()
            hold_s = self._snapshot_job(job)
            if hold_s is not None:
                timings[job.job_id] = (hold_s, time.perf_counter() - started)
        self.chains.forget({snapshot_folder(job.job_id) for job in todo})  # ended or gone
        for job, record in records.values():
            self._write_record(job, record)
        return timings

    def _write_record(self, job: Job, record: dict[str, Any]) -> None:
        """A job whose buffer runs in a process of its own (which snapshots it): its
        record alone, when it changed, marked so a restart knows it is the newest;
        never once the job is ending (its end's record is written, or about to be)."""
        record = {**record, "buffer_process": True}
        if self._records_written.get(job.job_id) == record:
            return
        with self.state.record_writes:
            with self.state.guard.changing():
                running = job.running
            if running:
                write_job_record(self.state.store, job.job_id, record)
                self._records_written[job.job_id] = record

    def _snapshot_job(self, job: Job) -> float | None:
        """Write the job's delta, or a whole cut (services/buffer/chain.py). Returns the
        longest the locks were held, or None when nothing changed and nothing was
        written."""
        # One cut of record and buffer: the record is taken holding the coordinator's
        # lock and the buffer's, for a moment; the arrays are built after both are let
        # go (the API never waits on a copy).
        return self.chains.write(
            snapshot_folder(job.job_id),
            job.buffer,
            lambda job=job: self._record_at_cut(job),
            cut_lock=self.state.guard.lock,
        )

    @staticmethod
    def _record_at_cut(job: Job) -> dict[str, Any]:
        """The job's record at the cut (both locks held). An insert the buffer took
        but the coordinator has not counted yet is counted: its items are in the cut."""
        record = job_record(job)
        record["env_steps"] = max(job.env_steps, job.buffer.inserted_env_steps)
        return record

    def from_record(self, record: dict[str, Any]) -> Job:
        """A job from its record (`job_record`): a running one with an empty buffer,
        an ended one with none (what its buffer held at the end is in the record)."""
        config = from_resolved(record["config"])
        ended = record["phase"] in TERMINAL_PHASES
        job = Job(
            job_id=record["job_id"],
            name=record["name"],
            config=config,
            # A queued job's buffer starts as it leaves the queue (`start_running`).
            replay=(
                None
                if ended or record["phase"] == "queued"
                else self.admission.new_buffer(record["job_id"], config)
            ),
            started_at=float(record["started_at"]),
            running_since=record.get("running_since"),
            phase=record["phase"],
            reason=record["reason"],
            finished_at=record["finished_at"],
            env_steps=int(record["env_steps"]),
            train_iters=int(record["train_iters"]),
            policy=policy_from(record["policy"]),
            policy_versions=[int(v) for v in record["policy_versions"]],
            evals=[parse(EvalSummary, e) for e in record["evals"]],
            best_eval=eval_from(record["best_eval"]),
            tasks_created=int(record["tasks_created"]),
            learner_epoch=int(record.get("learner_epoch", 0)),  # older records lack it
            experiment_id=record.get("experiment_id"),
            task_failures=int(record["task_failures"]),
            last_task_error=str(record.get("last_task_error", "")),
            tasks_reassigned=int(record.get("tasks_reassigned", 0)),  # older records lack it
            tasks_preempted=int(record.get("tasks_preempted", 0)),
            shares={role: Share.restore(r) for role, r in record.get("shares", {}).items()},
            segments_swept=bool(record["segments_swept"]),
            # Records of jobs that ended before it was kept have none.
            final_buffer=parse(BufferStats, record["buffer"]) if record.get("buffer") else None,
        )
        if ended:
            let_go_of_series(job)
            return job
        job.episode_returns.extend(record["episode_returns"])
        job.workflow_state = workflow_of(config).restore(workflow_record(record), config)
        job.metrics.extend(parse(MetricsPoint, p) for p in record["metrics"])
        job.unusable_segments.update(record.get("unusable_segments", []))
        return job

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
                self.views.forget_old()  # past the count kept: the oldest ended go
                state.guard.notify()
            restored.append(job.job_id)
            log.info(
                "restored job %s (%s): %d env steps, buffer of %d",
                job.job_id,
                job.phase,
                job.env_steps,
                job.replay.size if job.replay is not None else 0,
            )
        if state.buffers is not None:
            # Their buffer processes restore what was acknowledged: counted before this
            # coordinator answers anyone, so no job's env steps are seen to go down.
            state.buffers.first_reports()
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
            return self.from_record(record)
        snapshot = store.exists(state_path(job_id))
        if self.state.buffers is not None:
            # Its buffer process restores the buffer itself (from its own snapshot, or
            # the coordinator's of when it hosted it); here, the newest record.
            if snapshot and not (record or {}).get("buffer_process"):
                record = read_job_snapshot(store, job_id).record
            return self.from_record(record) if record is not None else None
        if snapshot:
            saved = read_job_snapshot(store, job_id)
            job = self.from_record(saved.record)
            job.buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
            return job
        return self.from_record(record) if record is not None else None

    def _with_final_buffer(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record of a job that ended before its buffer's final statistics were
        kept, with them: from its last snapshot (an empty buffer's without one), saved
        once, so no later start builds its index again."""
        store, job_id = self.state.store, record["job_id"]
        buffer = self.admission.new_buffer(job_id, from_resolved(record["config"]), here=True)
        if store.exists(state_path(job_id)):
            saved = read_job_snapshot(store, job_id)
            buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
        record = {**record, "buffer": dump(buffer.stats())}
        write_job_record(store, job_id, record)
        return record
