"""`python -m services.buffer`: serve one job's replay until SIGTERM (the coordinator
starts it: services/coordinator/buffers.py). With `DROVER_BUFFER_SPARE=1` it starts
without a job and reads the variables naming one from its standard input first, so the
coordinator keeps one ready and a new job's buffer answers at once."""

from __future__ import annotations

import logging
import os
import sys
import threading

from common.http_server import serve
from common.logs import setup_logging
from common.process import exit_without_teardown, yield_to_requests
from common.settings import SettingsError
from common.storage import SharedStore
from common.storage_full import WriteFailures
from services.buffer.app import create_app
from services.buffer.credentials import TaskGrants, credential_key
from services.buffer.host import ShardHost
from services.buffer.settings import SPARE_VARIABLE, BufferSettings, job_env

log = logging.getLogger(__name__)


def main() -> int:
    setup_logging("buffer")
    env: dict[str, str] = dict(os.environ)
    try:
        if env.get(SPARE_VARIABLE) == "1":
            # A spare: its imports are done; it waits for its job (or for the coordinator
            # to close its input: no job came).
            line = sys.stdin.readline()
            if not line:
                return 0
            env = job_env(env, line)
        settings = BufferSettings.from_env(env)
    except SettingsError as exc:
        print(f"drover buffer: {exc}", file=sys.stderr)
        return 2
    # It works in its job's folder: /proc/<pid>/cwd says which job a process serves
    # (a spare's command line and environment cannot).
    root = settings.shared_dir.resolve()
    os.chdir(root / settings.job_id)
    host = ShardHost.open(
        SharedStore(root),
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
    app = create_app(host, settings.token, metrics_token=settings.metrics_token)
    stop = threading.Event()

    def upkeep() -> None:
        """Snapshots every period; now and then, the orphan sweep."""
        yield_to_requests()
        sweeps = 0
        failures = WriteFailures(log, "buffer upkeep failed; the previous snapshot stays in place")
        while not stop.wait(settings.snapshot_period_s):
            try:
                host.snapshot()
                host.buffer.collect_garbage()
                sweeps += 1
                if sweeps * settings.snapshot_period_s >= settings.limits.orphan_grace_s / 3:
                    sweeps = 0
                    host.sweep()
            except Exception as exc:
                failures.report(exc)

    thread = threading.Thread(target=upkeep, name="upkeep", daemon=True)
    thread.start()

    def on_stop() -> None:
        stop.set()
        thread.join(timeout=30)
        try:
            host.snapshot()  # the last one: every acknowledged insert is in it
        except Exception:
            log.exception("the last snapshot failed")
        host.stop()

    serve(app, settings.host, settings.port, limits=settings.server_limits(), on_stop=on_stop)
    exit_without_teardown(0)


if __name__ == "__main__":
    sys.exit(main())
