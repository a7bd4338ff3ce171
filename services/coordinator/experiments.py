"""Experiments: the jobs of one config's sweep (jobconfig/sweep.py), submitted together.

Every job the sweep expands to is checked as a job of its own would be (its config
resolved, its workflow's and the limits' refusals) before any is created, so a bad
axis or value is one 400 naming it and nothing starts. Then its jobs are created in
the sweep's order; past `sweep.parallel` running at once they wait in the queue for
one of the experiment's places (sharing.py). The experiment's record
(`experiments/<id>.json` under the shared root) is written before it is answered and
again when it is stopped, so a restarted coordinator has it back, its jobs with it.
"""

from __future__ import annotations

import logging
from typing import Any

from common.config import ConfigError
from common.errors import bad_request, not_found
from common.messages import (
    ExperimentCreated,
    ExperimentList,
    ExperimentMember,
    ExperimentStatus,
    ExperimentSubmit,
    PopulationStep,
    dump,
    new_id,
    parse,
)
from common.storage import CorruptFileError, SharedStore
from jobconfig.population import Population
from jobconfig.sweep import plan_sweep
from services.coordinator.jobs import JobBook
from services.coordinator.state import CoordinatorState, Experiment, ExperimentJob
from services.coordinator.workflows import Planner

log = logging.getLogger(__name__)

#: Where experiments' records live under the shared root (a folder no job has).
FOLDER = "experiments"


class ExperimentBook:
    def __init__(self, state: CoordinatorState, jobs: JobBook) -> None:
        self.state = state
        self.jobs = jobs

    def submit(self, submit: ExperimentSubmit, planner: Planner) -> ExperimentCreated:
        try:
            sweep, points = plan_sweep(submit.config, self.state.limits.max_experiment_jobs)
        except ConfigError as exc:
            own = exc.field.startswith(("sweep", "pbt"))
            field = exc.field if own else f"config.{exc.field}"
            raise bad_request(field, exc.message) from None
        # Every job checked before any exists.
        admitted = [self.jobs.admissible(config, planner) for _, config in points]
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
            for (point, _), (config, job_warnings) in zip(points, admitted, strict=True):
                label = point.label()
                created = self.jobs.create(
                    config,
                    job_warnings,
                    f"{name} {label} seed={point.seed}".strip(),
                    planner,
                    experiment_id=experiment_id,
                )
                with self.state.guard.changing():
                    experiment.jobs.append(ExperimentJob(created.job_id, point.values, point.seed))
                warnings.extend(w for w in created.warnings if w not in warnings)
        finally:
            self._write(experiment)  # with every job made, even if one could not be
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
            return self._status(self.get(experiment_id))

    def listing(self) -> ExperimentList:
        with self.state.guard.changing():
            experiments = sorted(self.state.experiments.values(), key=lambda e: -e.created_at)
            return ExperimentList(experiments=[self._status(e) for e in experiments])

    def stop(self, experiment_id: str) -> ExperimentStatus:
        """Stop every job of the experiment that has not ended."""
        with self.state.guard.changing():
            experiment = self.get(experiment_id)
            experiment.stopped = True
            for member in experiment.jobs:
                job = self.state.jobs.get(member.job_id)
                if job is not None and (job.running or job.queued):
                    self.jobs.finish(job, "stopped", f"its experiment {experiment_id} was stopped")
        self._write(experiment)
        return self.status(experiment_id)

    def _status(self, experiment: Experiment) -> ExperimentStatus:
        members = []
        for member in experiment.jobs:
            job = self.state.jobs.get(member.job_id)
            if job is None:
                members.append(
                    ExperimentMember(
                        job_id=member.job_id,
                        values=member.values,
                        seed=member.seed,
                        phase="forgotten",
                    )
                )
                continue
            members.append(
                ExperimentMember(
                    job_id=member.job_id,
                    values=member.values,
                    seed=member.seed,
                    # As its own status shows it: an end only once it is on disk.
                    phase=job.phase,
                    env_steps=job.env_steps,
                    last_eval_return=job.evals[-1].return_mean if job.evals else None,
                    best_eval_return=job.best_eval.return_mean if job.best_eval else None,
                    reason=job.reason,
                )
            )
        running = any(m.phase in ("queued", "running") for m in members)
        phase = "running" if running else ("stopped" if experiment.stopped else "ended")
        return ExperimentStatus(
            experiment_id=experiment.experiment_id,
            name=experiment.name,
            phase=phase,  # type: ignore[arg-type]
            created_at=experiment.created_at,
            parallel=experiment.parallel,
            members=members,
            population=None if experiment.population is None else experiment.population.record(),
            lineage=list(experiment.lineage),
        )

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


def write_experiment(state: CoordinatorState, experiment: Experiment) -> None:
    """Write the experiment's record as it is now, once the lock is let go: records
    built by two threads land in the order they were built (`latest_of`), and one that
    finds no room is kept and tried again."""
    path = f"{FOLDER}/{experiment.experiment_id}.json"
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
            experiments.append(experiment_from(store.read_json(f"{FOLDER}/{name}")))
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
        "jobs": [{"job_id": j.job_id, "values": j.values, "seed": j.seed} for j in experiment.jobs],
        "population": None if experiment.population is None else experiment.population.record(),
        "lineage": [dump(step) for step in experiment.lineage],
        "ranked_at_evals": experiment.ranked_at_evals,
    }


def experiment_from(record: dict[str, Any]) -> Experiment:
    return Experiment(
        experiment_id=str(record["experiment_id"]),
        name=str(record["name"]),
        created_at=float(record["created_at"]),
        parallel=None if record["parallel"] is None else int(record["parallel"]),
        stopped=bool(record["stopped"]),
        jobs=[
            ExperimentJob(str(j["job_id"]), dict(j["values"]), int(j["seed"]))
            for j in record["jobs"]
        ],
        # Records of before population-based training lack the three.
        population=(
            None
            if record.get("population") is None
            else Population.from_record(record["population"])
        ),
        lineage=[parse(PopulationStep, step) for step in record.get("lineage", [])],
        ranked_at_evals={str(k): int(v) for k, v in record.get("ranked_at_evals", {}).items()},
    )
