"""A job's buffer as the coordinator sees it (`BufferProcess`: a job's `Job.replay`),
served by its processes (buffers.py starts and watches them; each is a `ShardProcess`
there):

- `task_ended`, `set_learner_version` are sent on a thread of
  each process's own, in order (the coordinator calls them holding its lock, which
  never waits on the network);
- `size`, `inserted_env_steps` and `sampling` are those of their last reports;
- `stats`, `final_stats` and `release_all` ask them (the coordinator calls them outside
  its lock), `final_stats` and `release_all` within END_PATIENCE_S;
- `access` signs a task's credential for them.
"""

from __future__ import annotations

import collections
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import BufferStats, DataAccess, LimiterCounts, ShardReport
from services.buffer.credentials import TaskGrant, credential_key, sign
from services.buffer.sharding import merge_stats

if TYPE_CHECKING:
    from services.coordinator.buffers import BufferProcessSettings, ShardProcess

#: How long a job's end waits for its buffer process to answer (the request that
#: stopped it waits too): past it, the end is recorded from the last report.
END_PATIENCE_S = 5.0
#: A process that has not answered its report for this long is shown as silent in
#: its job's status (frozen, or starting slowly).
SILENT_AFTER_S = 3.0


class BufferProcess:
    """One job's buffer, served by its shards' processes, as the coordinator sees it
    (see the module's text): what it is told goes to every shard; what it reports is
    their sum."""

    def __init__(
        self, job_id: str, shards: list[ShardProcess], settings: BufferProcessSettings
    ) -> None:
        self.job_id = job_id
        self.shards = shards
        self._key = credential_key(settings.token)
        #: What a restarted process is told again (not the tasks that ended: it takes
        #: only credentials signed since it started, services/buffer/credentials.py).
        self.learner_version = 0
        self.closed = False
        #: Whether a process did not answer within the end's patience (`final_stats`).
        self.unanswered_at_end = False

    @property
    def url(self) -> str:
        """Where an operator's data request is passed on: the first shard."""
        return self.shards[0].url

    @property
    def ready(self) -> bool:
        """Every shard answered once: its job's data tasks may go out."""
        return all(shard.ready for shard in self.shards)

    @property
    def restarts(self) -> int:
        return sum(shard.restarts for shard in self.shards)

    def silence(self) -> str:
        """Which of its processes have not answered for `SILENT_AFTER_S` ("": none),
        for its job's status: frozen, restarting, or starting slowly."""
        silent = [
            f"{shard.name} has not answered for {shard.silent_s():.0f} s"
            + (f" ({shard.restarts} restarts)" if shard.restarts else "")
            for shard in self.shards
            if not shard.stopped.is_set() and shard.silent_s() >= SILENT_AFTER_S
        ]
        return "; ".join(silent)

    # --- a worker's access -----------------------------------------------------------------

    def access(self, task_id: str, worker_id: str, kind: str, epoch: int = 0) -> DataAccess:
        """Where a task of this job inserts or samples, and its credential there (one
        for every shard: they check it with the same key), signed now; `epoch`: a
        learn task's lease."""
        grant = TaskGrant(self.job_id, task_id, worker_id, kind, epoch)
        return DataAccess(
            urls=[shard.url for shard in self.shards], credential=sign(self._key, grant)
        )

    # --- what the coordinator calls holding its lock: sent in order ------------------------

    @property
    def size(self) -> int:
        return sum(shard.report.size for shard in self.shards)

    @property
    def inserted_env_steps(self) -> int:
        return sum(shard.report.env_steps for shard in self.shards)

    def sampling(self) -> Sampling:
        """How its items were sampled, as its shards' last reports say (no call)."""
        lags: list[int] = []
        for shard in self.shards:
            histogram = shard.report.sampled_lag_histogram
            lags = [a + b for a, b in itertools.zip_longest(lags, histogram, fillvalue=0)]
        inserted = sum(s.report.limiter.inserted for s in self.shards)
        sampled = sum(s.report.limiter.sampled for s in self.shards)
        return Sampling(lags, sampled / inserted if inserted else None)

    def task_ended(self, task_id: str) -> None:
        """Its credential is refused from now on; what a learn task held goes back."""
        for shard in self.shards:
            shard.send("task_ends", [task_id])

    def set_learner_version(self, version: int) -> int:
        self.learner_version = max(self.learner_version, version)
        for shard in self.shards:
            shard.send("learner_version", self.learner_version)
        return 0

    def close(self) -> None:
        """The job ended: the processes take no more data (`final_stats` waits for
        them)."""
        self.closed = True

    # --- what the coordinator calls outside its lock -----------------------------------

    def stats(self) -> BufferStats:
        try:
            return merge_stats([shard.control.stats(self.job_id) for shard in self.shards])
        except ServiceUnavailable as exc:
            raise ApiError(
                503, "buffer_unavailable", f"job {self.job_id}'s buffer: {exc}", retry_after_s=1.0
            ) from None

    def final_stats(self) -> BufferStats:
        """Close the buffer (no more data in or out) and read its last reports, all
        shards within END_PATIENCE_S together (the request that ended the job waits)."""
        deadline_s = time.monotonic() + END_PATIENCE_S
        stats = []
        try:
            for shard in self.shards:
                stats.append(
                    shard.patiently(lambda t, s=shard: s.control.close_job(timeout_s=t), deadline_s)
                )
                shard.report = shard.patiently(
                    lambda t, s=shard: s.control.report(s.returns_seq, timeout_s=t), deadline_s
                )
        except ServiceUnavailable:
            self.unanswered_at_end = True
            raise
        return merge_stats(stats)

    def release_all(self) -> None:
        """The job's end is on disk: its segments go, and so do the processes. Those
        that did not answer at the end are not waited for again: they are stopped, and
        the job's segments go with its folder's sweep (`JobBook.sweep_segments`)."""
        try:
            if not self.unanswered_at_end:
                deadline_s = time.monotonic() + END_PATIENCE_S
                for shard in self.shards:
                    shard.patiently(lambda t, s=shard: s.control.release(timeout_s=t), deadline_s)
        finally:
            # Its end is recorded: a last snapshot is worth no wait past the patience,
            # and none at all from a process that did not answer (killed at once).
            self.stop(timeout_s=0.0 if self.unanswered_at_end else END_PATIENCE_S)

    def stop(self, timeout_s: float = 30.0) -> None:
        for shard in self.shards:
            shard.stop(timeout_s)

    def tell_again(self, shard: ShardProcess) -> None:
        """A restarted process: the learner's version."""
        if self.learner_version:
            shard.send("learner_version", self.learner_version)

    def relay_limiter_counts(self) -> None:
        """Tell each shard what the others' rate limiters counted, as their last
        reports said: each shard then keeps the job's ratio (services/buffer/limiter.py)."""
        if len(self.shards) == 1:
            return
        inserted = sum(s.report.limiter.inserted for s in self.shards)
        sampled = sum(s.report.limiter.sampled for s in self.shards)
        for shard in self.shards:
            own = shard.report.limiter
            shard.send(
                "elsewhere",
                LimiterCounts(inserted=inserted - own.inserted, sampled=sampled - own.sampled),
            )

    def merged(self, reads: list[ReportRead]) -> ReportRead:
        """The job's report from what its shards' reads said (those read this time;
        the others' last reports)."""
        if len(self.shards) == 1 and reads:
            return reads[0]
        served: collections.Counter[str] = collections.Counter()
        returns: list[float] = []
        for read in reads:
            served.update(read.served)
            returns += read.returns
        total = ShardReport(env_steps=self.inserted_env_steps, size=self.size)
        return ReportRead(total, returns, dict(served))


#: ShardReport's counters of what a process served.
SERVED = (
    "segments_inserted",
    "samples_served",
    "sample_timeouts",
    "inserts_rate_limited",
    "inserts_busy",
)


@dataclass(frozen=True)
class Sampling:
    """What a job's TensorBoard charts of its sampling at a metrics point."""

    #: Sampled items by policy lag (`BufferStats.sampled_lag_histogram`).
    lag_histogram: list[int]
    samples_per_insert: float | None


@dataclass(frozen=True)
class ReportRead:
    """A buffer process's report, and what is new in it since the one before."""

    report: ShardReport
    #: Returns of episodes counted since.
    returns: list[float]
    #: How much more of each of SERVED was served since.
    served: dict[str, int]
