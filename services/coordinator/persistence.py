"""Saving and restoring the coordinator's jobs (the file layout is snapshot.py's).

Every running job's record is written every few seconds when it changed; its buffer's
processes snapshot the buffer themselves (services/buffer/chain.py). At start, every
job folder under the shared root is restored: an ended job as its durable record says
(one ended past its retention is not loaded at all), a running one from its newest
record, its buffer processes started (each restores its snapshot and indexes the
segment files written since) and its policy versions written after the record found.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from common.messages import (
    TERMINAL_PHASES,
    BufferStats,
    EvalSummary,
    MetricsPoint,
    parse,
)
from common.storage import CorruptFileError
from jobconfig import from_resolved
from services.coordinator.admission import Admission
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
        policies: PolicyPointer,
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.admission = admission
        self.views = views
        self.policies = policies
        #: The records last written of running jobs.
        self._records_written: dict[str, dict[str, Any]] = {}
        #: One snapshot at a time (the periodic thread, and the last one at shutdown).
        self._one_at_a_time = threading.Lock()

    def snapshot_jobs(self) -> None:
        """Write every running job's record when it changed (its buffer processes
        snapshot its buffer), an end not yet on disk again, and remove the snapshot an
        older coordinator left of an ended job's buffer."""
        with self._one_at_a_time:
            # Pointer and record writes that found no room before: their turn first.
            self.state.guard.retry_kept()
            if self.state.reserve is not None:
                self.state.reserve.keep()  # taken again once there is room
            self._snapshot_jobs()

    def _snapshot_jobs(self) -> None:
        state = self.state
        with state.guard.changing():
            for job in state.jobs.values():
                if job.ending is not None and not job.terminal_durable:
                    # Its end could not be written before: try again.
                    record = ending_record(job)
                    state.guard.defer(
                        lambda job=job, record=record: self.jobs.complete_end(job, record)
                    )
            records = [(job, job_record(job)) for job in state.jobs.values() if job.running]
            ended = [j for j in state.jobs.values() if j.terminal_durable and not j.final_snapshot]
        for job in ended:
            # Its record says all that is kept of it.
            remove_job_snapshot(state.store, job.job_id)
            job.final_snapshot = True
        for job, record in records:
            self._write_record(job, record)

    def _write_record(self, job: Job, record: dict[str, Any]) -> None:
        """A running job's record, when it changed, marked as written since its buffer
        runs in processes of its own (a restart then knows that no snapshot an older
        coordinator left is newer); never once the job is ending (its end's record is
        written, or about to be)."""
        record = {**record, "buffer_process": True}
        if self._records_written.get(job.job_id) == record:
            return
        with self.state.record_writes:
            with self.state.guard.changing():
                running = job.running
            if running:
                write_job_record(self.state.store, job.job_id, record)
                self._records_written[job.job_id] = record

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

        Running jobs continue: their buffer processes bring their buffers back as
        saved and index the segment files their snapshots do not know (or delete the
        stale), so nothing that was acknowledged is lost and nothing leaks.
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
        # Their buffer processes restore what was acknowledged: counted before this
        # coordinator answers anyone, so no job's env steps are seen to go down.
        state.buffers.read_reports()
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
            return self.from_record(record)
        # Its buffer processes restore the buffer themselves (from their own snapshots,
        # or the one an older coordinator kept of a buffer it hosted); here, the newest
        # record: that older coordinator's snapshot held a newer one than its record.
        if store.exists(state_path(job_id)) and not (record or {}).get("buffer_process"):
            record = read_job_snapshot(store, job_id).record
        return self.from_record(record) if record is not None else None
