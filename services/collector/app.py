"""The collector's Flask app factory.

A collector serves the routes every slave shares (`services/slave/`: `/v1/tasks`,
`/v1/status`, `/healthz`, `/readyz`, `/metrics`); its own logic is `core.py`.
"""

from __future__ import annotations

from flask import Flask

from common.devices import local_resources
from common.metrics import service_registry
from common.settings import SlaveSettings
from common.storage import SharedStore
from services.collector import settings as collector_settings
from services.collector.core import CollectorRunner
from services.collector.metrics import CollectorMetrics
from services.slave.app import create_slave_app
from services.slave.core import Slave, build_slave


def create_app(settings: SlaveSettings | None = None, *, core: Slave | None = None) -> Flask:
    settings = settings or collector_settings.from_env()
    if core is None:
        registry = service_registry()
        core = build_slave(
            "collector",
            CollectorRunner(SharedStore(settings.shared_dir), metrics=CollectorMetrics(registry)),
            settings,
            resources=local_resources(),
            metrics=registry,
        )
    return create_slave_app("drover.collector", core, settings.token, settings.metrics_token)
