"""Jobs' lifecycle: their phase, the verdict that ends them and its durable end, their
records. Admitting and creating jobs is admission.py; what is shown of them, their
metrics points and their retention, job_views.py; restoring them, persistence.py.

A job ends in two steps: `finish` stops its data and tasks at once (under the lock);
`complete_end` (after the lock is let go) writes its terminal record, then shows the
phase, then releases its step data. Nobody sees a job as ended before its end is on
disk, so a coordinator killed at any moment never brings back as running a job it
reported as ended.
"""

from __future__ import annotations

import logging
from typing import Any

from common.config import to_dict
from common.errors import ApiError, conflict, not_found
from common.http_client import ServiceUnavailable
from common.messages import (
    BufferStats,
    dump,
)
from services.buffer.core import empty_stats
from services.coordinator.job_status import (
    status_of,
)
from services.coordinator.reserve import write_kept
from services.coordinator.snapshot import (
    as_record,
    write_job_record,
)
from services.coordinator.state import (
    CoordinatorState,
    Job,
    RoomWait,
    raise_if_closing,
)
from services.coordinator.tasks import TaskBoard
from services.coordinator.tensorboard import JobBoards
from services.coordinator.workflows import workflow_of
from services.coordinator.workflows.base import Outcome

log = logging.getLogger(__name__)


class JobBook:
    def __init__(self, state: CoordinatorState, tasks: TaskBoard) -> None:
        self.state = state
        self.tasks = tasks
        #: Each job's TensorBoard scalars (`<job_id>/tb/coordinator/`).
        self.boards = JobBoards(state)

    # --- lookups -------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        job = self.state.jobs.get(job_id)
        if job is None:
            raise not_found(f"job {job_id}")
        return job

    def running(self, job_id: str) -> Job:
        """The job, which must still take data and tasks (409 when it ended or waits
        in the queue)."""
        raise_if_closing(self.state)
        job = self.get(job_id)
        if job.queued:
            raise conflict("job_queued", f"job {job_id} waits in the queue: {job.waiting}")
        if not job.running:
            phase, reason = job.ending[:2] if job.ending else (job.phase, job.reason)
            raise conflict("job_finished", f"job {job_id} is {phase}: {reason}")
        return job

    # --- the end -------------------------------------------------------------------

    def stop(self, job_id: str) -> None:
        """End the job by request; its end is on disk when this returns (the change's
        deferred work ran)."""
        with self.state.guard.changing():
            job = self.get(job_id)
            if job.running or job.queued:
                self.finish(job, "stopped", "stopped by request")

    def buffer_failed(self, job_id: str, why: str) -> None:
        """A buffer process of the job's that is not started again (it kept exiting):
        the job fails, saying why."""
        with self.state.guard.changing():
            job = self.state.jobs.get(job_id)
            if job is not None:
                self.finish(job, "failed", why)

    def finish(self, job: Job, phase: str, reason: str) -> None:
        """End a job: stop its data and its tasks now; its new phase shows once it is
        on disk (`complete_end`, run when the lock is let go), and its step data is
        deleted only after that."""
        if not (job.running or job.queued):
            return  # already ending
        job.ending = (phase, reason, self.state.wall())
        if job.replay is not None:
            job.replay.close()  # no more data in or out, whatever follows
        self.tasks.cancel_job_tasks(job)
        record = ending_record(job)
        self.state.guard.defer(lambda: self.complete_end(job, record))
        log.info("job %s %s: %s", job.job_id, phase, reason)
        self.state.guard.notify()

    def settle(self, job: Job) -> None:
        """The one place a running job's end is decided, called after any of its
        counters moved (env steps, train iterations, task failures, an evaluation's
        result) and at every scheduling pass: it ends the job when `verdict` says so."""
        if not job.running:
            return
        self._follow_room_wait(job)
        outcome = self.verdict(job)
        if outcome is None:
            return
        if outcome.budget and self._final_evaluation(job):
            return  # it ends when its newest policy's evaluation is in
        self.finish(job, outcome.phase, outcome.reason)

    def _final_evaluation(self, job: Job) -> bool:
        """Whether the job, its budget spent, waits for its final evaluation; while it
        does, nothing more is collected or learned."""
        limits = self.state.limits
        if not workflow_of(job.config).final_evaluation(
            job, self.state.clock(), limits.final_eval_timeout_s
        ):
            return False
        self.tasks.cancel_job_tasks(job, "collect")
        self.tasks.cancel_job_tasks(job, "learn")
        return True

    def verdict(self, job: Job) -> Outcome | None:
        """Whether the job is done, and why: too many failed tasks, then its
        workflow's own rule (a goal reached, its work done), then its budgets."""
        if job.task_failures >= self.state.limits.max_task_failures:
            return Outcome(
                "failed", f"{job.task_failures} tasks failed; last: {job.last_task_error}"
            )
        grace_s, wait = job.config.system.storage_grace_s, job.room_wait
        if wait is not None and self.state.clock() - wait.since_s >= grace_s:
            return Outcome(
                "failed",
                f"the shared volume has had no room for its writes for {grace_s:g} s "
                f"without progress (system.storage_grace_s)",
            )
        outcome = workflow_of(job.config).outcome(job)
        if outcome is not None:
            return outcome
        system, stop_value = job.config.system, job.config.env.stop_value
        for key, count, budget in (
            ("max_env_step", job.env_steps, system.max_env_step),
            ("max_train_iter", job.train_iters, system.max_train_iter),
        ):
            if budget is not None and count >= budget:
                # A budget ran out: that is success only for a job with no return goal.
                if stop_value is None:
                    return Outcome("succeeded", f"{key} {budget} reached", budget=True)
                reason = f"{key} {budget} reached before stop_value {stop_value}"
                return Outcome("failed", reason, budget=True)
        return None

    def note_no_room(self, job: Job, waited_s: float) -> None:
        """A task of the job says a write of its has waited `waited_s` for room on the
        shared volume (its heartbeat)."""
        now = self.state.clock()
        if job.room_wait is None:
            job.room_wait = RoomWait(since_s=now - waited_s, env_steps=job.env_steps, seen_s=now)
            log.warning(
                "job %s: the shared volume has no room for its writes; it waits (and fails "
                "after %g s of that without progress)",
                job.job_id,
                job.config.system.storage_grace_s,
            )
        job.room_wait.seen_s = now

    def _follow_room_wait(self, job: Job) -> None:
        """A wait for room ends when no task has spoken of it for a lease's time, and
        starts again when the job made progress (env steps) meanwhile."""
        wait, now = job.room_wait, self.state.clock()
        if wait is None:
            return
        if now - wait.seen_s > self.state.limits.lease_timeout_s:
            job.room_wait = None
            log.info("job %s: its writes have room again", job.job_id)
        elif job.env_steps > wait.env_steps:
            wait.since_s, wait.env_steps = now, job.env_steps

    @staticmethod
    def count_train_iters(job: Job, train_iter: int) -> None:
        """The job's train iterations, as its learner reports them (a heartbeat, a
        policy version): they only grow. Settling is the caller's, once it is done."""
        job.train_iters = max(job.train_iters, train_iter)

    def complete_end(self, job: Job, record: dict[str, Any]) -> None:
        """Write the ending job's record (with what its buffer held at the end), its
        summary and its TensorBoard files; then show its end; then let go of its index
        and delete its segments.
        When the record cannot be written, the job stays ending and the snapshot
        thread tries again."""
        # The buffer is closed: nothing changes it any more, so these stats are final.
        final = self._final_stats(job)
        record = {**record, "buffer": as_record(final)}
        if job.replay is not None:
            # Its processes' last reports: every insert they took is counted.
            record["env_steps"] = max(record["env_steps"], job.replay.inserted_env_steps)
        store, reserve = self.state.store, self.state.reserve
        try:
            with self.state.record_writes:
                write_kept(reserve, lambda: write_job_record(store, job.job_id, record))
            with self.state.guard.changing():
                if job.terminal_durable or job.ending is None:
                    return
                job.env_steps = max(job.env_steps, record["env_steps"])
                phase, reason, finished_at = job.ending
                summary = dump(status_of(job, phase=(phase, reason, finished_at)))
                evals = list(job.evals)
            # The summary is on disk before anybody is shown the end as recorded (a
            # reader who sees the phase finds it); a crash before this line leaves a
            # record without it, and the restore writes it (`write_missing_summary`).
            write_kept(reserve, lambda: store.write_json(f"{job.job_id}/summary.json", summary))
        except OSError as exc:
            # Even the reserve's room is spent: the end is shown, said to be not yet
            # recorded (whoever waits for it returns, told why), and written when the
            # volume has room (the snapshot thread tries again).
            with self.state.guard.changing():
                if not job.unrecorded:
                    log.error("job %s: cannot record its end yet (%s); will retry", job.job_id, exc)
                job.unrecorded = f"not yet recorded: {exc}"
                self.state.guard.notify()
            return
        # Its TensorBoard files too, the last evaluations' animations in them, before
        # its end is shown: whoever saw the end (a run that then stops the coordinator)
        # finds them whole.
        try:
            self.boards.close(job.job_id, evals)
        except Exception:
            log.exception("job %s: closing its TensorBoard files failed", job.job_id)
        with self.state.guard.changing():
            job.phase, job.reason, job.finished_at = phase, reason, finished_at
            job.unrecorded = ""
            job.terminal_durable = True
            job.final_buffer = final
            replay, job.replay = job.replay, None
            let_go_of_series(job)
            self.state.guard.notify()
        # Step data is only for training: a finished job keeps policies, checkpoints,
        # evaluations and logs, not segments.
        if replay is not None:
            try:
                replay.release_all()
            except Exception:
                log.exception("job %s: releasing its segments failed", job.job_id)
            self.state.buffers.forget(job.job_id)

    def _final_stats(self, job: Job) -> BufferStats | None:
        """The ended job's buffer statistics (None: a buffer process that could not
        be asked; the job's end is recorded without them)."""
        if job.replay is None:
            replays = workflow_of(job.config).replays
            return job.final_buffer if replays else no_buffer_stats(job)
        try:
            return job.replay.final_stats()
        except (ServiceUnavailable, ApiError) as exc:
            log.warning("job %s: its buffer's final statistics are lost: %s", job.job_id, exc)
            return None

    def write_missing_summary(self, job: Job) -> None:
        """An ended job's summary, if a crash came between its record and its summary."""
        path = f"{job.job_id}/summary.json"
        if not self.state.store.exists(path):
            self.state.store.write_json(path, dump(status_of(job)))

    def sweep_segments(self, job: Job, *, now: bool = False) -> None:
        """Remove what collectors wrote around the end of a job, once they had time to
        notice it ended (each deletes a segment its insert could not place)."""
        if job.segments_swept or job.finished_at is None or not job.terminal_durable:
            return
        delay_s = self.state.limits.segment_sweep_delay_s
        if now or self.state.wall() - job.finished_at >= delay_s:
            job.segments_swept = True
            store = self.state.store
            self.state.guard.defer(lambda: store.delete_tree(f"{job.job_id}/segments"))


def let_go_of_series(job: Job) -> None:
    """What an ended job no longer keeps in memory: its series (they stay in its
    record on disk) and its workflow's in-flight data; its last and best evaluation
    stay, for its status."""
    job.metrics.clear()
    del job.evals[:-1]
    job.workflow_state = None
    job.episode_returns.clear()
    job.unusable_segments.clear()


def workflow_record(record: dict[str, Any]) -> dict[str, Any]:
    """The workflow's part of a job record. Records written before workflows kept
    their own state held the training and evaluate workflows' fields at the top."""
    if record.get("workflow") is not None:
        return record["workflow"]
    legacy = ("eval_requested_iter", "evaluation")
    return {key: record[key] for key in legacy if key in record}


def job_record(job: Job) -> dict[str, Any]:
    """What a job is, as JSON data (its buffer aside): what snapshots and the durable
    record hold."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "config": config_record(job),
        "started_at": job.started_at,
        "running_since": job.running_since,
        "phase": job.phase,
        "reason": job.reason,
        "finished_at": job.finished_at,
        "env_steps": job.env_steps,
        "train_iters": job.train_iters,
        "policy": as_record(job.policy),
        "policy_versions": list(job.policy_versions),
        "evals": [dump(e) for e in job.evals],
        "best_eval": as_record(job.best_eval),
        "tasks_created": job.tasks_created,
        "learner_epoch": job.learner_epoch,
        "experiment_id": job.experiment_id,
        "task_failures": job.task_failures,
        "last_task_error": job.last_task_error,
        "tasks_reassigned": job.tasks_reassigned,
        "tasks_preempted": job.tasks_preempted,
        "shares": {role: share.record() for role, share in job.shares.items()},
        "episode_returns": list(job.episode_returns),
        "metrics": [dump(p) for p in list(job.metrics)[-600:]],
        "segments_swept": job.segments_swept,
        "workflow": (
            None
            if job.workflow_state is None
            else workflow_of(job.config).record(job.workflow_state)
        ),
        "unusable_segments": sorted(job.unusable_segments),
        "buffer": as_record(job.final_buffer),
    }


def config_record(job: Job) -> dict[str, Any]:
    """The job's resolved config as JSON data, made once for each config it has (every
    record of it holds it: its snapshots every few seconds too)."""
    made = job.config_record
    if made is None or made[0] is not job.config:
        made = job.config_record = (job.config, to_dict(job.config))
    return made[1]


def ending_record(job: Job) -> dict[str, Any]:
    """The record of a job that is ending, with the phase it ends in."""
    assert job.ending is not None
    phase, reason, finished_at = job.ending
    return {**job_record(job), "phase": phase, "reason": reason, "finished_at": finished_at}


def no_buffer_stats(job: Job) -> BufferStats:
    """A job that replays nothing (an evaluation) has no buffer: an empty one's figures."""
    return empty_stats(workflow_of(job.config).replay(job.config))
