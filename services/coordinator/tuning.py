"""A tuning experiment's study: Optuna's sampler and pruner choose its jobs (the `tune:`
section, jobconfig/tuning.py), run by the coordinator beside its other experiments.

A trial: the sampler picks the parameters (`ask`), a job of the experiment runs the
base config with them (system.seed: `tune.seed`), and each of its evaluations is
reported to the trial at its env steps (the mean return; for `env_steps_to_stop`, minus
it, as that study minimizes). When the pruner says the trial is behind the others at
that point, its job is stopped at once and the trial is pruned. A job that ends is
scored (`score`):

- `env_steps_to_stop`: the env steps of its first evaluation at or above
  `env.stop_value`; one that never got there scores its budget (`system.max_env_step`,
  or the env steps it ran);
- `final_return`, `best_return`: its last, or best, evaluation's mean return.

A job that failed for another reason than its budget (its tasks failed), or was
stopped by someone else, fails its trial, and another trial takes its place (up to
`n_trials` failures in all). The study lives in Optuna's storage, a SQLite file in the
experiment's folder (`experiments/<id>/study.db` under the shared root), so a
restarted coordinator goes on with it: its complete
and pruned trials kept, a trial that was running when it stopped failed (its job
stopped), and a new trial in its place.

`Tuner` runs one study on a thread of its own, over `TrialJobs` (the experiment's
jobs, services/coordinator/experiments.py); it never holds the coordinator's lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common.errors import ApiError
from common.messages import TERMINAL_PHASES, EvalSummary, JobStatus
from jobconfig.sweep import Axis, Point, member_config
from jobconfig.tuning import Tuning

log = logging.getLogger(__name__)

#: How often each running trial's job is looked at.
POLL_S = 1.0


class TrialJobs(Protocol):
    """The jobs of a tuning experiment, as its `Tuner` makes and reads them."""

    def submit(self, config: dict[str, Any], trial: int, values: dict[str, Any]) -> str:
        """A new job of the experiment for `trial`: its id.

        Raises:
            ApiError: the coordinator refuses its config (the trial's values' fault).
        """
        ...

    def status(self, job_id: str) -> JobStatus | None:
        """Its status (None: not known now)."""
        ...

    def evals(self, job_id: str) -> list[EvalSummary] | None:
        """Its evaluations by env steps (None: not readable now)."""
        ...

    def stop(self, job_id: str) -> None: ...

    def settled(self, job_id: str, state: str, value: float | None) -> None:
        """Its trial ended: complete (with its objective), pruned or failed."""
        ...


def open_study(tuning: Tuning, name: str, storage: str) -> Any:
    """The study (made, or loaded as a restart finds it) with the section's sampler,
    pruner and direction."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (
        optuna.samplers.TPESampler(seed=tuning.seed)
        if tuning.sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=tuning.seed)
    )
    pruner: Any = {
        # Trials are pruned once a few have evaluations to compare with.
        "median": optuna.pruners.MedianPruner(n_startup_trials=max(2, tuning.n_parallel)),
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner(),
        "none": optuna.pruners.NopPruner(),
    }[tuning.pruner]
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction=tuning.direction,
        load_if_exists=True,
    )


@dataclass
class Watched:
    """A running trial and its job."""

    trial: Any
    job_id: str
    #: Its job's evaluations reported to the trial so far.
    reported: int = 0


class Tuner:
    """Runs a study's trials as jobs (the module's docstring)."""

    def __init__(
        self,
        jobs: TrialJobs,
        study: Any,
        tuning: Tuning,
        base: dict[str, Any],
        *,
        poll_s: float | None = None,
    ) -> None:
        self.jobs = jobs
        self.study = study
        self.tuning = tuning
        self.base = base
        self.poll_s = POLL_S if poll_s is None else poll_s
        self.running: dict[str, Watched] = {}

    def run(self, stop: threading.Event) -> bool:
        """Trials until `n_trials` ended (True), or until `stop` is set (False: the
        running ones are left running, `abandon` fails them)."""
        self._fail_cut_short()
        while not stop.is_set():
            while len(self.running) < self.tuning.n_parallel and self._to_start() > 0:
                self._start()
            if not self.running:
                return True
            for watched in list(self.running.values()):
                if self._follow(watched):
                    del self.running[watched.job_id]
            stop.wait(self.poll_s)
        return False

    def abandon(self) -> None:
        """The experiment was stopped: its running trials fail (their jobs stopped)."""
        for watched in list(self.running.values()):
            self.jobs.stop(watched.job_id)
            self._tell(watched, "FAIL")
        self.running.clear()

    def _to_start(self) -> int:
        """Trials still to start: `n_trials` complete, pruned or running in all, unless
        as many have failed already."""
        trials = self.study.get_trials(deepcopy=False)
        failed = sum(t.state == trial_state("FAIL") for t in trials)
        if failed >= self.tuning.n_trials:
            return 0
        return self.tuning.n_trials - (len(trials) - failed)

    def _fail_cut_short(self) -> None:
        """Trials left running by a coordinator that stopped: failed, their jobs
        stopped (a new trial takes each one's place)."""
        for frozen in self.study.get_trials(deepcopy=False, states=(trial_state("RUNNING"),)):
            job_id = frozen.user_attrs.get("job_id")
            self.study.tell(frozen.number, state=trial_state("FAIL"))
            if job_id:
                self.jobs.stop(job_id)
                self.jobs.settled(job_id, "failed", None)
            log.info("trial %d: cut short by a restart; failed", frozen.number)

    def _start(self) -> None:
        trial = self.study.ask()
        values = {axis.key: suggest(trial, axis) for axis in self.tuning.params}
        config = member_config(self.base, Point(values, self.tuning.seed))
        try:
            job_id = self.jobs.submit(config, trial.number, values)
        except ApiError as exc:  # a value the coordinator refuses: this trial's fault
            self.study.tell(trial, state=trial_state("FAIL"))
            log.warning("trial %d: refused (%s)", trial.number, exc.message)
            return
        trial.set_user_attr("job_id", job_id)
        self.running[job_id] = Watched(trial, job_id)

    def _follow(self, watched: Watched) -> bool:
        """Report its new evaluations; prune it or score it. True once it is over."""
        status = self.jobs.status(watched.job_id)
        evals = self.jobs.evals(watched.job_id) if status is not None else None
        if status is None or evals is None:
            return False  # not readable now: look again later
        trial = watched.trial
        for summary in evals[watched.reported :]:
            trial.report(self._intermediate(summary), step=summary.env_steps)
        watched.reported = len(evals)
        trial.set_user_attr("env_steps", status.env_steps)
        if status.phase in TERMINAL_PHASES:
            value = score(self.tuning, status, evals)
            if value is None:
                self._tell(watched, "FAIL")
            else:
                self.study.tell(trial, value)
                self.jobs.settled(watched.job_id, "complete", value)
            return True
        if evals and trial.should_prune():
            self.jobs.stop(watched.job_id)
            self._tell(watched, "PRUNED")
            log.info("trial %d: pruned at %d env steps", trial.number, evals[-1].env_steps)
            return True
        return False

    def _tell(self, watched: Watched, state: str) -> None:
        self.study.tell(watched.trial, state=trial_state(state))
        self.jobs.settled(watched.job_id, "pruned" if state == "PRUNED" else "failed", None)

    def _intermediate(self, summary: EvalSummary) -> float:
        # The study's direction: a minimizing study is told minus the return.
        return -summary.return_mean if self.tuning.direction == "minimize" else summary.return_mean


def score(tuning: Tuning, status: JobStatus, evals: list[EvalSummary]) -> float | None:
    """An ended trial job's objective (the module's docstring); None: its trial failed."""
    budget_ran_out = status.phase == "failed" and "reached before stop_value" in status.reason
    if status.phase != "succeeded" and not budget_ran_out:
        return None
    if tuning.objective == "env_steps_to_stop":
        goal = status.stop_value
        reached = [e.env_steps for e in evals if goal is not None and e.return_mean >= goal]
        if reached:
            return float(min(reached))
        return float(status.max_env_step or status.env_steps)
    if not evals:
        return None
    returns = [e.return_mean for e in evals]
    return returns[-1] if tuning.objective == "final_return" else max(returns)


def suggest(trial: Any, axis: Axis) -> Any:
    """The trial's value of a parameter: a choice of a list, or a draw of a range."""
    if axis.values is not None:
        return trial.suggest_categorical(axis.key, list(axis.values))
    log_scale = axis.kind == "log_uniform"
    if axis.integer:
        return trial.suggest_int(axis.key, int(axis.low), int(axis.high), log=log_scale)
    return trial.suggest_float(axis.key, axis.low, axis.high, log=log_scale)


def trial_state(name: str) -> Any:
    import optuna

    return getattr(optuna.trial.TrialState, name)


class TuningRun:
    """A `Tuner` on a thread of its own; `on_done` is called if it ran its trials."""

    def __init__(self, tuner: Tuner, name: str, on_done: Callable[[], None]) -> None:
        self.tuner = tuner
        self._stop = threading.Event()
        self._on_done = on_done
        self._thread = threading.Thread(target=self._run, name=f"tune-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.tuner.run(self._stop):
                self._on_done()
        except Exception:
            log.exception("the tuning stopped on an error; a restart goes on with its study")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, *, abandon: bool) -> None:
        """Stop starting and following trials; `abandon`: fail the running ones."""
        self._stop.set()
        self._thread.join(timeout=30)
        if abandon:
            self.tuner.abandon()
