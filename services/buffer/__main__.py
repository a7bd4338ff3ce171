"""`python -m services.buffer`: serve one job's replay until SIGTERM (the coordinator
starts it: services/coordinator/buffers.py). With `DROVER_BUFFER_SPARE=1` it starts
without a job and reads the variables naming one from its standard input first, so the
coordinator keeps one ready and a new job's buffer answers at once."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from common.http_server import serve
from common.logs import setup_logging
from common.process import exit_without_teardown
from common.settings import SettingsError
from services.buffer.service import ShardService
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
    settings = dataclasses.replace(settings, shared_dir=settings.shared_dir.resolve())
    os.chdir(settings.shared_dir / settings.job_id)
    shard = ShardService.open(settings)
    serve(
        shard.app, settings.host, settings.port, limits=settings.server_limits(), on_stop=shard.stop
    )
    exit_without_teardown(0)


if __name__ == "__main__":
    sys.exit(main())
