"""The learner's Flask app factory.

A learner serves the routes every slave shares (`services/slave/`: `/v1/tasks`,
`/v1/status`, `/healthz`, `/readyz`, `/metrics`); its own logic is `core.py`.
"""

from __future__ import annotations

from flask import Flask

from common.devices import local_resources
from common.metrics import service_registry
from common.settings import SlaveSettings
from common.storage import SharedStore
from services.learner import settings as learner_settings
from services.learner.core import LearnerRunner
from services.learner.metrics import LearnerMetrics
from services.slave.app import create_slave_app
from services.slave.core import Slave, build_slave


def create_app(settings: SlaveSettings | None = None, *, core: Slave | None = None) -> Flask:
    settings = settings or learner_settings.from_env()
    if core is None:
        registry = service_registry()
        core = build_slave(
            "learner",
            LearnerRunner(SharedStore(settings.shared_dir), metrics=LearnerMetrics(registry)),
            settings,
            resources=local_resources(),
            metrics=registry,
        )
    return create_slave_app("drover.learner", core, settings.token, settings.metrics_token)
