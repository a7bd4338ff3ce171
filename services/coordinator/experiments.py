"""Experiments: the jobs of one config's sweep (jobconfig/sweep.py), submitted together,
or the trials of its tuning (jobconfig/tuning.py), made as its study asks for them
(services/coordinator/tuning.py); jobconfig/experiment.py reads either section.

Every job the sweep expands to is checked as a job of its own would be (its config
resolved, its workflow's and the limits' refusals) before any is created, so a bad
axis or value is one 400 naming it and nothing starts. Then its jobs are created in
the sweep's order; past `sweep.parallel` running at once they wait in the queue for
one of the experiment's places (sharing.py). The experiment's record
(`experiments/<id>.json` under the shared root) is written before it is answered and
again when it is stopped, so a restarted coordinator has it back, its jobs with it; a
tuning's study lives in its folder (`experiments/<id>/study.db`) and goes on after a
restart (`start_tunings`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from common.config import ConfigError
from common.envs import Spaces
from common.errors import ApiError, bad_request, not_found
from common.messages import (
    EvalSummary,
    ExperimentCreated,
    ExperimentList,
    ExperimentMember,
    ExperimentStatus,
    ExperimentSubmit,
    ExperimentSummary,
    JobStatus,
    MessageError,
    PopulationStep,
    dump,
    new_id,
    parse,
)
from common.storage import CorruptFileError, SharedStore
from jobconfig.experiment import plan_experiment
from jobconfig.population import Population
from jobconfig.sweep import Point
from services.coordinator.admission import Admission
from services.coordinator.job_views import MAX_PAGE, JobViews
from services.coordinator.jobs import JobBook
from services.coordinator.paging import newest_first
from services.coordinator.state import CoordinatorState, Experiment, ExperimentJob, Job
from services.coordinator.tuning import Tuner, TuningRun, open_study
from services.coordinator.workflows import Planner

log = logging.getLogger(__name__)

#: Where experiments' records live under the shared root (a folder no job has).
FOLDER = "experiments"


class ExperimentBook:
    def __init__(
        self, state: CoordinatorState, jobs: JobBook, admission: Admission, views: JobViews
    ) -> None:
        self.state = state
        self.jobs = jobs
        self.admission = admission
        self.views = views
        #: Each running tuning's study, on a thread of its own.
        self._tunings: dict[str, TuningRun] = {}

    def submit(self, submit: ExperimentSubmit, planner: Planner) -> ExperimentCreated:
        try:
            plan = plan_experiment(submit.config, self.state.limits.max_experiment_jobs)
        except ConfigError as exc:
            own = exc.field.startswith(("sweep", "pbt", "tune"))
            field = exc.field if own else f"config.{exc.field}"
            raise bad_request(field, exc.message) from None
        if plan.tuning is not None:
            return self._submit_tuning(submit, plan.base, planner)
        assert plan.sweep is not None
        sweep, points = plan.sweep, plan.points
        # Every job checked before any exists; each env the sweep has made once.
        known_spaces: dict[str, Spaces] = {}
        admitted = [
            self.admission.admissible(config, planner, known_spaces=known_spaces)
            for _, config in points
        ]
        experiment_id = new_id("exp")
        name = submit.name or admitted[0][0].exp_name
        experiment = Experiment(
            experiment_id=experiment_id,
            name=name,
            created_at=self.state.wall(),
            parallel=sweep.parallel,
            jobs=[],
            population=sweep.population,
        )
        with self.state.guard.changing():
            self.state.experiments[experiment_id] = experiment
        self._write(experiment)  # before its jobs: a restart finds what they belong to
        warnings: list[str] = []
        try:
            entries = [
                (config, job_warnings, f"{name} {point.label()} seed={point.seed}".strip())
                for (point, _), (config, job_warnings) in zip(points, admitted, strict=True)
            ]
            made = self.admission.create_many(entries, experiment_id=experiment_id)
            with self.state.guard.changing():
                experiment.jobs.extend(
                    ExperimentJob(created.job_id, point.values, point.seed)
                    for (point, _), created in zip(points, made, strict=True)
                )
            for created in made:
                warnings.extend(w for w in created.warnings if w not in warnings)
        finally:
            self._write(experiment)  # with its jobs, or none if they could not be made
        log.info("experiment %s (%s): %d jobs", experiment_id, name, len(experiment.jobs))
        return ExperimentCreated(
            experiment_id=experiment_id,
            job_ids=[j.job_id for j in experiment.jobs],
            warnings=warnings,
        )

    def get(self, experiment_id: str) -> Experiment:
        experiment = self.state.experiments.get(experiment_id)
        if experiment is None:
            raise not_found(f"experiment {experiment_id}")
        return experiment

    def status(self, experiment_id: str) -> ExperimentStatus:
        with self.state.guard.changing():
            experiment = self.get(experiment_id)
            # What is read of its jobs, under the lock; the answer is built after.
            seen = [(member, self.state.jobs.get(member.job_id)) for member in experiment.jobs]
            rows = [(member, job and _member_facts(job)) for member, job in seen]
            lineage = list(experiment.lineage)
            stopped = experiment.stopped
        return _status(experiment, rows, lineage, stopped, self._tuning(experiment_id))

    def listing(self, *, limit: int = MAX_PAGE, page_token: str | None = None) -> ExperimentList:
        """Experiments newest first, `limit` at a time (`page_token`: the last answer's
        `next_page_token`), each with its jobs counted."""
        with self.state.guard.changing():
            page, next_token = newest_first(
                self.state.experiments.values(),
                lambda e: (e.created_at, e.experiment_id),
                limit,
                page_token,
            )
            counted = [(e, self._count(e)) for e in page]
        summaries = [
            ExperimentSummary(
                experiment_id=e.experiment_id,
                name=e.name,
                phase=phase,  # type: ignore[arg-type]
                created_at=e.created_at,
                parallel=e.parallel,
                jobs=len(e.jobs),
                jobs_ended=ended,
                population=e.population is not None,
            )
            for e, (phase, ended) in counted
        ]
        return ExperimentList(experiments=summaries, next_page_token=next_token)

    def _count(self, experiment: Experiment) -> tuple[str, int]:
        """Its phase, and how many of its jobs ended (or are forgotten)."""
        live = 0
        for member in experiment.jobs:
            job = self.state.jobs.get(member.job_id)
            live += job is not None and job.phase in ("queued", "running")
        running = live > 0 or self._tuning(experiment.experiment_id)
        return _phase(experiment.stopped, running), len(experiment.jobs) - live

    def stop(self, experiment_id: str) -> ExperimentStatus:
        """Stop every job of the experiment that has not ended (a tuning's study
        first: its running trials fail)."""
        with self.state.guard.changing():
            self.get(experiment_id)
            tuning = self._tunings.pop(experiment_id, None)
        if tuning is not None:
            tuning.stop(abandon=True)
        with self.state.guard.changing():
            experiment = self.get(experiment_id)
            experiment.stopped = True
            for member in experiment.jobs:
                job = self.state.jobs.get(member.job_id)
                if job is not None and (job.running or job.queued):
                    self.jobs.finish(job, "stopped", f"its experiment {experiment_id} was stopped")
        self._write(experiment)
        return self.status(experiment_id)

    # --- tunings -------------------------------------------------------------------------

    def _submit_tuning(
        self, submit: ExperimentSubmit, base: dict[str, Any], planner: Planner
    ) -> ExperimentCreated:
        """A tuning: its base config checked as a job's would be (a trial's values are
        checked as its job is made), the experiment made, and its study started."""
        config, warnings = self.admission.admissible(base, planner)
        experiment = Experiment(
            experiment_id=new_id("exp"),
            name=submit.name or config.exp_name,
            created_at=self.state.wall(),
            parallel=None,
            jobs=[],
            tune_config=submit.config,
        )
        with self.state.guard.changing():
            self.state.experiments[experiment.experiment_id] = experiment
        self._write(experiment)
        self._start_tuning(experiment, planner)
        log.info("experiment %s (%s): a tuning", experiment.experiment_id, experiment.name)
        return ExperimentCreated(
            experiment_id=experiment.experiment_id, job_ids=[], warnings=warnings
        )

    def start_tunings(self, planner: Planner) -> None:
        """The tunings a restart found unfinished go on (after their jobs are back)."""
        with self.state.guard.changing():
            unfinished = [
                e
                for e in self.state.experiments.values()
                if e.tune_config is not None and not e.stopped and not e.tuning_done
            ]
        for experiment in unfinished:
            try:
                self._start_tuning(experiment, planner)
            except Exception:  # its study unreadable: the coordinator starts all the same
                log.exception("experiment %s: its tuning cannot go on", experiment.experiment_id)

    def close(self) -> None:
        """Stop every study's thread; their running trials stay running (a restart
        fails them and goes on)."""
        with self.state.guard.changing():
            tunings, self._tunings = list(self._tunings.values()), {}
        for tuning in tunings:
            tuning.stop(abandon=False)

    def _tuning(self, experiment_id: str) -> bool:
        run = self._tunings.get(experiment_id)
        return run is not None and run.alive

    def _start_tuning(self, experiment: Experiment, planner: Planner) -> None:
        assert experiment.tune_config is not None
        plan = plan_experiment(experiment.tune_config, self.state.limits.max_experiment_jobs)
        assert plan.tuning is not None  # as it was when it was submitted
        tuning, base = plan.tuning, plan.base
        experiment_id = experiment.experiment_id
        folder = self.state.store.root / FOLDER / experiment_id
        folder.mkdir(parents=True, exist_ok=True)
        study = open_study(tuning, experiment_id, f"sqlite:///{folder.resolve()}/study.db")
        trials = ExperimentTrials(self, experiment, planner, tuning.seed)
        run = TuningRun(
            Tuner(trials, study, tuning, base), experiment_id, lambda: self._tuned(experiment)
        )
        with self.state.guard.changing():
            self._tunings[experiment_id] = run
        run.start()

    def _tuned(self, experiment: Experiment) -> None:
        with self.state.guard.changing():
            experiment.tuning_done = True
        self._write(experiment)
        log.info("experiment %s: its tuning ran its trials", experiment.experiment_id)

    # --- on disk -------------------------------------------------------------------------

    def _write(self, experiment: Experiment) -> None:
        write_experiment(self.state, experiment)

    def restore(self) -> list[str]:
        """Load every experiment's record (at start, before its jobs are planned)."""
        experiments, unreadable = read_experiments(self.state.store)
        for why in unreadable:
            log.error("cannot restore an experiment: %s", why)
        with self.state.guard.changing():
            for experiment in experiments:
                self.state.experiments[experiment.experiment_id] = experiment
        return [e.experiment_id for e in experiments]


class ExperimentTrials:
    """A tuning's jobs as its `Tuner` makes and reads them (tuning.py's `TrialJobs`):
    each trial a job of the experiment, its trial's end kept in its member's row."""

    def __init__(
        self, book: ExperimentBook, experiment: Experiment, planner: Planner, seed: int
    ) -> None:
        self.book, self.experiment, self.planner, self.seed = book, experiment, planner, seed

    def submit(self, config: dict[str, Any], trial: int, values: dict[str, Any]) -> str:
        book, experiment = self.book, self.experiment
        resolved, warnings = book.admission.admissible(config, self.planner)
        name = f"{experiment.name} trial {trial} {Point(values, self.seed).label()}"
        (made,) = book.admission.create_many(
            [(resolved, warnings, name)], experiment_id=experiment.experiment_id
        )
        with book.state.guard.changing():
            experiment.jobs.append(ExperimentJob(made.job_id, values, self.seed, trial=trial))
        book._write(experiment)
        log.info("experiment %s: trial %d is job %s", experiment.experiment_id, trial, made.job_id)
        return made.job_id

    def status(self, job_id: str) -> JobStatus | None:
        try:
            return self.book.views.status(job_id)
        except ApiError:
            return None

    def evals(self, job_id: str) -> list[EvalSummary] | None:
        try:
            return sorted(self.book.views.metrics(job_id).evals, key=lambda e: e.env_steps)
        except ApiError:
            return None

    def stop(self, job_id: str) -> None:
        with contextlib.suppress(ApiError):  # it ended meanwhile
            self.book.jobs.stop(job_id)

    def settled(self, job_id: str, state: str, value: float | None) -> None:
        with self.book.state.guard.changing():
            for member in self.experiment.jobs:
                if member.job_id == job_id:
                    member.trial_state, member.objective = state, value
        self.book._write(self.experiment)


def forget_old_experiments(state: CoordinatorState) -> list[str]:
    """Forget the experiments none of whose jobs this coordinator keeps any more
    (each forgotten with the same retention: `JobViews.forget_old`), and their
    records (call under the lock). Returns their ids."""
    kept_s = state.limits.ended_job_retention_s
    gone = [
        e.experiment_id
        for e in state.experiments.values()
        if all(m.job_id not in state.jobs for m in e.jobs)
        # One still being submitted has no job yet.
        and (e.jobs or e.created_at < state.wall() - kept_s)
    ]
    store = state.store
    for experiment_id in gone:
        del state.experiments[experiment_id]
        for path in (record_path(experiment_id), lineage_path(experiment_id)):
            state.guard.defer(lambda path=path: store.delete(path))
        # A tuning's study.
        state.guard.defer(lambda e=experiment_id: store.delete_tree(f"{FOLDER}/{e}"))
        log.info("experiment %s forgotten (its jobs were)", experiment_id)
    return gone


def record_path(experiment_id: str) -> str:
    return f"{FOLDER}/{experiment_id}.json"


def lineage_path(experiment_id: str) -> str:
    """Its population's steps, a JSON line each, appended as they are taken."""
    return f"{FOLDER}/{experiment_id}.lineage.jsonl"


def append_lineage(state: CoordinatorState, experiment: Experiment, step: PopulationStep) -> None:
    """A population step joins the experiment's lineage (call under the lock): kept,
    and appended to its file once the lock is let go; a lineage is never rewritten."""
    experiment.lineage.append(step)
    line = json.dumps(dump(step), sort_keys=True).encode()
    path = lineage_path(experiment.experiment_id)
    state.guard.defer(lambda: state.store.append_line(path, line))


def read_lineage(store: SharedStore, experiment_id: str) -> list[PopulationStep]:
    """Its lineage file's steps (a line cut short by a crash mid-append is left out)."""
    path = lineage_path(experiment_id)
    if not store.exists(path):
        return []
    steps = []
    for line in store.read_bytes(path).splitlines():
        try:
            steps.append(parse(PopulationStep, json.loads(line)))
        except (ValueError, MessageError):
            log.warning("%s: a step cut short is left out", path)
    return steps


def write_experiment(state: CoordinatorState, experiment: Experiment) -> None:
    """Write the experiment's record as it is now, once the lock is let go: records
    built by two threads land in the order they were built (`latest_of`), and one that
    finds no room is kept and tried again."""
    path = record_path(experiment.experiment_id)
    with state.guard.changing():
        record = experiment_record(experiment)
        state.guard.defer(lambda: state.store.write_json(path, record), latest_of=path)


def read_experiments(store: SharedStore) -> tuple[list[Experiment], list[str]]:
    """Every experiment's record under the shared root, and why each one that cannot be
    read cannot."""
    experiments, unreadable = [], []
    for name in store.list_dir(FOLDER):
        if not name.endswith(".json"):
            continue
        try:
            experiment = experiment_from(store.read_json(f"{FOLDER}/{name}"))
            experiment.lineage.extend(read_lineage(store, experiment.experiment_id))
            experiments.append(experiment)
        except (OSError, CorruptFileError, KeyError, TypeError, ValueError) as exc:
            unreadable.append(f"{FOLDER}/{name}: {exc}")
    return experiments, unreadable


def experiment_record(experiment: Experiment) -> dict[str, Any]:
    return {
        "experiment_id": experiment.experiment_id,
        "name": experiment.name,
        "created_at": experiment.created_at,
        "parallel": experiment.parallel,
        "stopped": experiment.stopped,
        "jobs": [
            {
                "job_id": j.job_id,
                "values": j.values,
                "seed": j.seed,
                "trial": j.trial,
                "trial_state": j.trial_state,
                "objective": j.objective,
            }
            for j in experiment.jobs
        ],
        "population": None if experiment.population is None else experiment.population.record(),
        "ranked_at_evals": experiment.ranked_at_evals,
        "tune_config": experiment.tune_config,
        "tuning_done": experiment.tuning_done,
    }


def experiment_from(record: dict[str, Any]) -> Experiment:
    return Experiment(
        experiment_id=str(record["experiment_id"]),
        name=str(record["name"]),
        created_at=float(record["created_at"]),
        parallel=None if record["parallel"] is None else int(record["parallel"]),
        stopped=bool(record["stopped"]),
        jobs=[
            ExperimentJob(
                str(j["job_id"]),
                dict(j["values"]),
                int(j["seed"]),
                trial=j.get("trial"),
                trial_state=j.get("trial_state"),
                objective=j.get("objective"),
            )
            for j in record["jobs"]
        ],
        # Records of before population-based training lack these; those written
        # before its lineage was a file of its own hold it.
        population=(
            None
            if record.get("population") is None
            else Population.from_record(record["population"])
        ),
        lineage=[parse(PopulationStep, step) for step in record.get("lineage", [])],
        ranked_at_evals={str(k): int(v) for k, v in record.get("ranked_at_evals", {}).items()},
        tune_config=record.get("tune_config"),
        tuning_done=bool(record.get("tuning_done", False)),
    )


def _member_facts(job: Job) -> tuple[str, int, float | None, float | None, str]:
    """What a member's row shows of its job, read under the lock."""
    return (
        job.phase,  # as its own status shows it: an end only once it is on disk
        job.env_steps,
        job.evals[-1].return_mean if job.evals else None,
        job.best_eval.return_mean if job.best_eval else None,
        job.reason,
    )


def _status(
    experiment: Experiment,
    rows: list[tuple[ExperimentJob, tuple[str, int, float | None, float | None, str] | None]],
    lineage: list[PopulationStep],
    stopped: bool,
    tuning: bool = False,
) -> ExperimentStatus:
    members = []
    for member, facts in rows:
        if facts is None:
            members.append(
                ExperimentMember(
                    job_id=member.job_id,
                    values=member.values,
                    seed=member.seed,
                    phase="forgotten",
                    trial=member.trial,
                    trial_state=member.trial_state,
                    objective=member.objective,
                )
            )
            continue
        phase, env_steps, last, best, reason = facts
        members.append(
            ExperimentMember(
                job_id=member.job_id,
                values=member.values,
                seed=member.seed,
                phase=phase,
                env_steps=env_steps,
                last_eval_return=last,
                best_eval_return=best,
                reason=reason,
                trial=member.trial,
                trial_state=member.trial_state,
                objective=member.objective,
            )
        )
    running = tuning or any(m.phase in ("queued", "running") for m in members)
    return ExperimentStatus(
        experiment_id=experiment.experiment_id,
        name=experiment.name,
        phase=_phase(stopped, running),  # type: ignore[arg-type]
        created_at=experiment.created_at,
        parallel=experiment.parallel,
        members=members,
        population=None if experiment.population is None else experiment.population.record(),
        lineage=lineage,
        tuning=(experiment.tune_config or {}).get("tune"),
    )


def _phase(stopped: bool, running: bool) -> str:
    return "running" if running else ("stopped" if stopped else "ended")
