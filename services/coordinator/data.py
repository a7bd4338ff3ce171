"""The data plane: segment inserts, samples, priorities and the buffers' stats, and
the sweep that indexes segment files no insert claimed.

The blocking buffer calls (long-poll samples, rate-limited inserts) run outside the
coordinator's lock, so one waiting learner never holds up the rest; how many may wait
at once is bounded, in all and per job.
"""

from __future__ import annotations

import collections
import logging
import time

from common.array_bodies import SampledItems
from common.errors import ApiError, bad_request, conflict
from common.messages import (
    InsertReply,
    PriorityUpdate,
    SampleRequest,
    SegmentInsert,
    SegmentRef,
)
from services.buffer.checks import (
    InsertSlot,
    InsertSlots,
    check_own_folder,
    check_sample_request,
    check_segment_file,
    sweep_orphans,
)
from services.buffer.core import BufferClosed, RateLimited, SampleTimeout
from services.coordinator.jobs import JobBook
from services.coordinator.remote_buffer import ReportRead
from services.coordinator.state import CoordinatorState, Job, raise_if_closing
from services.coordinator.tasks import TaskBoard

log = logging.getLogger(__name__)


class DataPlane:
    def __init__(self, state: CoordinatorState, jobs: JobBook, tasks: TaskBoard) -> None:
        self.state = state
        self.jobs = jobs
        self.tasks = tasks
        self.waiting_samples = 0
        self._waiting_by_job: collections.Counter[str] = collections.Counter()
        #: Inserts indexed here or passed on to a buffer process at once (forward.py).
        self.insert_slots = InsertSlots(state.limits.max_concurrent_inserts)

    # --- inserts -------------------------------------------------------------------

    def insert(
        self, job_id: str, insert: SegmentInsert, *, caller: str | None = None
    ) -> InsertReply:
        """Check and index a collector's segments. At most `max_concurrent_inserts`
        are indexed at once; one more is answered 429 `busy` at once."""
        slot = self.insert_slot()
        try:
            return self._insert(job_id, insert, caller, slot)
        finally:
            slot.release()

    def insert_slot(self) -> InsertSlot:
        """A slot for one insert, indexed here or passed on to a buffer process (all
        jobs' together: each holds one of this coordinator's threads, and past a few
        at once, the inserts' HTTP work keeps samples waiting). A passed-on insert holds
        its slot until the buffer process answers, a wait in its rate limiter too: an
        operator's tool sends `timeout_s` 0 (the client's default) to be answered 429
        at once instead.

        Raises:
            ApiError: 429 busy, when `max_concurrent_inserts` are taken (counted).
        """
        return self.insert_slots.take_or_busy(self.state.metrics.inserts_busy.inc)

    def _insert(
        self, job_id: str, insert: SegmentInsert, caller: str | None, slot: InsertSlot
    ) -> InsertReply:
        guard = self.state.guard
        with guard.changing():
            job = self.jobs.running(job_id)
            self.tasks.check_sender(job_id, insert.task_id, "collect", caller)
        if caller is not None:
            check_own_folder(job_id, insert.segments, caller, insert.task_id)
        for i, ref in enumerate(insert.segments):
            check_segment_file(self.state.store, job_id, ref, f"segments.{i}")
        metrics = self.state.metrics
        if insert.timeout_s > 0 and job.buffer.insert_would_wait(
            sum(ref.rows for ref in insert.segments)
        ):
            slot.release()  # waiting for learners costs nothing: other jobs' inserts go on
        try:
            result = job.buffer.insert(insert.segments, timeout_s=insert.timeout_s)
        except ValueError as exc:
            raise bad_request("segments", str(exc)) from None
        except RateLimited:
            metrics.inserts_rate_limited.labels(job_id).inc()
            raise
        except BufferClosed:
            raise_if_closing(self.state)
            raise
        metrics.segments_inserted.labels(job_id).inc(result.accepted)
        with guard.changing():
            self.account(job, result.accepted_refs)
            return result.reply(job.env_steps)

    def count_report(self, job_id: str, read: ReportRead) -> None:
        """A buffer process's report: the job's env steps (its process counts every
        insert it took), the episodes that ended since (which may end the job), and
        what it served, into this coordinator's metrics of the same names."""
        metrics = self.state.metrics
        for name, count in read.served.items():
            if name == "inserts_busy":
                metrics.inserts_busy.inc(count)  # counted for all jobs together
            else:
                getattr(metrics, name).labels(job_id).inc(count)
        with self.state.guard.changing():
            job = self.state.jobs.get(job_id)
            if job is None or not job.running:
                return
            job.env_steps = max(job.env_steps, read.report.env_steps)
            job.episode_returns.extend(read.returns)
            self.jobs.settle(job)

    def account(self, job: Job, refs: list[SegmentRef]) -> None:
        """Count newly indexed segments into the job (which may end it there)."""
        for ref in refs:
            job.env_steps += ref.env_steps
            job.episode_returns.extend(ref.episode_returns)
        self.jobs.settle(job)

    def sweep_orphans(self, job: Job, grace_s: float) -> int:
        """Index segment files no insert claimed (a collector died between writing and
        inserting, or the coordinator restarted after acknowledging them); delete the
        stale or unreadable ones (services/buffer/checks.py). Returns how many were
        indexed. Disk work, done without the coordinator's lock; it is taken only to
        count what was indexed."""

        def account(refs: list[SegmentRef]) -> None:
            with self.state.guard.changing():
                self.account(job, refs)

        try:
            buffer = job.buffer
        except BufferClosed:
            return 0
        return sweep_orphans(self.state.store, job.job_id, buffer, grace_s, account)

    # --- samples -------------------------------------------------------------------

    def sample(
        self, job_id: str, request: SampleRequest, *, caller: str | None = None
    ) -> SampledItems:
        check_sample_request(request)
        guard = self.state.guard
        with guard.changing():
            job = self.jobs.running(job_id)
            self.tasks.check_sender(job_id, request.task_id, "learn", caller)
            if request.timeout_s > 0:
                self._check_waiting(job_id)
            self.waiting_samples += 1
            self._waiting_by_job[job_id] += 1
        metrics = self.state.metrics
        try:
            if request.task_id is not None:
                job.buffer.close_holds(
                    request.task_id,
                    trained=list(request.acknowledge),
                    untrained=list(request.give_back),
                )
            if request.priority_keys:
                job.buffer.update_priorities(request.priority_keys, request.priorities)
            started = time.monotonic()
            try:
                items = job.buffer.sample_for(
                    request.task_id,
                    request.batch_size,
                    request.num_batches,
                    timeout_s=request.timeout_s,
                    items=request.items,
                )
            finally:
                metrics.sample_wait.observe(time.monotonic() - started)
        except SampleTimeout:
            metrics.sample_timeouts.labels(job_id).inc()
            raise
        except BufferClosed:
            raise_if_closing(self.state)
            raise
        finally:
            with guard.changing():
                self.waiting_samples -= 1
                self._waiting_by_job[job_id] -= 1
        with guard.changing():
            if items.hold_id is not None and not self.tasks.is_active(request.task_id):
                # The task ended while this request waited: nobody will train on them.
                job.buffer.give_back(request.task_id or "")
                raise conflict("task_not_active", f"task {request.task_id} has ended")
        metrics.samples_served.labels(job_id).inc(len(items.keys))
        return items

    def _check_waiting(self, job_id: str) -> None:
        """Bound the long-polls waiting at once, in all and per job (503 at once)."""
        limits = self.state.limits
        if self.waiting_samples >= limits.max_waiting_samples:
            waiting, scope = self.waiting_samples, "in all"
        elif self._waiting_by_job[job_id] >= limits.max_waiting_samples_per_job:
            waiting, scope = self._waiting_by_job[job_id], f"for job {job_id}"
        else:
            return
        raise ApiError(
            503,
            "too_many_waiting",
            f"{waiting} sample requests are already waiting {scope}",
            retry_after_s=1.0,
        )

    def update_priorities(
        self, job_id: str, update: PriorityUpdate, *, caller: str | None = None
    ) -> int:
        with self.state.guard.changing():
            job = self.jobs.running(job_id)
            self.tasks.check_sender(job_id, update.task_id, "learn", caller)
        try:
            return job.buffer.update_priorities(update.keys, update.priorities)
        except ValueError as exc:
            raise bad_request("priorities", str(exc)) from None
