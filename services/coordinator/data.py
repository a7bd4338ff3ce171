"""The data plane as the coordinator sees it: each job's buffer processes serve its
inserts, samples and priorities (services/buffer/), and their reports count its env
steps and episodes here; an operator's data request sent to the coordinator is passed
on to them (api/data.py), holding one of the insert slots this bounds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from common.errors import ApiError
from services.buffer.checks import InsertSlot, InsertSlots
from services.coordinator.jobs import JobBook
from services.coordinator.remote_buffer import ReportRead
from services.coordinator.state import CoordinatorState


class DataPlane:
    def __init__(self, state: CoordinatorState, jobs: JobBook) -> None:
        self.state = state
        self.jobs = jobs
        #: Inserts passed on to a buffer process at once (api/data.py).
        self.insert_slots = InsertSlots(state.limits.max_concurrent_inserts)
        #: Sample requests passed on and not answered yet.
        self.waiting_samples = 0
        self._waiting_lock = threading.Lock()

    def insert_slot(self) -> InsertSlot:
        """A slot for one insert passed on to a buffer process (all jobs' together:
        each holds one of this coordinator's threads, and past a few at once, the
        inserts' HTTP work keeps other requests waiting). It is held until the buffer
        process answers, a wait in its rate limiter too: an operator's tool sends
        `timeout_s` 0 (the client's default) to be answered 429 at once instead.

        Raises:
            ApiError: 429 busy, when `max_concurrent_inserts` are taken (counted).
        """
        return self.insert_slots.take_or_busy(self.state.metrics.inserts_busy.inc)

    @contextlib.contextmanager
    def sample_slot(self) -> Iterator[None]:
        """Held while an operator's sample request is passed on (a long-poll holds one
        of this coordinator's threads): at most `max_waiting_samples` at once.

        Raises:
            ApiError: 503 too_many_waiting, at once, past them.
        """
        limit = self.state.limits.max_waiting_samples
        with self._waiting_lock:
            if self.waiting_samples >= limit:
                raise ApiError(
                    503,
                    "too_many_waiting",
                    f"{self.waiting_samples} sample requests are already waiting in all",
                    retry_after_s=1.0,
                )
            self.waiting_samples += 1
        try:
            yield
        finally:
            with self._waiting_lock:
                self.waiting_samples -= 1

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
