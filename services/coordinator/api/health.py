"""Liveness, readiness and Prometheus metrics."""

from typing import Any

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from common.http import reply
from common.messages import Health
from common.openapi import documented
from services.coordinator.api import core

bp = Blueprint("health", __name__)


@bp.get("/healthz")
@documented(summary="Liveness", reply=Health)
def healthz() -> Any:
    return reply(Health(ok=True))


@bp.get("/readyz")
@documented(summary="Readiness: the shared root is mounted", reply=Health)
def readyz() -> Any:
    root = core().store.root
    ok = root.is_dir()
    return reply(Health(ok=ok, reason="ok" if ok else f"{root} is not mounted"), 200 if ok else 503)


@bp.get("/metrics")
@documented(summary="Prometheus metrics", content_type="text/plain")
def metrics() -> Response:
    coordinator = core()
    registry = CollectorRegistry()
    labels = ["job_id"]
    gauges = {
        name: Gauge(f"drover_job_{name}", help_text, labels, registry=registry)
        for name, help_text in (
            ("env_steps", "Env steps collected"),
            ("train_iters", "Learner iterations"),
            ("policy_version", "Newest policy version"),
            ("buffer_size", "Items in the replay buffer"),
        )
    }
    sizes = coordinator.buffer_sizes()
    for status in coordinator.list_jobs():
        gauges["env_steps"].labels(status.job_id).set(status.env_steps)
        gauges["train_iters"].labels(status.job_id).set(status.train_iters)
        gauges["policy_version"].labels(status.job_id).set(status.policy_version)
        gauges["buffer_size"].labels(status.job_id).set(sizes.get(status.job_id, 0))
    Gauge("drover_workers", "Registered workers", registry=registry).set(
        len(coordinator.list_workers())
    )
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
