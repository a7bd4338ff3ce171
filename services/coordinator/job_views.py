"""What is shown of jobs, and for how long: a job's status (a client waiting for its
end waits here), the listing in pages, its metrics and buffer statistics, the metrics
point every running job gets each period, and forgetting ended jobs past their
retention. Built from the job records by job_status.py."""

from __future__ import annotations

import logging
import statistics

from common.errors import not_found
from common.messages import (
    TERMINAL_PHASES,
    BufferStats,
    JobList,
    JobMetrics,
    JobStatus,
    MetricsPoint,
)
from services.coordinator.job_status import (
    held_of,
    learners_of,
    metrics_from_record,
    status_of,
)
from services.coordinator.jobs import JobBook, no_buffer_stats
from services.coordinator.lock import BoundedWaits
from services.coordinator.paging import newest_first
from services.coordinator.snapshot import read_job_record
from services.coordinator.state import CoordinatorState, Job

log = logging.getLogger(__name__)

#: Jobs one listing answers at the most.
MAX_PAGE = 1000


class JobViews:
    def __init__(self, state: CoordinatorState, jobs: JobBook) -> None:
        self.state = state
        self.jobs = jobs
        #: Status requests waiting for a job's end (`status`).
        self.end_polls = BoundedWaits(state.guard, state.limits.max_waiting_job_polls)

    def status(self, job_id: str, *, wait_s: float = 0.0) -> JobStatus:
        """The job's status; with `wait_s`, once it has ended or `wait_s` have passed
        (a client watching for the end waits here instead of polling); past
        `max_waiting_job_polls` waiting at once, at once."""
        state = self.state
        with state.guard.changing():
            job = self.jobs.get(job_id)
            self.end_polls.wait_for(
                lambda: state.closing or job.phase in TERMINAL_PHASES or bool(job.unrecorded),
                wait_s,
            )
            return status_of(job, learners_of(state, job), held=held_of(state, job))

    def listing(
        self, *, phase: str | None = None, limit: int = MAX_PAGE, page_token: str | None = None
    ) -> JobList:
        """Jobs newest first, `limit` at a time: `page_token` (the last answer's
        `next_page_token`) continues after the previous page. `phase`: one phase, or
        "ended" for any terminal one."""
        with self.state.guard.changing():
            page, next_token = newest_first(
                (
                    j
                    for j in self.state.jobs.values()
                    if phase is None
                    or j.phase == phase
                    or (phase == "ended" and j.phase in TERMINAL_PHASES)
                ),
                lambda j: (j.started_at, j.job_id),
                limit,
                page_token,
            )
            statuses = [
                status_of(j, learners_of(self.state, j), held=held_of(self.state, j)) for j in page
            ]
        return JobList(jobs=statuses, next_page_token=next_token)

    def metrics(self, job_id: str) -> JobMetrics:
        with self.state.guard.changing():
            job = self.jobs.get(job_id)
            recorded = job.replay is None and not job.running
            if not recorded:
                points, evals = list(job.metrics), list(job.evals)
                unusable = sorted(job.unusable_segments)
                buffer = job.replay
        if recorded:
            # An ended (or queued) job keeps its series on disk only: its record, read
            # here without the lock, is the same before and after a restart.
            return metrics_from_record(read_job_record(self.state.store, job_id) or {}, job)
        # The buffer's stats are its processes', asked without the coordinator's lock.
        return JobMetrics(
            job_id=job_id,
            points=points,
            evals=evals,
            buffer=buffer.stats() if buffer is not None else no_buffer_stats(job),
            unusable_segments=unusable,
        )

    def buffer_stats(self, job_id: str) -> BufferStats:
        """The job's buffer statistics: live while it runs, as it ended after."""
        with self.state.guard.changing():
            job = self.jobs.get(job_id)
            buffer, final = job.replay, job.final_buffer
            running = job.running
        if buffer is not None:
            return buffer.stats()  # its processes', asked without the coordinator's lock
        if running:
            return no_buffer_stats(job)
        if final is None:
            raise not_found(f"the buffer statistics of {job_id} (it ended before they were kept)")
        return final

    def buffer_sizes(self) -> dict[str, int]:
        """Each job's buffer size (cheap: no stats are computed)."""
        with self.state.guard.changing():
            return {
                job_id: job.replay.size if job.replay is not None else _final_size(job)
                for job_id, job in self.state.jobs.items()
            }

    def sample_metrics(self) -> None:
        """One metrics point per running job (call under the lock, every period)."""
        limits = self.state.limits
        for job in self.state.jobs.values():
            if job.replay is None and not job.running:
                self.jobs.sweep_segments(job)
                continue
            recent = list(job.episode_returns)
            point = MetricsPoint(
                t=round(self.state.wall(), 3),
                env_steps=job.env_steps,
                train_iters=job.train_iters,
                buffer_size=job.replay.size if job.replay is not None else 0,
                policy_version=job.policy.version if job.policy else 0,
                collect_return_mean=statistics.fmean(recent) if recent else None,
            )
            job.metrics.append(point)
            self.jobs.boards.record(job, point)
            while len(job.metrics) > limits.metrics_points:
                job.metrics.popleft()

    def forget_old(self) -> list[str]:
        """Forget ended jobs past their retention, and the oldest ended ones past the
        count kept (call under the lock). Their folders stay. Returns their ids."""
        limits = self.state.limits
        ended = sorted(
            (j for j in self.state.jobs.values() if j.terminal_durable),
            key=lambda j: j.finished_at or 0.0,
        )
        cutoff = self.state.wall() - limits.ended_job_retention_s
        over = max(0, len(ended) - limits.max_ended_jobs)
        gone = [
            j.job_id for i, j in enumerate(ended) if i < over or (j.finished_at or 0.0) < cutoff
        ]
        for job_id in gone:
            del self.state.jobs[job_id]
            self.state.metrics.forget_job(job_id)
            self.jobs.boards.forget(job_id)
            log.info("job %s forgotten (ended; past its retention)", job_id)
        return gone


def _final_size(job: Job) -> int:
    return job.final_buffer.size if job.final_buffer is not None else 0
