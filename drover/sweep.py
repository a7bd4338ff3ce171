"""`drover sweep`: an experiment, the jobs of a config's `sweep:` section
(jobconfig/sweep.py), checked whole before anything starts.

    drover sweep examples/cartpole_dqn_sweep.yaml             # a local cluster, to the end
    drover sweep FILE --url http://coordinator:8000 [--wait]  # a running coordinator's

Locally, it starts a coordinator, collectors and a learner as `drover run` does,
submits the experiment, shows each job's point, phase and last evaluation until every
job has ended, and says where the run folder is (`drover report` reads it).
"""

from __future__ import annotations

import argparse
import time

from rich.live import Live

from common.config import ConfigError
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import ExperimentStatus
from common.settings import SettingsError, read_token
from drover.local import LocalCluster, new_run_dir
from drover.say import add_open, console, error, show_dashboard
from drover.tables import experiment_table
from jobconfig import load_config
from jobconfig.experiment import plan_experiment
from services.coordinator.client import CoordinatorClient

#: How often the table is redrawn (one request for the experiment each time).
POLL_S = 1.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="run an experiment: the jobs of a config's sweep section")
    sweep.add_argument("config", help="a job config with a sweep: section (.yaml, .json)")
    sweep.add_argument("--collectors", type=int, default=2, help="collector processes (2)")
    sweep.add_argument(
        "--learners", type=int, default=1, help="learner processes (1; a population: one a member)"
    )
    sweep.add_argument("--runs-dir", default="runs", help="where run folders go (runs/)")
    sweep.add_argument(
        "--timeout-s", type=float, default=3 * 3600.0, help="stop the experiment after this long"
    )
    sweep.add_argument(
        "--url",
        help="submit to the coordinator at this URL (the cluster token from DROVER_TOKEN) "
        "instead of a local cluster",
    )
    sweep.add_argument("--wait", action="store_true", help="with --url: wait for every job")
    add_open(sweep)


def run(args: argparse.Namespace) -> int:
    try:
        raw, _ = load_config(args.config, allow_unknown_keys=args.allow_unknown_keys)
        plan = plan_experiment(raw)
    except ConfigError as exc:
        return error(f"{args.config}: {exc}")
    if plan.sweep is None:
        return error(f"{args.config}: a tuning: drover tune runs it")
    sweep, jobs = plan.sweep, plan.points
    console.print(
        f"drover: {len(jobs)} jobs ({len(jobs) // len(sweep.seeds)} points x "
        f"{len(sweep.seeds)} seeds)" + (f", {sweep.parallel} at a time" if sweep.parallel else ""),
        highlight=False,
    )
    if args.url:
        return submit_remote(args, raw)
    if args.collectors < 1 or args.learners < 1:
        return error("--collectors and --learners must be at least 1")
    name = raw.get("exp_name", "sweep")
    cluster = LocalCluster(
        new_run_dir(args.runs_dir, name),
        num_collectors=args.collectors,
        num_learners=args.learners,
        fork_server=True,
    )
    console.print(f"drover: run folder [bold]{cluster.run_dir}[/]", highlight=False)
    status: ExperimentStatus | None = None
    started = time.monotonic()
    try:
        cluster.start()
        show_dashboard(cluster, args.open)
        try:
            created = cluster.client.submit_experiment(raw, name=name)
        except ApiError as exc:
            return error(f"the coordinator refused the experiment: {exc.message}")
        console.print(f"drover: experiment [bold]{created.experiment_id}[/]", highlight=False)
        status = watch(cluster.client, created.experiment_id, started, args.timeout_s)
    except KeyboardInterrupt:
        console.print("\ndrover: interrupted; stopping the experiment and every service")
        if status is not None:
            status = stop(cluster.client, status.experiment_id) or status
    finally:
        cluster.stop()
    if status is None:
        return 1
    ended = [m for m in status.members if m.phase == "succeeded"]
    console.print(
        f"drover: experiment {status.experiment_id} {status.phase}: {len(ended)} of "
        f"{len(status.members)} jobs succeeded ({time.monotonic() - started:.0f}s)",
        highlight=False,
    )
    console.print(f"        report: drover report {cluster.run_dir}", highlight=False)
    return 0 if status.phase == "ended" else 1


def submit_remote(args: argparse.Namespace, raw: dict) -> int:
    try:
        token = read_token()
    except SettingsError as exc:
        return error(str(exc))
    client = CoordinatorClient(args.url, token)
    try:
        created = client.submit_experiment(raw, name=raw.get("exp_name"))
    except ApiError as exc:
        return error(f"the coordinator refused the experiment: {exc.message}")
    except ServiceUnavailable as exc:
        return error(f"no coordinator at {args.url}: {exc}")
    print(created.experiment_id, flush=True)
    if not args.wait:
        return 0
    status = watch(client, created.experiment_id, time.monotonic(), args.timeout_s)
    return 0 if status.phase == "ended" else 1


def watch(
    client: CoordinatorClient, experiment_id: str, started: float, timeout_s: float
) -> ExperimentStatus:
    """Show the experiment until none of its jobs runs; returns its last status."""
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while True:
            try:
                status = client.experiment(experiment_id)
            except ServiceUnavailable:
                time.sleep(POLL_S)
                continue
            live.update(experiment_table(status, time.monotonic() - started))
            if status.phase != "running":
                return status
            if time.monotonic() - started > timeout_s:
                status = stop(client, experiment_id) or status
            time.sleep(POLL_S)


def stop(client: CoordinatorClient, experiment_id: str) -> ExperimentStatus | None:
    try:
        return client.stop_experiment(experiment_id)
    except (ApiError, ServiceUnavailable):
        return None
