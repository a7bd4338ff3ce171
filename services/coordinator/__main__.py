"""`python -m services.coordinator`: serve the coordinator until SIGTERM."""

from __future__ import annotations

import sys

from common.http import serve
from common.logs import setup_logging
from common.settings import SettingsError
from services.coordinator.api import CORE
from services.coordinator.app import create_app
from services.coordinator.scheduler import Scheduler
from services.coordinator.settings import CoordinatorSettings


def main() -> int:
    setup_logging("coordinator")
    try:
        settings = CoordinatorSettings.from_env()
    except SettingsError as exc:
        print(f"drover coordinator: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)
    scheduler = Scheduler(
        app.extensions[CORE], settings.token, period_s=settings.scheduler_period_s
    )
    scheduler.start()
    serve(app, settings.host, settings.port, threads=settings.threads, on_stop=scheduler.close)
    return 0


if __name__ == "__main__":
    sys.exit(main())
