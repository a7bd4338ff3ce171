"""Jobs: submit, list, read, stop; metrics and policy files for users."""

from typing import Any

from flask import Blueprint, request, send_file

from common.errors import bad_request
from common.http import body, reply
from common.messages import (
    CheckpointList,
    JobCreated,
    JobList,
    JobMetrics,
    JobStatus,
    JobSubmit,
)
from common.openapi import documented
from services.coordinator.api import SECONDS_QUERY, core, seconds_query, version_query
from services.coordinator.job_views import MAX_PAGE

bp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs")


@bp.post("")
@documented(summary="Submit a job config", body=JobSubmit, reply=JobCreated, status=201)
def submit() -> Any:
    return reply(core().submit_job(body(JobSubmit)), 201)


#: What `?phase=` takes: one phase, or "ended" for any terminal one.
PHASES = ("running", "succeeded", "failed", "stopped", "ended")


@bp.get("")
@documented(
    summary="List jobs, newest first, a page at a time",
    reply=JobList,
    query={
        "phase": {"type": "string", "enum": list(PHASES)},
        "limit": {"type": "string", "pattern": "^[0-9]+$"},
        "page_token": {"type": "string", "maxLength": 256},
    },
)
def list_jobs() -> Any:
    phase = request.args.get("phase")
    if phase is not None and phase not in PHASES:
        raise bad_request("phase", f"'{phase[:32]}' is not one of {', '.join(PHASES)}")
    limit = version_query("limit")
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise bad_request("limit", f"{limit} is not from 1 to {MAX_PAGE}")
    return reply(
        core().list_jobs(
            phase=phase, limit=limit or MAX_PAGE, page_token=request.args.get("page_token")
        )
    )


@bp.get("/<job_id>")
@documented(
    summary="A job's status (with wait_s: once it has ended, or after wait_s)",
    reply=JobStatus,
    query={"wait_s": SECONDS_QUERY},
)
def get(job_id: str) -> Any:
    return reply(core().job_status(job_id, wait_s=seconds_query("wait_s")))


@bp.delete("/<job_id>")
@documented(summary="Stop a job", reply=JobStatus, status=202)
def stop(job_id: str) -> Any:
    return reply(core().stop_job(job_id), 202)


@bp.get("/<job_id>/metrics")
@documented(summary="A job's time series, evaluations and buffer", reply=JobMetrics)
def metrics(job_id: str) -> Any:
    return reply(core().job_metrics(job_id))


@bp.get("/<job_id>/policy")
@documented(
    summary="The latest (or ?version=) policy file, safetensors",
    content_type="application/octet-stream",
    query={"version": {"type": "string", "pattern": "^[0-9]+$"}},
)
def policy_file(job_id: str) -> Any:
    return job_file(job_id, core().policy_path(job_id, version_query("version")))


@bp.get("/<job_id>/checkpoints")
@documented(summary="A job's checkpoint files, oldest first", reply=CheckpointList)
def checkpoints(job_id: str) -> Any:
    return reply(core().checkpoints(job_id))


@bp.get("/<job_id>/checkpoints/<name>")
@documented(summary="One checkpoint file, safetensors", content_type="application/octet-stream")
def checkpoint_file(job_id: str, name: str) -> Any:
    return job_file(job_id, core().checkpoint_path(job_id, name))


@bp.get("/<job_id>/videos/<name>")
@documented(
    summary="An evaluation's video (eval-<version>.mp4, or its .gif)",
    content_type="application/octet-stream",
)
def video_file(job_id: str, name: str) -> Any:
    mimetype = "video/mp4" if name.endswith(".mp4") else "image/gif"
    return job_file(job_id, core().video_path(job_id, name), mimetype, attachment=False)


def job_file(
    job_id: str, path: str, mimetype: str = "application/octet-stream", *, attachment: bool = True
) -> Any:
    """A file of the job's folder the facade checked (`path`), named for a download."""
    return send_file(
        core().store.resolve(path),
        mimetype=mimetype,
        as_attachment=attachment,
        download_name=f"{job_id}-{path.rsplit('/', 1)[-1]}",
    )
