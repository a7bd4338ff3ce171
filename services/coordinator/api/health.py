"""Liveness, readiness and Prometheus metrics."""

from typing import Any

from flask import Blueprint, Response

from common.http import allow, reply
from common.messages import Health
from common.metrics import metrics_response
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
@allow("scraper")
@documented(summary="Prometheus metrics", content_type="text/plain")
def metrics() -> Response:
    return metrics_response(core().metrics.registry)
