"""What the cluster verbs print (`drover jobs`, `status`, `stop`, `workers`): a job's
status, its learners and its buffer as rich tables, a worker's progress as text, and
the small formats they share (a phase in its colour, a duration, a rate). Pure
functions of the coordinator's answers: drover/verbs.py asks for those and prints these.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from common.messages import ExperimentStatus, JobStatus, LeagueView, WorkerShare
from jobconfig.sweep import short

PHASE_COLORS = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "stopped": "magenta",
}


def status_table(job: JobStatus) -> Table:
    """The job's status as `field  value` rows."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("phase", phase_text(job.phase))
    table.add_row("reason", escape(job.reason) or "-")
    started = datetime.fromtimestamp(job.started_at).strftime("%Y-%m-%d %H:%M:%S")
    table.add_row("started", f"{started} ({duration(elapsed_s(job))} ago)")
    if job.finished_at is not None:
        table.add_row("ran for", duration(job.finished_at - job.started_at))
    table.add_row("env steps", against_budget(job.env_steps, job.max_env_step))
    table.add_row("train iters", against_budget(job.train_iters, job.max_train_iter))
    table.add_row("policy", f"v{job.policy_version}")
    table.add_row("stop value", "-" if job.stop_value is None else f"{job.stop_value:g}")
    if job.last_eval is not None:
        ev = job.last_eval
        spread = ""
        if ev.return_min is not None and ev.return_max is not None:
            spread = f" [{ev.return_min:.1f}, {ev.return_max:.1f}]"
        table.add_row(
            "last eval",
            f"{ev.return_mean:.1f} ± {ev.return_std:.1f}{spread} over {ev.episodes} episodes "
            f"(policy v{ev.policy_version}, {ev.train_iter:,} iters, {ev.env_steps:,} env steps)",
        )
    else:
        table.add_row("last eval", "-")
    best = "-"
    if job.best_eval_return is not None:
        best = f"{job.best_eval_return:.1f} (policy v{job.best_policy_version})"
    table.add_row("best eval", best)
    table.add_row("learners", str(len(job.learners)) if job.learners else "-")
    table.add_row("priority, share", f"{job.priority}, {job.share:g}")
    if job.queue_position is not None:
        table.add_row("queue", f"{job.queue_position} (1: next to run)")
    for role, share in (("collectors", job.collector_share), ("learner", job.learner_share)):
        if share is not None:
            table.add_row(role, share_text(share, over_time=True))
    table.add_row(
        "tasks",
        f"{job.task_failures} failed, {job.tasks_reassigned} reassigned, "
        f"{job.tasks_preempted} released for other jobs",
    )
    if job.storage_full_s is not None:
        table.add_row(
            "storage",
            f"[bold red]the shared volume is full[/]: writes have waited "
            f"{job.storage_full_s:.0f} s (the job fails at system.storage_grace_s)",
        )
    return table


def share_text(share: WorkerShare | None, *, over_time: bool = False) -> str:
    """Held of owed now (`2 of 1.33`), and, `over_time`, worker-seconds held of owed."""
    if share is None:
        return "-"
    text = f"{share.held} of {share.owed:.2f}"
    if over_time and share.owed_s > 0:
        text += (
            f" now; {share.held_s:,.0f} of {share.owed_s:,.0f} worker-seconds owed so far "
            f"({share.held_s / share.owed_s:.0%})"
        )
    return text


def league_line(league: LeagueView) -> str:
    """One line of a self-play league: the policy's rating, and the newest battle
    evaluation's win rates against the baselines."""
    line = f"league: rating {league.main.ordinal:.1f}, {league.games:,} games"
    if league.evaluations:
        last = league.evaluations[-1]
        rates = ", ".join(
            f"{name} {rate:.2f}" for name, rate in last.win_rates.items() if rate is not None
        )
        line += f"; win rate (v{last.policy_version}) vs {rates}"
    return line


def league_table(league: LeagueView) -> Table:
    """The pool: each opponent's rating and the policy's games against it."""
    table = Table(title=escape(league_line(league)))
    for column in ("opponent", "kind", "rating", "games", "won", "drawn", "lost"):
        table.add_column(column, justify="left" if column in ("opponent", "kind") else "right")
    table.add_column("win rate", justify="right")
    table.add_column("pfsp weight", justify="right")
    for member in sorted(league.members, key=lambda m: -m.ordinal):
        table.add_row(
            escape(member.name),
            member.kind,
            f"{member.ordinal:.1f}",
            f"{member.games:,}",
            f"{member.wins:,}",
            f"{member.draws:,}",
            f"{member.losses:,}",
            f"{member.win_rate:.2f}" if member.games else "-",
            f"{member.pfsp_weight:.2f}",
        )
    table.caption = f"the learning policy's rating: {league.main.ordinal:.1f} (mu - 3 sigma)"
    return table


def against_budget(count: int, budget: int | None) -> str:
    """`count`, and its share of `budget` when there is one."""
    if budget is None:
        return f"{count:,}"
    return f"{count:,} of {budget:,} ({count / budget:.0%})"


def learners_table(job: JobStatus) -> Table:
    table = Table(title="learners")
    table.add_column("worker", no_wrap=True)
    table.add_column("ranks", justify="right")
    table.add_column("devices")
    table.add_column("iters/s", justify="right")
    table.add_column("samples/s", justify="right")
    for learner in job.learners:
        table.add_row(
            learner.worker_id,
            str(learner.world_size),
            escape(", ".join(learner.rank_devices)) or "-",
            rate(learner.train_iters_per_s),
            rate(learner.samples_per_s),
        )
    return table


def buffer_table(stats: dict[str, Any]) -> Table:
    """The `/buffer` answer (`BufferStats`), the fields a person looks at first."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()

    def get(key: str, default: Any = None) -> Any:
        return stats.get(key, default)

    table.add_row("size", f"{get('size', 0):,} / {get('capacity', 0):,}")
    table.add_row("sampler", f"{get('sampler', '-')} (eviction {get('eviction', '-')})")
    table.add_row("inserts", f"{get('inserts', 0):,}")
    table.add_row("samples", f"{get('samples', 0):,} in {get('sample_requests', 0):,} requests")
    evictions = get("evictions") or {}
    table.add_row("evictions", ", ".join(f"{k} {v:,}" for k, v in evictions.items()) or "-")
    table.add_row(
        "use count", f"mean {number(get('use_count_mean'))}, max {number(get('use_count_max'))}"
    )
    table.add_row(
        "staleness", f"mean {number(get('staleness_mean'))}, max {number(get('staleness_max'))}"
    )
    if get("priority_mean") is not None:
        table.add_row(
            "priorities",
            f"min {number(get('priority_min'))}, mean {number(get('priority_mean'))}, "
            f"max {number(get('priority_max'))}",
        )
    table.add_row("samples/insert", number(get("samples_per_insert_ratio")))
    table.add_row(
        "can sample / insert",
        f"{yes_no(get('can_sample'))} / {yes_no(get('can_insert'))} "
        f"(waiting: {get('waiting_samplers', 0)} samplers, {get('waiting_inserters', 0)} "
        "inserters)",
    )
    return table


#: Progress keys shown in `drover workers`, in order, with their unit.
PROGRESS_KEYS = (
    ("env_steps_per_s", "env steps/s"),
    ("train_iters_per_s", "iters/s"),
    ("samples_per_s", "samples/s"),
    ("train_iter", "iters"),
    ("episodes", "episodes"),
)


def progress_text(progress: dict[str, float]) -> str:
    parts = [f"{progress[k]:,.0f} {unit}" for k, unit in PROGRESS_KEYS if k in progress]
    return ", ".join(parts) or "-"


def phase_text(phase: str) -> str:
    return f"[{PHASE_COLORS.get(phase, 'white')}]{phase}[/]"


def elapsed_s(job: JobStatus) -> float:
    end = job.finished_at if job.finished_at is not None else time.time()
    return max(0.0, end - job.started_at)


def duration(seconds: float) -> str:
    """12.3s, 4m05s, 2h07m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def yes_no(value: Any) -> str:
    return "yes" if value else "no"


def experiment_table(status: ExperimentStatus, took_s: float | None = None) -> Table:
    """Each job of the experiment: its point, seed, phase, env steps and evaluations."""
    title = f"{status.name} · {status.experiment_id} · {status.phase}"
    if took_s is not None:
        title += f" · {took_s:.0f}s"
    if status.population is not None:
        title += f" · {len(status.lineage)} population steps"
    table = Table(title=title)
    keys = list(status.members[0].values) if status.members else []
    tuning = status.tuning is not None
    if tuning:
        title += f" · a tuning: {len(status.members)} trials so far"
        table.title = title
    table.add_column("job", no_wrap=True, min_width=16)  # ids whole: they are what to type
    if tuning:
        table.add_column("trial", justify="right")
    for key in keys:
        table.add_column(key.rsplit(".", 1)[-1], justify="right")
    for column in ("seed", "phase", "env steps", "last eval", "best eval"):
        table.add_column(column, justify="right")
    if tuning:
        table.add_column("trial ended", justify="right")
        table.add_column("objective", justify="right")
    for member in status.members:
        trial = [str(member.trial)] if tuning else []
        objective = "-" if member.objective is None else short(member.objective)
        ended = [member.trial_state or "-", objective] if tuning else []
        table.add_row(
            member.job_id,
            *trial,
            *(short(member.values.get(key)) for key in keys),
            str(member.seed),
            phase_text(member.phase),
            f"{member.env_steps:,}",
            "-" if member.last_eval_return is None else f"{member.last_eval_return:.1f}",
            "-" if member.best_eval_return is None else f"{member.best_eval_return:.1f}",
            *ended,
        )
    return table
