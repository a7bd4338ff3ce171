"""The coordinator's TensorBoard scalars of each job, in `<job_id>/tb/coordinator/`.

Step axis: the job's env steps. Tags: `eval/return_mean`, `eval/return_std`,
`eval/return_min`, `eval/return_max` at each evaluation; `throughput/env_steps_per_s`,
`buffer/size`, `buffer/samples_per_insert`, `buffer/sampled_policy_lag_mean`,
`tasks/failures`, `tasks/reassigned` at each metrics point with new env steps, with
the job's workflow's own (`Workflow.scalars`: a self-play league's `league/rating`,
`league/rating_<baseline>` and `league/win_rate_<baseline>`).

`record` is called holding the coordinator's lock and only copies what it needs; the
buffer's stats and the writing run once the lock is let go (`guard.defer`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from common.messages import EvalSummary, MetricsPoint
from common.storage import CorruptFileError, SharedStore
from common.tensorboard import ScalarLog, job_tb_dir
from services.coordinator.remote_buffer import Sampling
from services.coordinator.state import CoordinatorState, Job
from services.coordinator.workflows import workflow_of

log = logging.getLogger(__name__)

#: An evaluation's GIF read for TensorBoard at most (a few MB at its size and rate).
MAX_GIF_BYTES = 64 << 20


@dataclass(frozen=True)
class _TaskCounts:
    """A job's task counters at a metrics point."""

    failures: int
    reassigned: int


@dataclass
class _Board:
    log: ScalarLog
    #: Evaluations of the job already written (an index into `job.evals`).
    evals_written: int = 0
    last_point: MetricsPoint | None = None
    #: The job ended and its files are closed: late writes are dropped.
    closed: bool = False


class JobBoards:
    def __init__(self, state: CoordinatorState) -> None:
        self._state = state
        self._store: SharedStore = state.store
        self._lock = threading.RLock()
        self._boards: dict[str, _Board] = {}

    def record(self, job: Job, point: MetricsPoint) -> None:
        """Write the job's new evaluations and this metrics point (call holding the
        coordinator's lock; the writing is deferred until it is let go)."""
        evals = list(job.evals)
        tasks = _TaskCounts(job.task_failures, job.tasks_reassigned)
        # Its shards' last reports (None: the job replays nothing): no call to them
        # from the scheduler's pass, which a frozen buffer process would hold up.
        sampling = job.replay.sampling() if job.replay is not None else None
        # The workflow's own (a league's ratings and win rates), copied now.
        own = {} if job.workflow_state is None else workflow_of(job.config).scalars(job)
        self._state.guard.defer(lambda: self._write(job.job_id, evals, point, sampling, tasks, own))

    def close(self, job_id: str, evals: list[EvalSummary]) -> None:
        """Write the evaluations not written yet, then flush and close the job's files
        (the job ended)."""
        with self._lock:
            board = self._board(job_id)
            if board.closed:
                return
            self._write_evals(board, evals)
            board.log.close()
            board.closed = True

    def forget(self, job_id: str) -> None:
        """The coordinator forgot the job: so does this (its files stay)."""
        with self._lock:
            board = self._boards.pop(job_id, None)
        if board is not None and not board.closed:
            board.log.close()

    def close_all(self) -> None:
        with self._lock:
            boards = list(self._boards.values())
        for board in boards:
            board.log.close()

    def _board(self, job_id: str) -> _Board:
        with self._lock:
            board = self._boards.get(job_id)
            if board is None:
                rel = job_tb_dir(job_id, "coordinator")
                board = self._boards[job_id] = _Board(ScalarLog(self._store, rel))
            return board

    def _write(
        self,
        job_id: str,
        evals: list[EvalSummary],
        point: MetricsPoint,
        sampling: Sampling | None,
        tasks: _TaskCounts,
        own: dict[str, float],
    ) -> None:
        with self._lock:  # one writer at a time: evaluations are written once, in order
            board = self._board(job_id)
            if not board.closed:
                self._write_point(board, evals, point, sampling, tasks, own)

    def _write_point(
        self,
        board: _Board,
        evals: list[EvalSummary],
        point: MetricsPoint,
        sampling: Sampling | None,
        tasks: _TaskCounts,
        own: dict[str, float],
    ) -> None:
        self._write_evals(board, evals)
        last = board.last_point
        if last is not None and (point.t <= last.t or point.env_steps <= last.env_steps):
            return  # written late, or no new env step: the step axis only goes forward
        board.last_point = point
        rate = None
        if last is not None:
            rate = (point.env_steps - last.env_steps) / (point.t - last.t)
        lags = sampling.lag_histogram if sampling is not None else []
        sampled = sum(lags)
        board.log.scalars(
            point.env_steps,
            {
                "throughput/env_steps_per_s": rate,
                "buffer/size": point.buffer_size,
                "buffer/samples_per_insert": (
                    sampling.samples_per_insert if sampling is not None else None
                ),
                "buffer/sampled_policy_lag_mean": (
                    sum(i * n for i, n in enumerate(lags)) / sampled if sampled else None
                ),
                "tasks/failures": tasks.failures,
                "tasks/reassigned": tasks.reassigned,
                **own,
            },
            wall_time=point.t,
        )

    def _write_evals(self, board: _Board, evals: list[EvalSummary]) -> None:
        new = evals[board.evals_written :]
        board.evals_written = max(board.evals_written, len(evals))
        for summary in new:
            board.log.scalars(
                summary.env_steps,
                {
                    "eval/return_mean": summary.return_mean,
                    "eval/return_std": summary.return_std,
                    "eval/return_min": summary.return_min,
                    "eval/return_max": summary.return_max,
                },
            )
            if summary.video is not None:
                self._write_video(board, summary)

    def _write_video(self, board: _Board, summary: EvalSummary) -> None:
        """The evaluation's GIF (its collector wrote it beside the MP4) as an animation."""
        assert summary.video is not None
        path = summary.video.removesuffix(".mp4") + ".gif"
        try:
            gif = self._store.read_bytes(path, max_bytes=MAX_GIF_BYTES)
            width, height = int.from_bytes(gif[6:8], "little"), int.from_bytes(gif[8:10], "little")
        except (OSError, CorruptFileError) as exc:
            log.warning("no animation of %s in tensorboard: %s", path, exc)
            return
        board.log.animation(summary.env_steps, "eval/video", gif, width=width, height=height)
