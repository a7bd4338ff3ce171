"""A buffer process's Flask app: the buffer's routes (the same as the coordinator's,
services/buffer/api), served by its `ShardHost` to the tasks its credentials name, and
its own routes for the coordinator (api/shard.py)."""

from __future__ import annotations

from flask import Blueprint, Flask
from prometheus_client import CollectorRegistry

import services.buffer.api as buffer_api
from common.http import install_http_basics
from common.metrics import service_registry
from common.openapi import install_openapi
from services.buffer.api.shard import bp as shard_bp
from services.buffer.api.shard import health_bp
from services.buffer.host import ShardHost

METRICS = "drover.metrics"


def routes() -> list[Blueprint]:
    """A buffer process's routes: the buffer's data routes, and the coordinator's own."""
    return [*buffer_api.blueprints(), shard_bp, health_bp]


def create_app(
    host: ShardHost,
    token: str,
    *,
    metrics_token: str = "",
    metrics: CollectorRegistry | None = None,
) -> Flask:
    """The app of a buffer process serving `host`: operators and the coordinator hold
    the cluster `token`; a worker holds its task's credential."""
    registry = metrics if metrics is not None else service_registry()
    app = Flask("drover.buffer")
    install_http_basics(
        app,
        token,
        worker_credential=host.for_credential,
        metrics_token=metrics_token or None,
        service="buffer",
        metrics=registry,
    )
    app.extensions[METRICS] = registry
    for bp in routes():
        app.register_blueprint(bp)
    buffer_api.install(app, host)
    install_openapi(app, "drover buffer")
    return app
