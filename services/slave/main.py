"""The `__main__` of every slave: settings from env, the app, a WSGI server, SIGTERM."""

from __future__ import annotations

import sys
from collections.abc import Callable

from flask import Flask

from common.http_server import ServerLimits, serve
from common.logs import setup_logging
from common.process import exit_without_teardown
from common.settings import SettingsError, SlaveSettings
from services.slave.core import EXTENSION, Slave


def run_slave(role: str, default_port: int, create_app: Callable[[SlaveSettings], Flask]) -> int:
    setup_logging(role)
    try:
        settings = SlaveSettings.from_env(default_port)
    except SettingsError as exc:
        print(f"drover {role}: {exc}", file=sys.stderr)
        return 2
    serve_slave(create_app(settings), settings)
    exit_without_teardown(0)


def serve_slave(app: Flask, settings: SlaveSettings) -> None:
    """Serve a slave's app until SIGTERM: it registers once listening, and on SIGTERM
    stops its tasks and leaves the coordinator."""
    slave: Slave = app.extensions[EXTENSION]
    serve(
        app,
        settings.host,
        settings.port,
        limits=ServerLimits(threads=8, connection_limit=200),
        on_stop=slave.close,
        on_listening=slave.start,
    )
