"""`drover tune`: a tuning experiment, an Optuna study whose trials are drover jobs (the
`tune:` section: jobconfig/tuning.py), run by the coordinator as its other experiments
are (services/coordinator/tuning.py): on the Experiments page, in `drover experiment`,
and on after a coordinator restart. This command submits it, shows its trials as they
come, and at its end writes the best trial's config and Optuna's plots.

    drover tune examples/tuning/cartpole_ppo.yaml            # a local cluster, to the end
    drover tune FILE --url http://coordinator:8000           # a running coordinator's workers
    drover tune FILE --resume runs/cartpole_ppo_tune-...     # a local tuning cut short, on

At the end: `best.yaml` (the base config with the best trial's parameters, ready for
`drover run`), `history.png` and `importance.png` (Optuna's plots, where the study's
file is reachable: a local cluster's), and the env steps every trial took, together.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

from common.config import ConfigError
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import ExperimentMember, ExperimentStatus
from common.settings import SettingsError, read_token
from drover.local import LocalCluster, new_run_dir
from drover.say import add_open, console, error, show_dashboard
from drover.sweep import watch
from jobconfig import load_config
from jobconfig.experiment import plan_experiment
from jobconfig.sweep import Point, member_config
from jobconfig.tuning import Tuning
from services.coordinator.client import CoordinatorClient

#: Where a local tuning's run folder names its experiment (for --resume).
EXPERIMENT_FILE = "tune.json"


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
        plan = plan_experiment(raw)
    except ConfigError as exc:
        return error(f"{args.config}: {exc}")
    if plan.tuning is None:
        return error(f"{args.config}: a tuning needs a tune: section (drover sweep runs sweeps)")
    tuning, base = plan.tuning, plan.base
    name = str(base.get("exp_name") or "tune")
    started = time.monotonic()
    if args.url:
        try:
            client = CoordinatorClient(args.url, read_token())
            experiment_id = client.submit_experiment(raw, name=name).experiment_id
        except SettingsError as exc:
            return error(str(exc))
        except ApiError as exc:
            return error(f"the coordinator refused the tuning: {exc.message}")
        except ServiceUnavailable as exc:
            return error(f"no coordinator at {args.url}: {exc}")
        console.print(f"drover: experiment [bold]{experiment_id}[/]", highlight=False)
        status = watch(client, experiment_id, started, args.timeout_s)
        return finish(status, tuning, base, Path("."), None)
    if args.resume is not None and not (args.resume / EXPERIMENT_FILE).is_file():
        return error(f"--resume {args.resume}: no tuning's run folder")
    run_dir = args.resume or new_run_dir(args.runs_dir, name)
    learners = args.learners or tuning.n_parallel
    cluster = LocalCluster(
        run_dir, num_collectors=args.collectors, num_learners=learners, fork_server=True
    )
    console.print(f"drover: run folder [bold]{run_dir}[/]", highlight=False)
    status = None
    try:
        cluster.start()  # a resumed one's coordinator goes on with the tuning it finds
        show_dashboard(cluster, args.open)
        if args.resume is not None:
            experiment_id = json.loads((run_dir / EXPERIMENT_FILE).read_text())["experiment_id"]
        else:
            try:
                experiment_id = cluster.client.submit_experiment(raw, name=name).experiment_id
            except ApiError as exc:
                return error(f"the coordinator refused the tuning: {exc.message}")
            (run_dir / EXPERIMENT_FILE).write_text(json.dumps({"experiment_id": experiment_id}))
        console.print(f"drover: experiment [bold]{experiment_id}[/]", highlight=False)
        status = watch(cluster.client, experiment_id, started, args.timeout_s)
    except KeyboardInterrupt:
        console.print("\ndrover: interrupted; the tuning goes on with --resume")
    finally:
        cluster.stop()
    if status is None:
        return 1
    study = cluster.shared_dir / "experiments" / experiment_id / "study.db"
    return finish(status, tuning, base, run_dir, study if study.is_file() else None)


def best_member(status: ExperimentStatus, tuning: Tuning) -> ExperimentMember | None:
    """The complete trial with the best objective (None: none completed)."""
    done = [m for m in status.members if m.trial_state == "complete" and m.objective is not None]
    if not done:
        return None
    sign = -1.0 if tuning.direction == "minimize" else 1.0
    return max(done, key=lambda m: sign * float(m.objective or 0.0))


def finish(
    status: ExperimentStatus,
    tuning: Tuning,
    base: dict[str, Any],
    run_dir: Path,
    study_file: Path | None,
) -> int:
    """The best trial's config, Optuna's plots, and what the trials took."""
    states = [m.trial_state for m in status.members]
    env_steps = sum(m.env_steps for m in status.members)
    console.print(
        f"drover: {len(states)} trials: {states.count('complete')} complete, "
        f"{states.count('pruned')} pruned, {states.count('failed')} failed; "
        f"{env_steps:,} env steps in all",
        highlight=False,
    )
    best = best_member(status, tuning)
    if best is None:
        return error("no trial completed: no best config")
    config = member_config(base, Point(best.values, tuning.seed))
    config["exp_name"] = f"{base.get('exp_name', 'tuned')}_best"
    out = run_dir / "best.yaml"
    out.write_text(
        f"# The best of {len(states)} trials ({tuning.objective} {best.objective:,.4g}): "
        f"trial {best.trial}, job {best.job_id}.\n" + yaml.safe_dump(config, sort_keys=False)
    )
    console.print(f"drover: best trial {best.trial}: {best.values}", highlight=False)
    console.print(f"        config: {out}", highlight=False)
    if study_file is not None:
        import optuna

        study = optuna.load_study(
            study_name=status.experiment_id, storage=f"sqlite:///{study_file.resolve()}"
        )
        plots(study, run_dir)
    return 0 if status.phase == "ended" else 1


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
