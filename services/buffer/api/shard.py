"""A buffer process's own routes, for the coordinator that started it (the cluster
token only): what it counts, the tasks that ended, the learner's version, the job's
end. Liveness, readiness and metrics beside them."""

from typing import Any

from flask import Blueprint, Response, request

from common.errors import bad_request
from common.http import allow, body, extension, reply
from common.messages import (
    BufferStats,
    Health,
    LearnerVersion,
    LimiterCounts,
    ShardReport,
    TaskAck,
    TaskEnds,
)
from common.metrics import metrics_response
from common.openapi import documented
from services.buffer.api import HOST

bp = Blueprint("shard", __name__, url_prefix="/v1/shard")
health_bp = Blueprint("health", __name__)


@bp.get("/report")
@documented(
    summary="Env steps, size, and the episode returns counted after ?since=", reply=ShardReport
)
def report() -> Any:
    since = request.args.get("since", "0")
    if not since.isdigit() or len(since) > 18:
        raise bad_request("since", "a sequence number from a previous report")
    return reply(extension(HOST).report(int(since)))


@bp.post("/task-ends")
@documented(summary="Tasks that ended: their credentials are refused", body=TaskEnds, reply=TaskAck)
def task_ends() -> Any:
    ended = body(TaskEnds)
    extension(HOST).task_ended(ended.task_ids)
    return reply(TaskAck(task_id=ended.task_ids[-1] if ended.task_ids else ""))


@bp.post("/learner-version")
@documented(summary="The learner's newest version: older items are stale", body=LearnerVersion)
def learner_version() -> Any:
    extension(HOST).set_learner_version(body(LearnerVersion).version)
    return reply(Health(ok=True))


@bp.post("/elsewhere")
@documented(
    summary="The job's other shards' limiter counts: this shard keeps the job's ratio",
    body=LimiterCounts,
    reply=Health,
)
def elsewhere() -> Any:
    extension(HOST).set_elsewhere(body(LimiterCounts))
    return reply(Health(ok=True))


@bp.post("/close")
@documented(
    summary="The job ended: no more data in or out; its final statistics", reply=BufferStats
)
def close() -> Any:
    return reply(extension(HOST).close())


@bp.post("/release")
@documented(summary="The job's end is recorded: its segment files go", reply=Health)
def release() -> Any:
    extension(HOST).release_all()
    return reply(Health(ok=True))


@health_bp.get("/healthz")
@documented(summary="Liveness", reply=Health)
def healthz() -> Any:
    return reply(Health(ok=True))


@health_bp.get("/readyz")
@documented(summary="Readiness: the shared root is mounted", reply=Health)
def readyz() -> Any:
    root = extension(HOST).store.root
    ok = root.is_dir()
    return reply(Health(ok=ok, reason="ok" if ok else f"{root} is not mounted"), 200 if ok else 503)


@health_bp.get("/metrics")
@allow("scraper")
@documented(summary="Prometheus metrics", content_type="text/plain")
def metrics() -> Response:
    return metrics_response(extension("drover.metrics"))
