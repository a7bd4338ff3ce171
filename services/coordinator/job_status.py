"""What is shown of a job: its status (`status_of`), with the learners running its
learn tasks and their throughput (`learners_of`), and an ended job's metrics, read back
from its record (`metrics_from_record`). `JobBook` (jobs.py) answers the routes with
them, and writes an ending job's status as its summary.
"""

from __future__ import annotations

from typing import Any

from common.messages import (
    EvalSummary,
    JobMetrics,
    JobStatus,
    LearnerSummary,
    MetricsPoint,
    WorkerShare,
    parse,
)
from common.ranks import RANK_DEVICES, learner_ranks
from services.coordinator.state import CoordinatorState, Job
from services.coordinator.workflows import workflow_of
from services.coordinator.workflows.training import train_iters_since_eval


def metrics_from_record(record: dict[str, Any], job: Job) -> JobMetrics:
    """An ended job's metrics, from its record."""
    return JobMetrics(
        job_id=job.job_id,
        points=[parse(MetricsPoint, p) for p in record.get("metrics", [])],
        evals=[parse(EvalSummary, e) for e in record.get("evals", [])],
        buffer=job.final_buffer,
        unusable_segments=sorted(record.get("unusable_segments", [])),
    )


def learners_of(state: CoordinatorState, job: Job) -> list[LearnerSummary]:
    """The learners running the job's learn tasks, with what their progress says of
    their throughput (a learner group's ranks included)."""
    summaries = []
    for task in state.tasks.values():
        worker = state.workers.get(task.worker_id)
        if task.job_id != job.job_id or task.kind != "learn" or worker is None:
            continue
        progress = worker.progress.get(task.task_id, {})
        world_size = learner_ranks(worker.resources)
        devices = worker.resources.get(RANK_DEVICES)
        summaries.append(
            LearnerSummary(
                worker_id=worker.worker_id,
                world_size=world_size,
                rank_devices=_rank_devices(devices, world_size),
                train_iters_per_s=progress.get("train_iters_per_s"),
                samples_per_s=progress.get("samples_per_s"),
                rank_samples_per_s=[
                    progress[f"rank_{r}_samples_per_s"]
                    for r in range(world_size)
                    if f"rank_{r}_samples_per_s" in progress
                ],
            )
        )
    return summaries


def held_of(state: CoordinatorState, job: Job) -> dict[str, int]:
    """The collectors and learners the job's tasks hold now, by role (an evaluation
    moves no share: only collect and learn tasks count)."""
    held = {"collector": 0, "learner": 0}
    for task in state.tasks.values():
        if task.job_id == job.job_id and task.kind in ("collect", "learn"):
            held["collector" if task.kind == "collect" else "learner"] += 1
    return held


def _rank_devices(listed: object, world_size: int) -> list[str]:
    """The devices a learner registered (`rank_devices`), one a rank; a group too big
    to list them registers a summary, kept whole."""
    if not isinstance(listed, str) or not listed:
        return []
    devices = listed.split(",")
    return devices if len(devices) == world_size else [listed]


def status_of(
    job: Job,
    learners: list[LearnerSummary] | None = None,
    *,
    phase: tuple[str, str, float | None] | None = None,
    held: dict[str, int] | None = None,
) -> JobStatus:
    """The job's status; `phase`: (phase, reason, finished_at) to show instead of its
    own (the end it is about to show); `held`: the workers its tasks hold now, by role
    (`held_of`; as the last scheduling pass counted them when None)."""
    shown, reason, finished_at = phase or (job.phase, job.reason, job.finished_at)
    if phase is None and job.unrecorded and job.ending is not None:
        # Its end could not be written (a full volume): shown all the same, as such.
        shown, reason, finished_at = job.ending
        reason = f"{reason} ({job.unrecorded})"
    return JobStatus(
        job_id=job.job_id,
        name=job.name,
        phase=shown,  # type: ignore[arg-type]
        algo=job.config.policy.type,
        env_id=job.config.env.env_id,
        env_steps=job.env_steps,
        train_iters=job.train_iters,
        policy_version=job.policy.version if job.policy else 0,
        last_eval=job.evals[-1] if job.evals else None,
        best_eval_return=job.best_eval.return_mean if job.best_eval else None,
        best_policy_version=job.best_eval.policy_version if job.best_eval else None,
        stop_value=job.config.env.stop_value,
        reason=reason or (_live_reason(job) if phase is None else ""),
        started_at=job.started_at,
        finished_at=finished_at,
        learners=learners or [],
        max_env_step=job.config.system.max_env_step,
        max_train_iter=job.config.system.max_train_iter,
        task_failures=job.task_failures,
        tasks_reassigned=job.tasks_reassigned,
        priority=job.config.system.priority,
        share=job.config.system.share,
        collector_share=_share_view(job, "collector", held) if job.running else None,
        learner_share=_share_view(job, "learner", held) if job.running else None,
        queue_position=job.queue_position if job.queued else None,
        tasks_preempted=job.tasks_preempted,
        storage_full_s=(
            round(job.room_wait.seen_s - job.room_wait.since_s, 1)
            if job.room_wait is not None and job.running and phase is None
            else None
        ),
        experiment_id=job.experiment_id,
        train_iters_since_eval=(
            train_iters_since_eval(job) if "learner" in workflow_of(job.config).roles else None
        ),
    )


def _live_reason(job: Job) -> str:
    """What a running or queued job waits for, and why its evaluations stall."""
    if job.queued:
        return job.waiting
    if not job.running:
        return ""
    silence = job.replay.silence() if job.replay is not None else ""
    return "; ".join(why for why in (job.waiting, job.eval_stall, silence) if why)


def _share_view(job: Job, role: str, held: dict[str, int] | None) -> WorkerShare:
    share = job.share(role)
    return WorkerShare(
        owed=round(share.owed, 3),
        held=share.held if held is None else held[role],
        owed_s=round(share.owed_s, 1),
        held_s=round(share.held_s, 1),
    )
