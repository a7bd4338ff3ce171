"""One shard served: its host restored from its folder, its app, and its upkeep (a
snapshot every period, now and then the orphan sweep) until it stops, with a last
snapshot. `python -m services.buffer` runs one in a process of its own; a test may run
one in a thread of its interpreter (tests/buffer_hosts.py), the same code behind the
same routes.

    shard = ShardService.open(settings)
    serve(shard.app, settings.host, settings.port, on_stop=shard.stop)
"""

from __future__ import annotations

import logging
import threading

from flask import Flask
from prometheus_client import CollectorRegistry

from common.process import yield_to_requests
from common.storage import SharedStore
from common.storage_full import WriteFailures
from services.buffer.app import create_app
from services.buffer.credentials import TaskGrants, credential_key
from services.buffer.host import ShardHost
from services.buffer.settings import BufferSettings

log = logging.getLogger(__name__)


class ShardService:
    """A shard's host, its app and its upkeep thread (see the module's text)."""

    def __init__(self, settings: BufferSettings, host: ShardHost, app: Flask) -> None:
        self.settings = settings
        self.host = host
        self.app = app
        self._stop = threading.Event()
        self._upkeep = threading.Thread(target=self._keep_up, name="upkeep", daemon=True)

    @classmethod
    def open(
        cls, settings: BufferSettings, *, metrics: CollectorRegistry | None = None
    ) -> ShardService:
        """The shard's buffer restored (its snapshot and the segment files written
        since), its app made and its upkeep started: serve `app` next."""
        host = ShardHost.open(
            SharedStore(settings.shared_dir.resolve()),
            settings.job_id,
            settings.config,
            error_buffer=settings.error_buffer,
            seed=settings.seed,
            grants=TaskGrants(
                credential_key(settings.token), settings.job_id, ttl_s=settings.credential_ttl_s
            ),
            limits=settings.limits,
            shard=settings.shard,
        )
        host.restore()
        app = create_app(
            host, settings.token, metrics_token=settings.metrics_token, metrics=metrics
        )
        service = cls(settings, host, app)
        service._upkeep.start()
        return service

    def _keep_up(self) -> None:
        """Snapshots every period; now and then, the orphan sweep."""
        yield_to_requests()
        settings, sweeps = self.settings, 0
        failures = WriteFailures(log, "buffer upkeep failed; the previous snapshot stays in place")
        while not self._stop.wait(settings.snapshot_period_s):
            try:
                self.host.snapshot()
                self.host.buffer.collect_garbage()
                sweeps += 1
                if sweeps * settings.snapshot_period_s >= settings.limits.orphan_grace_s / 3:
                    sweeps = 0
                    self.host.sweep()
            except Exception as exc:
                failures.report(exc)

    def stop(self, *, last_snapshot: bool = True) -> None:
        """The upkeep stopped, the last snapshot written (every acknowledged insert is
        in it; none: as a killed process leaves it), the host stopped: what is left is
        to stop serving."""
        self._stop.set()
        self._upkeep.join(timeout=30)
        if last_snapshot:
            try:
                self.host.snapshot()
            except Exception:
                log.exception("the last snapshot failed")
        self.host.stop()
