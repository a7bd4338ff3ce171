"""Jobs: admission, their phase and its durable end, what is shown of them (built by
job_status.py), metrics points and records.

A job ends in two steps: `finish` stops its data and tasks at once (under the lock);
`complete_end` (after the lock is let go) writes its terminal record, then shows the
phase, then releases its step data. Nobody sees a job as ended before its end is on
disk, so a coordinator killed at any moment never brings back as running a job it
reported as ended.
"""

from __future__ import annotations

import logging
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.config import ConfigError, JobConfig, to_dict
from common.envs import Spaces
from common.errors import ApiError, bad_request, conflict, not_found
from common.http_client import ServiceUnavailable
from common.messages import (
    TERMINAL_PHASES,
    BufferStats,
    EvalSummary,
    JobCreated,
    JobList,
    JobMetrics,
    JobStatus,
    JobSubmit,
    MetricsPoint,
    dump,
    new_id,
    parse,
)
from common.storage import SharedStore
from jobconfig import error_buffer_of, fit_to_env, from_resolved, resolve_job_config
from jobconfig.spaces import known_env_spaces
from services.buffer.core import ReplayBuffer
from services.coordinator.buffers import BufferProcess
from services.coordinator.devices import refuse_unless_fits, waiting_reason
from services.coordinator.job_status import (
    held_of,
    learners_of,
    metrics_from_record,
    status_of,
)
from services.coordinator.lock import BoundedWaits
from services.coordinator.paging import newest_first
from services.coordinator.reserve import write_kept
from services.coordinator.snapshot import (
    as_record,
    eval_from,
    policy_from,
    read_job_record,
    write_job_record,
)
from services.coordinator.state import (
    CoordinatorState,
    Job,
    RoomWait,
    Share,
    raise_if_closing,
)
from services.coordinator.tasks import TaskBoard
from services.coordinator.tensorboard import JobBoards
from services.coordinator.workflows import Planner, check_workflow, workflow_of
from services.coordinator.workflows.base import Outcome

log = logging.getLogger(__name__)

#: Threads that write a batch of new jobs' files at once (`create_many`): the
#: volume's round trips overlap.
WRITERS = 8

#: Jobs one listing answers at the most.
MAX_PAGE = 1000


class JobBook:
    def __init__(self, state: CoordinatorState, tasks: TaskBoard) -> None:
        self.state = state
        self.tasks = tasks
        #: Each job's TensorBoard scalars (`<job_id>/tb/coordinator/`).
        self.boards = JobBoards(state)
        #: Status requests waiting for a job's end (`status`).
        self.end_polls = BoundedWaits(state.guard, state.limits.max_waiting_job_polls)

    # --- admission -------------------------------------------------------------------

    def submit(
        self, submit: JobSubmit, planner: Planner, *, experiment_id: str | None = None
    ) -> JobCreated:
        """Admit the job (`admissible`) and create it; `experiment_id`: the experiment
        it is a job of."""
        config, warnings = self.admissible(submit.config, planner)
        return self.create(config, warnings, submit.name, planner, experiment_id=experiment_id)

    def admissible(
        self,
        raw: dict[str, Any],
        planner: Planner,
        *,
        known_spaces: dict[str, Spaces] | None = None,
    ) -> tuple[JobConfig, list[str]]:
        """The resolved config of a job this coordinator would take, and its warnings.
        `known_spaces`: env spaces already made, by env section (an experiment's jobs
        share a few envs: each is made once, not once a job).

        Raises:
            ApiError: 400 naming the config's field that is refused, or 409 for a job
                the registered workers cannot run.
        """
        try:
            config, warnings = resolve_job_config(raw)
            workflow = check_workflow(config)
            config = fit_to_env(config, known_env_spaces(config.env, known_spaces))
        except ConfigError as exc:
            raise bad_request(f"config.{exc.field}", exc.message) from None
        self._check_limits(config)
        workflow.admit(config, planner)
        with self.state.guard.changing():
            workers = list(self.state.workers.values())
        # A CUDA job that registered workers cannot run is refused now, with the
        # reason; with no such worker registered yet, it waits for one (planning.py),
        # and says so from the start.
        refuse_unless_fits(config, workflow.roles, workers)
        return config, warnings

    def create(
        self,
        config: JobConfig,
        warnings: list[str],
        name: str | None,
        planner: Planner,
        *,
        experiment_id: str | None = None,
    ) -> JobCreated:
        """Create a job of an `admissible` config: durable before it is answered."""
        (created,) = self.create_many([(config, warnings, name)], experiment_id=experiment_id)
        return created

    def create_many(
        self,
        entries: list[tuple[JobConfig, list[str], str | None]],
        *,
        experiment_id: str | None = None,
    ) -> list[JobCreated]:
        """Create jobs of `admissible` configs (config, warnings, name), in order, each
        durable before any is answered. O(jobs): their phases are decided in one pass,
        their files written a few at a time (`WRITERS` threads), and they are registered
        in one hold of the lock; an experiment's thousand jobs take seconds."""
        with self.state.guard.changing():
            workers = list(self.state.workers.values())
            phases = self._entry_phases(experiment_id, len(entries))
        jobs: list[Job] = []
        answers: list[list[str]] = []
        for (config, warnings, name), phase in zip(entries, phases, strict=True):
            workflow = workflow_of(config)
            waiting = waiting_reason(config, workflow.roles, workers)
            job_id = new_id("job")
            jobs.append(
                Job(
                    job_id=job_id,
                    name=name or config.exp_name,
                    config=config,
                    replay=None,  # started once its folder exists (below)
                    started_at=self.state.wall(),
                    phase=phase,
                    waiting=waiting,
                    workflow_state=workflow.new_state(config),
                    experiment_id=experiment_id,
                )
            )
            answers.append([*warnings, waiting] if waiting else list(warnings))
            for warning in answers[-1]:
                log.warning("job %s config: %s", job_id, warning)
        # Durable before they are answered: a coordinator that dies right after the 201
        # finds them again.
        store = self.state.store
        try:
            with ThreadPoolExecutor(min(WRITERS, len(jobs))) as writers:
                list(writers.map(self._write_new, jobs))
        except BaseException:
            # None of them is answered: none is left behind for a restart to find (no
            # buffer has started yet: they start below).
            for job in jobs:
                store.delete_tree(job.job_id)
            raise
        for job in jobs:
            # Its buffer (a process of its own, working in the job's folder) starts now;
            # a queued job's as it leaves the queue (`start_running`): a sweep of a
            # thousand costs no thousand processes.
            if job.phase == "running":
                job.replay = self.new_buffer(job.job_id, job.config)
        with self.state.guard.changing():
            # Decided again with the lock held, so that jobs submitted at once cannot
            # all take the last place; a record that says otherwise is written anew (a
            # restart before that only queues the job again).
            for job, phase in zip(jobs, self._entry_phases(experiment_id, len(jobs)), strict=True):
                if phase == "running":
                    job.running_since = job.started_at
                    if job.replay is None:  # another job left the queue meanwhile
                        job.replay = self.new_buffer(job.job_id, job.config)
                if job.phase != phase:
                    job.phase = phase
                    record = job_record(job)
                    self.state.guard.defer(
                        lambda job=job, record=record: write_job_record(store, job.job_id, record)
                    )
                self.state.jobs[job.job_id] = job
            self.state.guard.notify()
        for job in jobs:
            log.info(
                "job %s (%s) submitted (%s): %s",
                job.job_id,
                job.name,
                job.phase,
                job.config.env.env_id,
            )
        return [
            JobCreated(job_id=job.job_id, phase=job.phase, warnings=warnings)
            for job, warnings in zip(jobs, answers, strict=True)
        ]

    def _write_new(self, job: Job) -> None:
        """A new job's resolved config and its record, on disk."""
        store = self.state.store
        store.write_json(f"{job.job_id}/job.json", config_record(job))
        write_job_record(store, job.job_id, job_record(job))

    def _entry_phases(self, experiment_id: str | None, count: int) -> list[str]:
        """The phases `count` jobs submitted now start in, in order: queued once the
        running jobs and the queue fill `max_running_jobs` (the queue goes first), or
        once its experiment's running and queued jobs fill its `parallel`."""
        limit = self.state.limits.max_running_jobs
        busy = sum(j.running or j.queued for j in self.state.jobs.values())
        experiment = self.state.experiments.get(experiment_id or "")
        places = None
        if experiment is not None and experiment.parallel is not None:
            mine = sum(
                (j.running or j.queued) and j.experiment_id == experiment_id
                for j in self.state.jobs.values()
            )
            places = experiment.parallel - mine
        phases = []
        for i in range(count):
            full = (limit and busy + i >= limit) or (places is not None and i >= places)
            phases.append("queued" if full else "running")
        return phases

    def start_running(self, job: Job) -> None:
        """A queued job runs from now on: its buffer starts (a process of its own,
        the spare one when there is one), and its record says so before it gets a
        task."""
        job.phase, job.queue_position, job.waiting = "running", None, ""
        job.running_since = self.state.wall()
        if job.replay is None:
            job.replay = self.new_buffer(job.job_id, job.config)
        log.info("job %s leaves the queue and runs", job.job_id)
        record = job_record(job)
        store = self.state.store
        self.state.guard.defer(lambda: write_job_record(store, job.job_id, record))
        self.state.guard.notify()

    def new_buffer(
        self, job_id: str, config: JobConfig, *, here: bool = False
    ) -> ReplayBuffer | BufferProcess:
        """The job's replay: in a buffer process of its own when this coordinator runs
        them (services/coordinator/buffers.py) and not `here`, else here."""
        workflow = workflow_of(config)
        replay = workflow.replay(config)
        error_buffer = error_buffer_of(config)
        if self.state.buffers is not None and workflow.replays and not here:
            return self.state.buffers.start(
                job_id, replay, error_buffer=error_buffer, seed=config.system.seed
            )
        return ReplayBuffer(
            job_id,
            replay,
            DeferredDeletes(self.state.store, self.state.guard.defer),
            error_buffer=error_buffer,
            seed=config.system.seed,
            max_waiting_inserts=self.state.limits.max_waiting_inserts,
        )

    def _check_limits(self, config: JobConfig) -> None:
        limits = self.state.limits
        collectors = config.system.collector_num
        if collectors is not None and collectors > limits.max_collectors_per_job:
            raise bad_request(
                "config.system.collector_num",
                f"{collectors} exceeds this coordinator's limit of {limits.max_collectors_per_job}",
            )
        shards = config.policy.other.replay_buffer.shards
        if shards > 1 and self.state.buffers is None:
            raise bad_request(
                "config.policy.other.replay_buffer.shards",
                f"{shards}: this coordinator hosts every buffer itself "
                "(DROVER_BUFFER_PROCESSES=0), so a buffer is one shard",
            )
        for key in ("collector_env_num", "evaluator_env_num"):
            value = getattr(config.env, key)
            if value > limits.max_envs_per_task:
                raise bad_request(
                    f"config.env.{key}",
                    f"{value} exceeds this coordinator's limit of {limits.max_envs_per_task}",
                )

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
                else self.new_buffer(record["job_id"], config)
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
            _let_go_of_series(job)
            return job
        job.episode_returns.extend(record["episode_returns"])
        job.workflow_state = workflow_of(config).restore(_workflow_record(record), config)
        job.metrics.extend(parse(MetricsPoint, p) for p in record["metrics"])
        job.unusable_segments.update(record.get("unusable_segments", []))
        return job

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

    def stop(self, job_id: str) -> JobStatus:
        with self.state.guard.changing():
            job = self.get(job_id)
            if job.running or job.queued:
                self.finish(job, "stopped", "stopped by request")
        # The end is on disk now (the change's deferred work ran): answer with it.
        return self.status(job_id)

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
        """Write the ending job's record (with what its buffer held at the end) and its
        summary; then show its end; then let go of its index and delete its segments.
        When the record cannot be written, the job stays ending and the snapshot
        thread tries again."""
        # The buffer is closed: nothing changes it any more, so these stats are final.
        final = self._final_stats(job)
        record = {**record, "buffer": as_record(final)}
        remote = job.remote
        if remote is not None:
            # Its process's last report: every insert it took is counted.
            record["env_steps"] = max(record["env_steps"], remote.inserted_env_steps)
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
        with self.state.guard.changing():
            job.phase, job.reason, job.finished_at = phase, reason, finished_at
            job.unrecorded = ""
            job.terminal_durable = True
            job.final_buffer = final
            replay, job.replay = job.replay, None
            evals = list(job.evals)
            _let_go_of_series(job)
            self.state.guard.notify()
        self.boards.close(job.job_id, evals)
        # Step data is only for training: a finished job keeps policies, checkpoints,
        # evaluations and logs, not segments.
        if replay is not None:
            try:
                replay.release_all()
            except Exception:
                log.exception("job %s: releasing its segments failed", job.job_id)
            if self.state.buffers is not None:
                self.state.buffers.forget(job.job_id)

    def _final_stats(self, job: Job) -> BufferStats | None:
        """The ended job's buffer statistics (None: a buffer process that could not
        be asked; the job's end is recorded without them)."""
        if job.replay is None:
            return job.final_buffer
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

    # --- what is shown -------------------------------------------------------------

    def status(self, job_id: str, *, wait_s: float = 0.0) -> JobStatus:
        """The job's status; with `wait_s`, once it has ended or `wait_s` have passed
        (a client watching for the end waits here instead of polling); past
        `max_waiting_job_polls` waiting at once, at once."""
        state = self.state
        with state.guard.changing():
            job = self.get(job_id)
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
            self.boards.forget(job_id)
            log.info("job %s forgotten (ended; past its retention)", job_id)
        return gone

    def metrics(self, job_id: str) -> JobMetrics:
        with self.state.guard.changing():
            job = self.get(job_id)
            if job.replay is None:
                ended = True
            else:
                ended = False
                points, evals = list(job.metrics), list(job.evals)
                unusable = sorted(job.unusable_segments)
                buffer = job.replay
        if ended:
            # An ended job keeps its series on disk only: its record, read here
            # without the lock, is the same before and after a restart.
            return metrics_from_record(read_job_record(self.state.store, job_id) or {}, job)
        # The buffer's stats take its own lock, never the coordinator's.
        return JobMetrics(
            job_id=job_id,
            points=points,
            evals=evals,
            buffer=buffer.stats(),
            unusable_segments=unusable,
        )

    def buffer_stats(self, job_id: str) -> BufferStats:
        """The job's buffer statistics: live while it runs, as it ended after."""
        with self.state.guard.changing():
            job = self.get(job_id)
            buffer, final = job.replay, job.final_buffer
        if buffer is not None:
            return buffer.stats()  # its own lock, never the coordinator's
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
            if job.replay is None:
                self.sweep_segments(job)
                continue
            job.replay.collect_garbage()
            recent = list(job.episode_returns)
            point = MetricsPoint(
                t=round(self.state.wall(), 3),
                env_steps=job.env_steps,
                train_iters=job.train_iters,
                buffer_size=job.replay.size,
                policy_version=job.policy.version if job.policy else 0,
                collect_return_mean=statistics.fmean(recent) if recent else None,
            )
            job.metrics.append(point)
            self.boards.record(job, point)
            while len(job.metrics) > limits.metrics_points:
                job.metrics.popleft()


def _final_size(job: Job) -> int:
    return job.final_buffer.size if job.final_buffer is not None else 0


def _let_go_of_series(job: Job) -> None:
    """What an ended job no longer keeps in memory: its series (they stay in its
    record on disk) and its workflow's in-flight data; its last and best evaluation
    stay, for its status."""
    job.metrics.clear()
    del job.evals[:-1]
    job.workflow_state = None
    job.episode_returns.clear()
    job.unusable_segments.clear()


def _workflow_record(record: dict[str, Any]) -> dict[str, Any]:
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


class DeferredDeletes:
    """The buffer's segment files: a file released while the coordinator's lock is held
    is deleted once the lock is let go."""

    def __init__(self, store: SharedStore, defer: Any) -> None:
        self._store = store
        self._defer = defer

    def delete(self, rel: str) -> bool:
        self._defer(lambda: self._store.delete(rel))
        return True

    def write_bytes(self, rel: str, data: bytes) -> Any:
        return self._store.write_bytes(rel, data)

    def read_bytes(self, rel: str) -> bytes:
        return self._store.read_bytes(rel)
