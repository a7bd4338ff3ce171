"""`drover tune`: an Optuna study whose trials are drover jobs, `n_parallel` at a time on
the cluster (the `tune:` section: jobconfig/tuning.py).

    drover tune examples/tuning/cartpole_ppo.yaml            # a local cluster, to the end
    drover tune FILE --url http://coordinator:8000           # a running coordinator's workers
    drover tune FILE --resume runs/cartpole_ppo_tune-...     # go on with a study cut short
    optuna-dashboard sqlite:///runs/cartpole_ppo_tune-.../study.db

A trial: Optuna's sampler picks the parameters (`ask`), a job runs the base config with
them (system.seed: `tune.seed`), and each of its evaluations is reported to the trial
at its env steps (the mean return; for `env_steps_to_stop`, minus it, as that study
minimizes). When the pruner says the trial is behind the others at that point, its job
is stopped at once and the trial is pruned. A job that ends is scored:

- `env_steps_to_stop`: the env steps of its first evaluation at or above
  `env.stop_value`; one that never got there scores its budget (`system.max_env_step`,
  or the env steps it ran);
- `final_return`, `best_return`: its last, or best, evaluation's mean return.

A job that failed for another reason than its budget (its tasks failed), or was stopped
by someone else, fails its trial, and another trial takes its place (up to `n_trials`
failures in all). The study lives in Optuna's storage, a SQLite file in the run folder
unless `tune.storage` names another: `--resume` goes on with it, its complete and
pruned trials kept; a trial that was running when the tune was cut short is failed,
its job stopped, and a new trial takes its place. At the end:
`best.yaml` (the base config with the best trial's parameters, ready for `drover
run`), `history.png` and `importance.png` (Optuna's plots), and the env steps every
trial took, together.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.config import ConfigError
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import TERMINAL_PHASES, EvalSummary, JobStatus, parse
from common.settings import SettingsError, read_token
from drover.local import LocalCluster, new_run_dir
from drover.say import add_open, console, error, show_dashboard
from jobconfig import load_config
from jobconfig.sweep import Axis, Point, member_config
from jobconfig.tuning import Tuning, plan_tuning
from services.coordinator.client import CoordinatorClient

#: How often each running trial's job is looked at.
POLL_S = 1.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser("tune", help="tune a config's parameters: an Optuna study of jobs")
    tune.add_argument("config", help="a job config with a tune: section (.yaml, .json)")
    tune.add_argument("--collectors", type=int, default=2, help="collector processes (2)")
    tune.add_argument("--learners", type=int, default=None, help="learners (tune.n_parallel)")
    tune.add_argument("--runs-dir", default="runs", help="where run folders go (runs/)")
    tune.add_argument("--resume", type=Path, help="go on with the study of this run folder")
    tune.add_argument("--timeout-s", type=float, default=6 * 3600.0, help="stop after this long")
    tune.add_argument(
        "--url", help="run the trials on the coordinator at this URL instead of a local cluster"
    )
    add_open(tune)


def run(args: argparse.Namespace) -> int:
    try:
        raw, _ = load_config(args.config, allow_unknown_keys=args.allow_unknown_keys)
        tuning, base = plan_tuning(raw)
    except ConfigError as exc:
        return error(f"{args.config}: {exc}")
    name = str(base.get("exp_name") or "tune")
    if args.resume is not None:
        run_dir = args.resume
        if not run_dir.is_dir():
            return error(f"--resume {run_dir}: no such run folder")
    else:
        run_dir = new_run_dir(args.runs_dir, name)
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = tuning.storage or f"sqlite:///{run_dir.resolve() / 'study.db'}"
    study = open_study(tuning, name, storage)
    console.print(f"drover: study [bold]{name}[/] in {storage}", highlight=False)
    started = time.monotonic()
    if args.url:
        try:
            client = CoordinatorClient(args.url, read_token())
        except SettingsError as exc:
            return error(str(exc))
        tuner = Tuner(client, study, tuning, base, name)
        tuner.run(started + args.timeout_s)
    else:
        learners = args.learners or tuning.n_parallel
        with LocalCluster(
            run_dir, num_collectors=args.collectors, num_learners=learners, fork_server=True
        ) as cluster:
            show_dashboard(cluster, args.open)
            cluster.wait_for_workers()
            tuner = Tuner(cluster.client, study, tuning, base, name)
            tuner.run(started + args.timeout_s)
    return finish(study, tuning, base, run_dir, tuner)


def open_study(tuning: Tuning, name: str, storage: str) -> Any:
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
        client: CoordinatorClient,
        study: Any,
        tuning: Tuning,
        base: dict[str, Any],
        name: str,
        *,
        poll_s: float = POLL_S,
        say: Callable[[str], None] = lambda line: console.print(f"drover: {line}"),
    ) -> None:
        self.client = client
        self.study = study
        self.tuning = tuning
        self.base = base
        self.name = name
        self.poll_s = poll_s
        self.say = say
        self.running: dict[str, Watched] = {}

    def run(self, deadline: float) -> None:
        self._fail_cut_short()
        while True:
            while len(self.running) < self.tuning.n_parallel and self._to_start() > 0:
                self._start()
            if not self.running:
                return
            for watched in list(self.running.values()):
                if self._follow(watched):
                    del self.running[watched.job_id]
            if time.monotonic() > deadline:
                self.say("out of time: stopping the running trials")
                for watched in list(self.running.values()):
                    self._stop(watched.job_id)
                    self.study.tell(watched.trial, state=trial_state("FAIL"))
                return
            time.sleep(self.poll_s)

    def _to_start(self) -> int:
        """Trials still to start: `n_trials` complete, pruned or running in all, unless
        as many have failed already."""
        trials = self.study.get_trials(deepcopy=False)
        failed = sum(t.state == trial_state("FAIL") for t in trials)
        if failed >= self.tuning.n_trials:
            return 0
        return self.tuning.n_trials - (len(trials) - failed)

    def _fail_cut_short(self) -> None:
        """Trials a tune cut short left running: failed, their jobs stopped."""
        for frozen in self.study.get_trials(deepcopy=False, states=(trial_state("RUNNING"),)):
            job_id = frozen.user_attrs.get("job_id")
            if job_id:
                self._stop(job_id)
            self.study.tell(frozen.number, state=trial_state("FAIL"))
            self.say(f"trial {frozen.number}: cut short before; failed (its job stopped)")

    def _start(self) -> None:
        trial = self.study.ask()
        values = {axis.key: suggest(trial, axis) for axis in self.tuning.params}
        config = member_config(self.base, Point(values, self.tuning.seed))
        try:
            created = self.client.submit_job(config, name=f"{self.name} trial {trial.number}")
        except ApiError as exc:  # a value the coordinator refuses: this trial's fault
            self.study.tell(trial, state=trial_state("FAIL"))
            self.say(f"trial {trial.number}: refused ({exc.message})")
            return
        trial.set_user_attr("job_id", created.job_id)
        self.running[created.job_id] = Watched(trial, created.job_id)
        shown = Point(values, self.tuning.seed).label()
        self.say(f"trial {trial.number}: job {created.job_id} ({shown})")

    def _follow(self, watched: Watched) -> bool:
        """Report its new evaluations; prune it or score it. True once it is over."""
        status = self._status(watched.job_id)
        if status is None:
            return False  # the coordinator did not answer: look again later
        evals = self._evals(watched.job_id)
        if evals is None:
            return False  # its evaluations could not be read: look again later
        trial = watched.trial
        for summary in evals[watched.reported :]:
            trial.report(self._intermediate(summary), step=summary.env_steps)
        watched.reported = len(evals)
        trial.set_user_attr("env_steps", status.env_steps)
        if status.phase in TERMINAL_PHASES:
            value = self.objective(status, evals)
            if value is None:
                self.study.tell(trial, state=trial_state("FAIL"))
                self.say(f"trial {trial.number}: {status.phase} ({status.reason}); failed")
            else:
                self.study.tell(trial, value)
                self.say(f"trial {trial.number}: {self.tuning.objective} {value:,.4g}")
            return True
        if evals and trial.should_prune():
            self._stop(watched.job_id)
            self.study.tell(trial, state=trial_state("PRUNED"))
            self.say(
                f"trial {trial.number}: pruned at {evals[-1].env_steps:,} env steps "
                f"(return {evals[-1].return_mean:.1f})"
            )
            return True
        return False

    def _intermediate(self, summary: EvalSummary) -> float:
        # The study's direction: a minimizing study is told minus the return.
        return -summary.return_mean if self.tuning.direction == "minimize" else summary.return_mean

    def objective(self, status: JobStatus, evals: list[EvalSummary]) -> float | None:
        """The job's score (the module's docstring), or None when its trial failed."""
        budget_ran_out = status.phase == "failed" and "reached before stop_value" in status.reason
        if status.phase not in ("succeeded",) and not budget_ran_out:
            return None
        if self.tuning.objective == "env_steps_to_stop":
            goal = status.stop_value
            reached = [e.env_steps for e in evals if goal is not None and e.return_mean >= goal]
            if reached:
                return float(min(reached))
            return float(status.max_env_step or status.env_steps)
        if not evals:
            return None
        returns = [e.return_mean for e in evals]
        return returns[-1] if self.tuning.objective == "final_return" else max(returns)

    def _status(self, job_id: str) -> JobStatus | None:
        try:
            return self.client.job(job_id)
        except ServiceUnavailable:
            return None
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _evals(self, job_id: str) -> list[EvalSummary] | None:
        """The job's evaluations by env steps; None when they cannot be read now."""
        try:
            metrics = self.client.metrics(job_id)
        except (ApiError, ServiceUnavailable):
            return None
        return sorted((parse(EvalSummary, e) for e in metrics["evals"]), key=lambda e: e.env_steps)

    def _stop(self, job_id: str) -> None:
        with contextlib.suppress(ApiError, ServiceUnavailable):
            self.client.stop_job(job_id)


def suggest(trial: Any, axis: Axis) -> Any:
    """The trial's value of a parameter: a choice of a list, or a draw of a range."""
    if axis.values is not None:
        return trial.suggest_categorical(axis.key, list(axis.values))
    log = axis.kind == "log_uniform"
    if axis.integer:
        return trial.suggest_int(axis.key, int(axis.low), int(axis.high), log=log)
    return trial.suggest_float(axis.key, axis.low, axis.high, log=log)


def trial_state(name: str) -> Any:
    import optuna

    return getattr(optuna.trial.TrialState, name)


def finish(study: Any, tuning: Tuning, base: dict[str, Any], run_dir: Path, tuner: Tuner) -> int:
    """The best trial's config, Optuna's plots, and what the trials took."""
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == trial_state("COMPLETE")]
    pruned = sum(t.state == trial_state("PRUNED") for t in trials)
    env_steps = sum(int(t.user_attrs.get("env_steps", 0)) for t in trials)
    console.print(
        f"drover: {len(trials)} trials: {len(done)} complete, {pruned} pruned, "
        f"{len(trials) - len(done) - pruned} failed; {env_steps:,} env steps in all",
        highlight=False,
    )
    if not done:
        return error("no trial completed: no best config")
    best = study.best_trial
    config = member_config(base, Point(best.params, tuning.seed))
    config["exp_name"] = f"{base.get('exp_name', 'tuned')}_best"
    out = run_dir / "best.yaml"
    out.write_text(
        f"# The best of {len(trials)} trials ({tuning.objective} {best.value:,.4g}): "
        f"trial {best.number}, job {best.user_attrs.get('job_id')}.\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    console.print(f"drover: best trial {best.number}: {best.params}", highlight=False)
    console.print(f"        config: {out}", highlight=False)
    plots(study, run_dir)
    return 0


def plots(study: Any, run_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        for name, draw in (
            ("history.png", vis.plot_optimization_history),
            ("importance.png", vis.plot_param_importances),
        ):
            try:
                ax = draw(study)
            except (ValueError, RuntimeError) as exc:  # e.g. too few trials to rank params
                console.print(f"drover: no {name}: {exc}", highlight=False)
                continue
            ax.figure.set_size_inches(8, 5)
            ax.figure.tight_layout()
            ax.figure.savefig(run_dir / name, dpi=100)
            plt.close(ax.figure)
    console.print(f"        plots:  {run_dir}/history.png, importance.png", highlight=False)
