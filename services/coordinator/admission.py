"""Admission: whether a coordinator takes a job (`admissible`: its config resolved and
checked, its limits, its workflow's own checks, the workers it needs), and creating
jobs (one, or an experiment's many in one pass), each durable before it is answered;
a queued job's start (`start_running`) and every job's buffer (`new_buffer`)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common.config import ConfigError, JobConfig
from common.envs import Spaces
from common.errors import bad_request
from common.messages import JobCreated, JobSubmit, new_id
from jobconfig import error_buffer_of, fit_to_env, resolve_job_config
from jobconfig.spaces import known_env_spaces
from services.coordinator.devices import refuse_unless_fits, waiting_reason
from services.coordinator.jobs import JobBook, config_record, job_record
from services.coordinator.remote_buffer import BufferProcess
from services.coordinator.snapshot import write_job_record
from services.coordinator.state import CoordinatorState, Job
from services.coordinator.workflows import Planner, check_workflow, workflow_of

log = logging.getLogger(__name__)

#: Threads that write a batch of new jobs' files at once (`create_many`): the
#: volume's round trips overlap.
WRITERS = 8


class Admission:
    def __init__(self, state: CoordinatorState, jobs: JobBook) -> None:
        self.state = state
        self.jobs = jobs

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

    def new_buffer(self, job_id: str, config: JobConfig) -> BufferProcess | None:
        """The job's buffer, its processes started (services/coordinator/buffers.py);
        None for a workflow that replays nothing."""
        workflow = workflow_of(config)
        if not workflow.replays:
            return None
        return self.state.buffers.start(
            job_id,
            workflow.replay(config),
            error_buffer=error_buffer_of(config),
            seed=config.system.seed,
        )

    def _check_limits(self, config: JobConfig) -> None:
        limits = self.state.limits
        collectors = config.system.collector_num
        if collectors is not None and collectors > limits.max_collectors_per_job:
            raise bad_request(
                "config.system.collector_num",
                f"{collectors} exceeds this coordinator's limit of {limits.max_collectors_per_job}",
            )
        for key in ("collector_env_num", "evaluator_env_num"):
            value = getattr(config.env, key)
            if value > limits.max_envs_per_task:
                raise bad_request(
                    f"config.env.{key}",
                    f"{value} exceeds this coordinator's limit of {limits.max_envs_per_task}",
                )
