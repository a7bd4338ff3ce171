"""Experiments: submit a sweep's jobs together, list them, read one, stop one."""

from typing import Any

from flask import Blueprint, request

from common.errors import bad_request
from common.http import body, reply
from common.messages import ExperimentCreated, ExperimentList, ExperimentStatus, ExperimentSubmit
from common.openapi import documented
from services.coordinator.api import core, version_query
from services.coordinator.job_views import MAX_PAGE

bp = Blueprint("experiments", __name__, url_prefix="/api/v1/experiments")


@bp.post("")
@documented(
    summary="Submit a config with a sweep section: its jobs, every one checked first",
    body=ExperimentSubmit,
    reply=ExperimentCreated,
    status=201,
)
def submit() -> Any:
    return reply(core().submit_experiment(body(ExperimentSubmit)), 201)


@bp.get("")
@documented(
    summary="List experiments, newest first, a page at a time, each with its jobs counted",
    reply=ExperimentList,
    query={
        "limit": {"type": "string", "pattern": "^[0-9]+$"},
        "page_token": {"type": "string", "maxLength": 256},
    },
)
def listing() -> Any:
    limit = version_query("limit")
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise bad_request("limit", f"{limit} is not from 1 to {MAX_PAGE}")
    page_token = request.args.get("page_token")
    return reply(core().list_experiments(limit=limit or MAX_PAGE, page_token=page_token))


@bp.get("/<experiment_id>")
@documented(
    summary="An experiment: each job with its axis values, phase and result", reply=ExperimentStatus
)
def status(experiment_id: str) -> Any:
    return reply(core().experiment_status(experiment_id))


@bp.delete("/<experiment_id>")
@documented(
    summary="Stop an experiment: every job of it not ended yet", reply=ExperimentStatus, status=202
)
def stop(experiment_id: str) -> Any:
    return reply(core().stop_experiment(experiment_id), 202)
