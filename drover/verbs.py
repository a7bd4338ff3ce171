"""`drover jobs | status | stop | workers | logs`: look at a running cluster.

drover jobs                  the coordinator's jobs, a row each: priority, share, the
                             collectors and learner each holds of those it is owed,
                             and why a job waits
drover status JOB            one job: phase, progress, evaluations, learners, shares,
                             buffer
drover stop JOB              stop a job; prints the phase it ended in
drover workers               the registered collectors and learners, and their tasks
drover logs ROLE             the last lines of a local run's logs (`drover run`'s
                             runs/<run>/logs/<role>-N.log); --follow keeps reading

The first four ask the coordinator at `--url` (DROVER_COORDINATOR_URL) with the
cluster token (DROVER_TOKEN or DROVER_TOKEN_FILE), as `drover submit` does; `--json`
prints the route's answer instead of a table. Exit status: 0 done, 1 the coordinator
could not be reached or refused (an unknown job), 2 a usage or configuration error
(no token, a wrong token, no such run folder or role).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import (
    ExperimentStatus,
    JobList,
    JobStatus,
    LeagueView,
    WorkerInfo,
    WorkerList,
    dump,
)
from common.settings import DEFAULT_COORDINATOR_URL, SettingsError, coordinator_url, read_token
from drover.say import console, error
from drover.tables import (
    buffer_table,
    duration,
    elapsed_s,
    experiment_table,
    league_table,
    learners_table,
    phase_text,
    progress_text,
    share_text,
    status_table,
)
from services.coordinator.client import CoordinatorClient

#: The verbs `add_verbs` adds, which `run` runs.
NAMES = frozenset({"jobs", "status", "stop", "workers", "logs", "experiment"})
ROLE_PATTERN = re.compile(r"^(coordinator|collector|learner)(-\d+)?$")
#: A log file is looked at this often while following it.
FOLLOW_POLL_S = 0.5

# Errors on stderr, one line each; tables and JSON on stdout (resolved when printing,
# so a redirected or captured stdout is the one written to).


class VerbError(Exception):
    """Ends a verb: `message` on stderr and exit status `status`."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def add_verbs(sub: argparse._SubParsersAction) -> None:
    """Add the verbs to `drover`'s subcommands; `run(args)` then runs the one chosen."""
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--url",
        "--coordinator",
        dest="url",
        default=coordinator_url(),
        help=f"coordinator URL (DROVER_COORDINATOR_URL; {DEFAULT_COORDINATOR_URL})",
    )
    remote.add_argument("--json", action="store_true", help="print the answer as JSON")
    remote.add_argument(
        "--timeout-s", type=float, default=10.0, help="how long one request may take (10)"
    )
    sub.add_parser("jobs", parents=[remote], help="list a running coordinator's jobs")
    status = sub.add_parser("status", parents=[remote], help="one job's status and buffer")
    status.add_argument("job", help="the job id (job-...)")
    stop = sub.add_parser("stop", parents=[remote], help="stop a job, or an experiment")
    stop.add_argument("job", help="the job id (job-...), or an experiment's (exp-...)")
    experiment = sub.add_parser(
        "experiment", parents=[remote], help="an experiment's jobs, points and results"
    )
    experiment.add_argument("experiment", help="the experiment id (exp-...)")
    sub.add_parser("workers", parents=[remote], help="list the registered workers")
    logs = sub.add_parser("logs", help="print the logs of a local run (`drover run`)")
    logs.add_argument(
        "role", help="coordinator, collector or learner (every one of them), or e.g. collector-0"
    )
    logs.add_argument(
        "--run-dir", help="the run folder (default: the newest folder under --runs-dir)"
    )
    logs.add_argument("--runs-dir", default="runs", help="where run folders are (runs/)")
    logs.add_argument("-n", "--lines", type=int, default=50, help="lines from each file's end (50)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument(
        "--follow-s",
        type=float,
        default=None,
        help="with --follow: stop after this many seconds (default: at Ctrl-C)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the verb `args.command` (one of NAMES); returns the exit status."""
    try:
        if args.command == "logs":
            return show_logs(args)
        with connect(args) as remote:
            return REMOTE_VERBS[args.command](remote, args)
    except VerbError as exc:
        return error(exc.message, exc.status)


# --- talking to the coordinator ---------------------------------------------------------


class Remote:
    """A coordinator client whose failures become `VerbError`s with one clear line."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        # One connection retry: an absent coordinator is reported at once.
        self.client = CoordinatorClient(url, token, timeout_s=timeout_s, connect_retries=1)

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def ask(self, call: Callable[[CoordinatorClient], Any]) -> Any:
        try:
            return call(self.client)
        except ServiceUnavailable as exc:
            why = why_unreachable(exc, self.timeout_s)
            raise VerbError(f"no coordinator at {self.url}: {why}", 1) from None
        except ApiError as exc:
            if exc.status in (401, 403):
                raise VerbError(
                    f"the coordinator at {self.url} refused the token ({exc.status} {exc.code}): "
                    "set DROVER_TOKEN or DROVER_TOKEN_FILE to the cluster token",
                    2,
                ) from None
            raise VerbError(f"{exc.message} ({exc.status} {exc.code} from {self.url})", 1) from None
        except ValueError as exc:  # not JSON, or not a drover message: not a coordinator
            raise VerbError(
                f"{self.url} did not answer as a drover coordinator: {str(exc)[:200]}", 1
            ) from None


def connect(args: argparse.Namespace) -> Remote:
    """A client for `--url` with the cluster token, read as `drover submit` reads it."""
    if args.timeout_s <= 0:
        raise VerbError("--timeout-s must be above 0", 2)
    if not re.match(r"^https?://", args.url):
        raise VerbError(f"--url {args.url}: give http://host:port or https://host:port", 2)
    try:
        token = read_token()
    except SettingsError as exc:
        raise VerbError(str(exc), 2) from None
    return Remote(args.url, token, args.timeout_s)


def why_unreachable(exc: ServiceUnavailable, timeout_s: float) -> str:
    """The root of a connection failure in a few words ("Connection refused")."""
    cause = exc.__cause__
    # A connect timeout comes wrapped (urllib3 gave up retrying): known by its words.
    if isinstance(cause, urllib3.exceptions.TimeoutError) or "timed out" in str(cause):
        return f"no answer within {timeout_s:g}s (--timeout-s)"
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(cause))
    return found.group(1).strip() if found else str(cause)[:200]


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def output() -> Console:
    """A console on stdout; not a terminal (a pipe, a file): wide, so ids never wrap."""
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


# --- jobs, status, stop -------------------------------------------------------------------


def list_jobs(remote: Remote, args: argparse.Namespace) -> int:
    jobs: list[JobStatus] = remote.ask(lambda c: c.list_jobs())
    if args.json:
        print_json(dump(JobList(jobs=jobs)))
        return 0
    if not jobs:
        console.print(f"drover: no jobs on {remote.url}", highlight=False)
        return 0
    table = Table(title=escape(f"jobs on {remote.url}"))
    for name in ("id", "name", "algo", "env", "phase"):
        table.add_column(name, no_wrap=True)
    for name in ("prio", "share", "collectors", "learner"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("env steps", "train iters", "policy", "last eval", "elapsed"):
        table.add_column(name, justify="right", no_wrap=True)
    waiting = []
    for job in sorted(jobs, key=lambda j: j.started_at):
        table.add_row(
            job.job_id,
            escape(job.name),
            escape(job.algo),
            escape(job.env_id),
            phase_text(job.phase)
            + (f" #{job.queue_position}" if job.queue_position is not None else ""),
            str(job.priority),
            f"{job.share:g}",
            share_text(job.collector_share),
            share_text(job.learner_share),
            f"{job.env_steps:,}",
            f"{job.train_iters:,}",
            f"v{job.policy_version}",
            f"{job.last_eval.return_mean:.1f}" if job.last_eval else "-",
            duration(elapsed_s(job)),
        )
        if job.phase in ("running", "queued") and job.reason:
            waiting.append(f"{job.job_id}: {job.reason}")
    # Held of owed: a job's collectors and learner now, against its fair share.
    table.caption = "collectors, learner: held of owed (its fair share now)"
    out = output()
    out.print(table)
    for line in waiting:
        out.print(escape(line), highlight=False)
    return 0


def job_status(remote: Remote, args: argparse.Namespace) -> int:
    job: JobStatus = remote.ask(lambda c: c.job(args.job))
    buffer = buffer_stats(remote, args.job)
    league = league_of(remote, args.job)
    if args.json:
        print_json({**dump(job), "buffer": buffer, "league": league and dump(league)})
        return 0
    out = output()
    out.print(f"[bold]{escape(f'{job.job_id} · {job.name} · {job.algo} on {job.env_id}')}[/]")
    out.print(status_table(job))
    if job.learners:
        out.print(learners_table(job))
    if buffer is not None:
        out.print("\n[bold]buffer[/]")
        out.print(buffer_table(buffer))
    if league is not None:
        out.print(league_table(league))
    return 0


def league_of(remote: Remote, job_id: str) -> LeagueView | None:
    """A self-play job's league, or None for a job that has none."""
    try:
        return remote.client.league(job_id)
    except (ApiError, ServiceUnavailable, ValueError):
        return None


def buffer_stats(remote: Remote, job_id: str) -> dict[str, Any] | None:
    """The job's buffer stats, or None where the coordinator has none to give."""
    try:
        return remote.client.buffer_stats(job_id)
    except (ApiError, ServiceUnavailable, ValueError):
        return None  # the job itself was read just before: its status is what matters


def stop_job(remote: Remote, args: argparse.Namespace) -> int:
    if args.job.startswith("exp-"):
        return print_experiment(remote.ask(lambda c: c.stop_experiment(args.job)), args)
    remote.ask(lambda c: c.stop_job(args.job))
    job: JobStatus = remote.ask(lambda c: c.job(args.job))
    if args.json:
        print_json(dump(job))
        return 0
    output().print(f"{job.job_id} {phase_text(job.phase)}: {escape(job.reason)}")
    return 0


# --- workers ------------------------------------------------------------------------------


def list_workers(remote: Remote, args: argparse.Namespace) -> int:
    workers: list[WorkerInfo] = remote.ask(lambda c: c.workers())
    if args.json:
        print_json(dump(WorkerList(workers=workers)))
        return 0
    if not workers:
        console.print(f"drover: no workers registered at {remote.url}", highlight=False)
        return 0
    table = Table(title=escape(f"workers of {remote.url}"))
    for name in ("id", "role", "url", "state", "tasks", "jobs", "progress"):
        table.add_column(name, no_wrap=name != "progress")
    table.add_column("heartbeat", justify="right", no_wrap=True)
    for worker in sorted(workers, key=lambda w: (w.role, w.worker_id)):
        table.add_row(
            worker.worker_id,
            worker.role,
            escape(worker.url),
            worker_state_text(worker),
            ", ".join(worker.task_ids) or "-",
            ", ".join(sorted(set(worker.jobs.values()))) or "-",
            "; ".join(progress_text(p) for p in worker.progress.values()) or "-",
            f"{worker.last_heartbeat_s:.1f}s ago",
        )
    output().print(table)
    return 0


def worker_state_text(worker: WorkerInfo) -> str:
    """Idle or busy, and held back while it is (with the tasks it lost in a row)."""
    if worker.held_back_s <= 0:
        return worker.state
    return f"{worker.state}, held back {worker.held_back_s:.0f}s ({worker.lost_tasks} lost)"


# --- logs ---------------------------------------------------------------------------------


def show_logs(args: argparse.Namespace) -> int:
    if not ROLE_PATTERN.match(args.role):
        raise VerbError(
            f"no role {args.role!r}: give coordinator, collector, learner or one of them "
            "by name (collector-0)",
            2,
        )
    if args.lines < 0:
        raise VerbError("--lines must be 0 or more", 2)
    if args.follow_s is not None and args.follow_s <= 0:
        raise VerbError("--follow-s must be above 0", 2)
    log_dir = find_run_dir(args) / "logs"
    files = role_logs(log_dir, args.role)
    several = len(files) > 1
    for i, path in enumerate(files):
        if several:
            print(f"==> {path} <==" if i == 0 else f"\n==> {path} <==")
        for line in tail_lines(path, args.lines):
            print(line)
    sys.stdout.flush()
    if args.follow:
        follow(files, args.follow_s, prefix=several)
    return 0


def find_run_dir(args: argparse.Namespace) -> Path:
    """`--run-dir`, or the run folder under `--runs-dir` whose logs changed last."""
    if args.run_dir:
        run_dir = Path(args.run_dir)
        if not (run_dir / "logs").is_dir():
            raise VerbError(f"{run_dir} is not a run folder (it has no logs/ folder)", 2)
        return run_dir
    runs = Path(args.runs_dir)
    found = [p for p in runs.glob("*/logs") if p.is_dir()] if runs.is_dir() else []
    if not found:
        raise VerbError(f"no run folders with logs under {runs}/; give --run-dir", 2)
    return max(found, key=last_change).parent


def last_change(log_dir: Path) -> float:
    return max([log_dir.stat().st_mtime] + [p.stat().st_mtime for p in log_dir.glob("*.log")])


def role_logs(log_dir: Path, role: str) -> list[Path]:
    """The log files of `role`: `coordinator.log`, `collector-0.log`, ...; every one of a
    role given without a number."""
    files = [
        p
        for p in log_dir.glob("*.log")
        if p.stem == role or ("-" not in role and re.fullmatch(rf"{role}-\d+", p.stem))
    ]
    if not files:
        present = ", ".join(sorted(p.stem for p in log_dir.glob("*.log"))) or "none"
        raise VerbError(f"no {role} logs in {log_dir} (there are: {present})", 2)
    return sorted(files, key=lambda p: (len(p.stem), p.stem))  # collector-2 before -10


def tail_lines(path: Path, count: int, block: int = 64 * 1024) -> list[str]:
    """The last `count` lines of a file, read from its end (a log may be large)."""
    if count == 0:
        return []
    with path.open("rb") as f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        position = end
        while position > 0 and data.count(b"\n") <= count:
            step = min(block, position)
            position -= step
            f.seek(position)
            data = f.read(step) + data
    return data.decode(errors="replace").splitlines()[-count:]


def follow(files: list[Path], follow_s: float | None, *, prefix: bool) -> None:
    """Print lines as they are appended (as `tail -f`, polling every FOLLOW_POLL_S),
    until Ctrl-C or `follow_s` seconds. A file that shrank was rewritten: read anew."""
    offsets = {path: path.stat().st_size for path in files}
    pending = {path: b"" for path in files}
    deadline = None if follow_s is None else time.monotonic() + follow_s
    try:
        while True:
            for path in files:
                size = path.stat().st_size if path.exists() else 0
                if size < offsets[path]:
                    offsets[path], pending[path] = 0, b""
                if size == offsets[path]:
                    continue
                with path.open("rb") as f:
                    f.seek(offsets[path])
                    data = pending[path] + f.read(size - offsets[path])
                offsets[path] = size
                *lines, pending[path] = data.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    print(f"[{path.stem}] {text}" if prefix else text)
            sys.stdout.flush()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                time.sleep(min(FOLLOW_POLL_S, left))
            else:
                time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        return


def show_experiment(remote: Remote, args: argparse.Namespace) -> int:
    """`drover experiment ID`: its jobs, as `drover sweep` shows them."""
    return print_experiment(remote.ask(lambda c: c.experiment(args.experiment)), args)


def print_experiment(status: ExperimentStatus, args: argparse.Namespace) -> int:
    if args.json:
        print_json(dump(status))
    else:
        output().print(experiment_table(status))
    return 0


REMOTE_VERBS: dict[str, Callable[[Remote, argparse.Namespace], int]] = {
    "experiment": show_experiment,
    "jobs": list_jobs,
    "status": job_status,
    "stop": stop_job,
    "workers": list_workers,
}
