"""The coordinator's Flask app factory."""

from __future__ import annotations

from flask import Blueprint, Flask

from common.http import install_http_basics
from common.openapi import install_openapi
from common.storage import SharedStore
from services.coordinator.api import CORE, blueprints
from services.coordinator.core import Coordinator
from services.coordinator.settings import CoordinatorSettings


def routes() -> list[Blueprint]:
    """The coordinator's routes, one blueprint a resource (api/data.py passes data
    requests on to the job's buffer processes)."""
    return blueprints()


def create_app(
    settings: CoordinatorSettings | None = None, *, core: Coordinator | None = None
) -> Flask:
    """The coordinator app: jobs, experiments, workers, tasks, policies, data.

    Args:
        settings: defaults to `CoordinatorSettings.from_env()`.
        core: an existing core (tests); built from `settings` otherwise.
    """
    settings = settings or CoordinatorSettings.from_env()
    if core is None:
        core = Coordinator(
            SharedStore(settings.shared_dir), settings.limits, buffers=settings.buffer_processes()
        )
        # A coordinator started over an existing shared root picks its jobs up again.
        core.restore_jobs()
    app = Flask("drover.coordinator")
    install_http_basics(
        app,
        settings.token,
        registration_token=settings.registration_token or None,
        worker_credential=core.worker_for_credential,
        metrics_token=settings.metrics_token or None,
        service="coordinator",
        metrics=core.metrics.registry,
    )
    app.extensions[CORE] = core
    for bp in routes():
        app.register_blueprint(bp)
    install_openapi(app, "drover coordinator")
    return app
