"""The `drover` command.

drover run CONFIG            train locally: coordinator, collectors, learner
                             (--learner-ranks N: the learner is a group of N ranks;
                             --backend docker: as containers, through a Docker engine)
drover coordinator           serve one coordinator (what compose/Kubernetes run)
drover collector | learner   serve one slave (drover learner --nproc N: a learner group)
drover jobs | status JOB | stop JOB | workers | logs ROLE
                             look at a running cluster (drover/verbs.py)
drover plot RUN [RUN ...]    evaluation return vs env steps, as a PNG (drover/plot.py)
drover sweep CONFIG          an experiment: the jobs of a config's sweep section
                             (drover/sweep.py); drover experiment ID, stop ID
drover report RUN            each config over its seeds, with confidence intervals
                             (drover/report.py)
drover tune CONFIG           an Optuna study whose trials are jobs (drover/tune.py)
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from typing import NoReturn

import yaml
from rich.live import Live
from rich.table import Table

from common.config import ConfigError, JobConfig, to_dict
from common.env_guard import setup_env_registry
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import TERMINAL_PHASES, JobStatus, LeagueView
from common.process import Terminated, exit_without_teardown, stop_on_terminate
from common.settings import SettingsError, coordinator_url, read_token
from drover import enjoy, export, plot, report, sweep, tune, verbs
from drover.devices import fit_local_device, local_learner_ranks
from drover.docker_backend import DockerUnavailable, run_in_docker
from drover.forkserver import ForkServer
from drover.local import LocalCluster, new_run_dir, torchrun_args
from drover.say import add_open, console, error, show_dashboard
from drover.tables import league_line
from jobconfig import fit_to_env, load_config, resolve_job_config
from services.coordinator.client import CoordinatorClient
from services.coordinator.workflows import check_workflow


def main(argv: list[str] | None = None, fork_server: ForkServer | None = None) -> int:
    """`fork_server`: one `drover run` started before its imports (drover/__main__.py);
    stopped here unless the run uses it."""
    try:
        return _main(argv, fork_server)
    finally:
        if fork_server is not None:
            fork_server.discard()  # a no-op once the run's cluster has closed it


def _main(argv: list[str] | None, fork_server: ForkServer | None) -> int:
    parser = argparse.ArgumentParser(prog="drover", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a job locally, end to end")
    run.add_argument("config", help="job config: .yaml, .yml, .json or .py (main_config)")
    run.add_argument("--collectors", type=int, default=2, help="collector processes (2)")
    run.add_argument("--runs-dir", default="runs", help="where run folders go (runs/)")
    run.add_argument(
        "--timeout-s", type=float, default=3600.0, help="stop the job after this long (3600)"
    )
    run.add_argument(
        "--cpu-fallback",
        action="store_true",
        help="a job on CUDA (policy.cuda, policy.device) on a machine without CUDA: "
        "warn and run it on CPU instead of stopping",
    )
    run.add_argument(
        "--backend",
        choices=["local", "docker"],
        default="local",
        help="local: processes on this machine (default); docker: containers of the "
        "drover:latest image on one network and volume, through a Docker engine",
    )
    run.add_argument(
        "--learner-ranks",
        type=int,
        default=None,
        help="train on a learner group of N ranks started by torchrun (default: one "
        "per CUDA device for a policy.learn.multi_gpu job on CUDA, else 1)",
    )
    add_open(run)
    submit = sub.add_parser("submit", help="submit a job to a running coordinator")
    submit.add_argument("config", help="job config: .yaml, .yml, .json or .py (main_config)")
    submit.add_argument(
        "--coordinator",
        default=coordinator_url(),
        help="coordinator URL (DROVER_COORDINATOR_URL; http://127.0.0.1:8000)",
    )
    submit.add_argument("--wait", action="store_true", help="wait for the job to end")
    submit.add_argument(
        "--connect-timeout-s",
        type=float,
        default=120.0,
        help="how long to wait for the coordinator to answer, at the start and, with "
        "--wait, whenever it stops answering (120)",
    )
    verbs.add_verbs(sub)
    plot.add_parser(sub)
    sweep.add_parser(sub)
    report.add_parser(sub)
    export.add_parser(sub)
    enjoy.add_parser(sub)
    tune.add_parser(sub)
    show = sub.add_parser("config", help="print a job config resolved; starts nothing")
    show.add_argument("action", choices=["show"], help="show: the resolved config")
    show.add_argument("config", help="job config: .yaml, .yml, .json or .py (DI-engine's)")
    for reads_a_config in (run, submit, show, *(sub.choices[v] for v in ("sweep", "tune"))):
        add_allow_unknown_keys(reads_a_config)
    roles = {
        role: sub.add_parser(role, help=f"serve one {role} (settings from DROVER_* variables)")
        for role in ("coordinator", "collector", "learner")
    }
    roles["learner"].add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks of a learner group on this machine, started by torchrun (1)",
    )
    roles["learner"].add_argument(
        "--max-restarts",
        type=int,
        default=10,
        help="with --nproc above 1: times torchrun restarts a group whose rank died or hung (10)",
    )
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_local(args, fork_server)
    if args.command == "config":
        return show_config(args)
    if args.command == "submit":
        return submit_job(args)
    if args.command in verbs.NAMES:
        return verbs.run(args)
    if args.command == "plot":
        return plot.run(args)
    if args.command == "sweep":
        return sweep.run(args)
    if args.command == "report":
        return report.run(args)
    if args.command == "export":
        return export.run(args)
    if args.command == "enjoy":
        return enjoy.run(args)
    if args.command == "tune":
        return tune.run(args)
    if args.command == "learner" and args.nproc != 1:
        return serve_learner_group(args.nproc, args.max_restarts)
    sys.argv = [f"drover {args.command}"]
    runpy.run_module(f"services.{args.command}", run_name="__main__")
    return 0


def serve_learner_group(nproc: int, max_restarts: int) -> int:
    """`drover learner --nproc N`: torchrun with N ranks of `services.learner` on this
    machine (for several machines, run torchrun with its rendezvous flags instead)."""
    if nproc < 1:
        return error("--nproc must be at least 1")
    if max_restarts < 0:
        return error("--max-restarts must be 0 or more")
    argv = [sys.executable, "-m", "torch.distributed.run"]
    argv += [*torchrun_args(nproc, max_restarts), "-m", "services.learner"]
    os.execv(sys.executable, argv)  # torchrun takes over this process (and its signals)


def add_allow_unknown_keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-unknown-keys",
        action="store_true",
        help="an unknown key in the config is a warning, not an error (strict: false; "
        "a DI-engine .py file's always are)",
    )


def print_notes(notes: list[str], warnings: list[str]) -> None:
    """What was translated from DI-engine's keys, and what is ignored."""
    for note in notes:
        console.print(f"[cyan]translated:[/] {note}", highlight=False)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def check_here(config: JobConfig) -> JobConfig:
    """What the coordinator checks at submission that needs no cluster: the workflow,
    and the env's spaces against the algorithm (so a refused job starts nothing)."""
    check_workflow(config)
    setup_env_registry()  # the services register the same envs when they start
    return fit_to_env(config)


def show_config(args: argparse.Namespace) -> int:
    """The config as a job would run it, the DI-engine keys translated and the keys
    ignored, without starting anything."""
    try:
        raw, notes = load_config(args.config, allow_unknown_keys=args.allow_unknown_keys)
        config, warnings = resolve_job_config(raw)
        config = check_here(config)
    except ConfigError as exc:
        return error(f"{args.config}: {exc}")
    print_notes(notes, warnings)
    # The config on stdout (to pipe or save), the notes on stderr.
    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
    return 0


def run_local(args: argparse.Namespace, fork_server: ForkServer | None = None) -> int:
    started = time.monotonic()
    if args.collectors < 1:
        return error("--collectors must be at least 1")
    if args.learner_ranks is not None and args.learner_ranks < 1:
        return error("--learner-ranks must be at least 1")
    try:
        raw, notes = load_config(args.config, allow_unknown_keys=args.allow_unknown_keys)
        config, warnings = resolve_job_config(raw)
        check_here(config)
        local = fit_local_device(raw, config, cpu_fallback=args.cpu_fallback)
        raw, config, warnings = local.raw, local.config, warnings + local.warnings
        ranks, notes_on_ranks = local_learner_ranks(config, args.learner_ranks)
        warnings += notes_on_ranks
    except ConfigError as exc:
        return error(f"{args.config}: {exc}")
    print_notes(notes, warnings)
    if args.backend == "docker":
        return run_docker(args, raw, config.exp_name, ranks, started)
    cluster = LocalCluster(
        new_run_dir(args.runs_dir, config.exp_name),
        num_collectors=args.collectors,
        learner_ranks=ranks,
        fork_server=True,
        started_fork_server=fork_server,
    )
    if ranks > 1:
        console.print(f"drover: the learner is a group of {ranks} ranks (torchrun)")
    console.print(f"drover: run folder [bold]{cluster.run_dir}[/]", highlight=False)
    console.print(f"drover: tensorboard --logdir {args.runs_dir}", highlight=False, markup=False)
    status: JobStatus | None = None
    try:
        cluster.start()
        show_dashboard(cluster, args.open)
        try:
            created = cluster.client.submit_job(raw, name=config.exp_name)
        except ApiError as exc:
            return error(f"the coordinator refused the job: {exc.message}")
        console.print(f"drover: job [bold]{created.job_id}[/] submitted", highlight=False)
        status = watch(cluster, created.job_id, started, args.timeout_s)
    except KeyboardInterrupt as exc:
        how = exc.args[0] if isinstance(exc, Terminated) else "interrupted"
        console.print(f"\ndrover: {how}; stopping the job and every service", highlight=False)
        status = stop_job(cluster, status)
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[bold red]drover:[/] {exc}")
    finally:
        cluster.stop()
    return summarize(cluster, status, time.monotonic() - started)


def run_docker(args: argparse.Namespace, raw: dict, name: str, ranks: int, started: float) -> int:
    """`drover run --backend docker`: the same job on containers (drover/docker_backend.py)."""
    try:
        status = run_in_docker(
            raw,
            name,
            collectors=args.collectors,
            learner_ranks=ranks,
            timeout_s=args.timeout_s,
            say=lambda line: console.print(f"drover: {line}", highlight=False),
        )
    except DockerUnavailable as exc:
        return error(f"--backend docker: {exc}")
    except TimeoutError as exc:
        return error(str(exc))
    color = "green" if status.phase == "succeeded" else "red"
    console.print(
        f"drover: job {status.job_id} [bold {color}]{status.phase}[/]: {status.reason} "
        f"({time.monotonic() - started:.1f}s)",
        highlight=False,
    )
    return 0 if status.phase == "succeeded" else 1


def submit_job(args: argparse.Namespace) -> int:
    """Submit to a running coordinator (what compose's `submit` service does)."""
    try:
        raw, notes = load_config(args.config, allow_unknown_keys=args.allow_unknown_keys)
        config, warnings = resolve_job_config(raw)
        check_workflow(config)
        token = read_token()
    except (ConfigError, SettingsError) as exc:
        return error(str(exc))
    print_notes(notes, warnings)
    client = CoordinatorClient(args.coordinator, token)
    deadline = time.monotonic() + args.connect_timeout_s
    while True:
        try:
            created = client.submit_job(raw, name=config.exp_name)
            break
        except ApiError as exc:
            return error(f"the coordinator refused the job: {exc.message}")
        except ServiceUnavailable as exc:
            if time.monotonic() > deadline:
                return error(f"no coordinator at {args.coordinator}: {exc}")
            time.sleep(1.0)
    print(created.job_id, flush=True)
    if not args.wait:
        return 0
    try:
        # A coordinator restarting mid-job (compose's restart policy) is waited out.
        status = client.wait_for_end(created.job_id, outage_s=args.connect_timeout_s)
    except ServiceUnavailable as exc:
        return error(f"the coordinator stopped answering: {exc}")
    console.print(f"job {status.job_id} {status.phase}: {status.reason}", highlight=False)
    return 0 if status.phase == "succeeded" else 1


#: How long each status request of `drover run` waits for its job's end: the end (and
#: so the whole command's) is seen as it comes, and the table is redrawn at least this
#: often. A request the coordinator answers at once (too many waiting) is followed by
#: the next no sooner than STATUS_POLL_S.
STATUS_WAIT_S = 0.25
STATUS_POLL_S = 0.1
#: How often the table's rates are refreshed (the collectors' rates ask for every
#: worker); a rate over a shorter window would only jitter.
RATES_PERIOD_S = 0.5


def watch(cluster: LocalCluster, job_id: str, started: float, timeout_s: float) -> JobStatus:
    """Show progress until the job ends; returns its final status."""
    last: tuple[float, JobStatus] | None = None
    rate = 0.0
    rates: dict[str, float] = {}
    # A self-play job's league, shown under the table (None: not asked yet / none).
    league: LeagueView | None = None
    has_league: bool | None = None
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            asked = time.monotonic()
            try:
                status = cluster.client.job(job_id, wait_s=STATUS_WAIT_S)
            except ServiceUnavailable:
                # The coordinator is down: restart it, and show the last status meanwhile.
                for event in cluster.supervise():
                    live.console.print(f"[yellow]drover:[/] {event}", highlight=False)
                time.sleep(0.5)
                continue
            now = time.monotonic()
            if last is None or now - last[0] >= RATES_PERIOD_S:
                if last is not None:
                    rate = (status.env_steps - last[1].env_steps) / (now - last[0])
                last = (now, status)
                rates = collector_rates(cluster.client)
                if has_league is not False:
                    league = league_or_none(cluster.client, job_id)
                    has_league = league is not None
            live.update(progress_table(status, now - started, rate, rates, league))
            if status.phase in TERMINAL_PHASES:
                return status
            for event in cluster.supervise():
                live.console.print(f"[yellow]drover:[/] {event}", highlight=False)
            if now - started > timeout_s:
                cluster.client.stop_job(job_id)
            time.sleep(max(0.0, STATUS_POLL_S - (time.monotonic() - asked)))


def collector_rates(client: CoordinatorClient) -> dict[str, float]:
    """Env steps/s of each collector's collect task, from the workers' heartbeats."""
    rates = {}
    for worker in client.workers():
        for task_id, progress in worker.progress.items():
            if task_id.startswith("collect-") and "env_steps_per_s" in progress:
                rates[worker.worker_id] = progress["env_steps_per_s"]
    return rates


def league_or_none(client: CoordinatorClient, job_id: str) -> LeagueView | None:
    """The job's league, or None when it has none (not a self-play job)."""
    try:
        return client.league(job_id)
    except (ApiError, ServiceUnavailable):
        return None


def progress_table(
    status: JobStatus,
    elapsed_s: float,
    env_rate: float,
    rates: dict[str, float],
    league: LeagueView | None = None,
) -> Table:
    table = Table(title=f"{status.name} · {status.algo} on {status.env_id}", min_width=60)
    table.add_column("phase")
    table.add_column("env steps", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("train iters", justify="right")
    table.add_column("policy", justify="right")
    table.add_column("last eval", justify="right")
    table.add_column("elapsed", justify="right")
    last_eval = (
        f"{status.last_eval.return_mean:.1f} (v{status.last_eval.policy_version})"
        if status.last_eval
        else "-"
    )
    table.add_row(
        status.phase,
        f"{status.env_steps:,}",
        f"{env_rate:,.0f}",
        f"{status.train_iters:,}",
        f"v{status.policy_version}",
        last_eval,
        f"{elapsed_s:.1f}s",
    )
    captions = []
    if status.storage_full_s is not None:
        captions.append(
            f"[bold red]the shared volume is full[/]: writes have waited "
            f"{status.storage_full_s:.0f} s for room (the job fails at system.storage_grace_s)"
        )
    if rates:
        per = ", ".join(f"{k}: {v:,.0f}/s" for k, v in sorted(rates.items()))
        captions.append(f"collectors {per}")
    for learner in status.learners:
        if learner.world_size > 1 and learner.rank_samples_per_s:
            per = ", ".join(f"{rate:,.0f}" for rate in learner.rank_samples_per_s)
            captions.append(
                f"learner group of {learner.world_size} ranks: {per} samples/s per rank"
            )
    if league is not None:
        captions.append(league_line(league))
    table.caption = "\n".join(captions) or None
    return table


def stop_job(cluster: LocalCluster, status: JobStatus | None) -> JobStatus | None:
    try:
        jobs = cluster.client.list_jobs()
        for job in jobs:
            if job.phase not in TERMINAL_PHASES:
                cluster.client.stop_job(job.job_id)
        return cluster.client.job(jobs[0].job_id) if jobs else status
    except (ApiError, ServiceUnavailable):
        return status


def summarize(cluster: LocalCluster, status: JobStatus | None, wall_s: float) -> int:
    console.line()  # past the live table's last line
    if status is None:
        console.print(f"drover: no job result; logs are in {cluster.log_dir}")
        return 1
    color = "green" if status.phase == "succeeded" else "red"
    console.print(
        f"drover: job {status.job_id} [bold {color}]{status.phase}[/]: {status.reason}",
        highlight=False,
    )
    best = (
        f", best eval return {status.best_eval_return:.1f} (policy v{status.best_policy_version})"
        if status.best_eval_return is not None
        else ""
    )
    console.print(
        f"        {status.env_steps:,} env steps, {status.train_iters:,} train iterations"
        f"{best}, {wall_s:.1f}s",
        highlight=False,
    )
    job_dir = cluster.run_dir / status.job_id
    kept = [p.name + ("/" if p.is_dir() else "") for p in sorted(job_dir.iterdir())]
    kept = [k for k in kept if k not in ("segments/", "coordinator/", "job.json")]
    console.print(f"        results: {job_dir} ({', '.join(kept)})", highlight=False)
    console.print(f"        logs:    {cluster.log_dir}")
    return 0 if status.phase == "succeeded" else 1


def console_main(fork_server: ForkServer | None = None) -> NoReturn:
    """The `drover` command (from drover/__main__.py): `main`, then the process ends
    without the interpreter's teardown, a quarter of a second after `drover run`
    (bench/whole_run.py) that only frees what the process is about to give back
    anyway."""
    stop_on_terminate()
    exit_without_teardown(main(fork_server=fork_server))


if __name__ == "__main__":
    console_main()
