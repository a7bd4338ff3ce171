"""`python -m services.coordinator`: serve the coordinator until SIGTERM."""

from __future__ import annotations

import contextlib
import ctypes
import sys

from common.env_guard import setup_env_registry
from common.http_server import serve
from common.logs import setup_logging
from common.process import exit_without_teardown
from common.settings import SettingsError
from services.coordinator.api import CORE
from services.coordinator.app import create_app
from services.coordinator.scheduler import Scheduler
from services.coordinator.settings import CoordinatorSettings
from services.coordinator.snapshot import Snapshotter

#: glibc's mallopt parameter for the size from which an allocation is its own mapping.
_M_MMAP_THRESHOLD = -3


def give_freed_buffers_back() -> None:
    """Keep each large allocation (a buffer's columns) in a mapping of its own, so
    freeing it gives the memory back to the system. glibc otherwise raises that
    threshold to the size of the last large block freed, and the next job's columns
    come from the heap, where they stay taken after that job ends: the coordinator's
    memory would follow the jobs it ever ran, not those it holds."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its own policy stays
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 1 << 20)


def main() -> int:
    give_freed_buffers_back()
    setup_logging("coordinator")
    try:
        settings = CoordinatorSettings.from_env()
        setup_env_registry()  # the operator's env modules; nothing a request names
    except SettingsError as exc:
        print(f"drover coordinator: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)  # restores the jobs found under the shared root
    core = app.extensions[CORE]
    scheduler = Scheduler(core, period_s=settings.scheduler_period_s)
    snapshots = Snapshotter(core, settings.snapshot_period_s)
    scheduler.start()
    snapshots.start()

    def stop() -> None:
        core.begin_shutdown()  # no more data in: the last snapshot holds all that was taken
        snapshots.close()
        scheduler.close()

    serve(app, settings.host, settings.port, limits=settings.server_limits(), on_stop=stop)
    exit_without_teardown(0)


if __name__ == "__main__":
    sys.exit(main())
