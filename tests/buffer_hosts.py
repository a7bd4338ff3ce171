"""Buffer hosts served in threads of the test's own interpreter: the coordinator of a
service test starts each job's buffer as it would in production (the same
`BufferProcesses`, the same settings in the same environment variables, the same
`ShardService` behind the same routes, reached over HTTP on 127.0.0.1) but without a
process start (about 0.7 s of imports each), so the service tier stays fast.

    core = make_coordinator(store, limits)   # stopped at the test's end (conftest.py)

A coordinator "restarted" in a test (a second one on the same root) is made after
`crash(core)`: the first one's buffer hosts stop as a killed process would, without
a last snapshot.
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from common.http_server import ServerLimits, create_server
from common.storage import SharedStore
from services.buffer.core import ReplayBuffer
from services.buffer.host import ShardHost
from services.buffer.service import ShardService
from services.buffer.settings import BufferSettings
from services.coordinator.buffers import BufferProcessSettings
from services.coordinator.core import Coordinator
from services.coordinator.state import CoordinatorLimits
from tests.coordinator_app import TOKEN

log = logging.getLogger(__name__)

#: An idle connection to a stopped host is closed this long after (its loop then ends).
CHANNEL_TIMEOUT_S = 2.0

#: The coordinators made in the running test: their buffer hosts stop at its end.
MADE: list[Coordinator] = []


def make_coordinator(
    store: SharedStore, limits: CoordinatorLimits | None = None, **kwargs: object
) -> Coordinator:
    """A coordinator on `store` whose buffers are served in threads of this process."""
    kwargs.setdefault("buffers", buffer_settings(store.root))
    kwargs.setdefault("buffer_runner", ThreadedBuffers())
    core = Coordinator(store, limits, **kwargs)  # type: ignore[arg-type]
    MADE.append(core)
    return core


def crash(core: Coordinator) -> None:
    """Stop `core`'s buffer hosts as killed processes stop: no last snapshot (what
    was acknowledged is on disk as segment files and earlier snapshots)."""
    buffers = core.state.buffers
    if isinstance(buffers.runner, ThreadedBuffers):
        buffers.runner.killing = True
    buffers.close()


def host_of(core: Coordinator, job_id: str, shard: int = 0) -> ShardHost:
    """What serves a job's buffer (shard), to look into it."""
    replay = core.jobs[job_id].replay
    assert replay is not None, f"job {job_id} has no buffer"
    run = replay.shards[shard].run
    assert isinstance(run, ThreadRun)
    return run.service.host


def buffer_of(core: Coordinator, job_id: str, shard: int = 0) -> ReplayBuffer:
    """The replay buffer a job's buffer host serves."""
    return host_of(core, job_id, shard).buffer


def read_reports(core: Coordinator) -> None:
    """Count what every buffer host reports now (its watcher does every 0.25 s): the
    env steps and episodes of the inserts answered so far."""
    core.state.buffers.read_reports(timeout_s=5.0)


def stop_made(since: int = 0) -> None:
    """Stop the buffer hosts of the coordinators made since `len(MADE)` was `since`
    (those of a test, not those of a module's fixture made before it)."""
    while len(MADE) > since:
        crash(MADE.pop())


def buffer_settings(shared_dir: Path, **overrides: object) -> BufferProcessSettings:
    """Buffer processes on 127.0.0.1 with the tests' cluster token."""
    return BufferProcessSettings(shared_dir=shared_dir, token=TOKEN, **overrides)  # type: ignore[arg-type]


class ThreadRun:
    """One shard served in a thread: `stop` is its SIGTERM (the last snapshot, then
    the server closed)."""

    listening = True

    def __init__(
        self,
        service: ShardService,
        server: object,
        thread: threading.Thread,
        runner: ThreadedBuffers,
    ) -> None:
        self.service, self.server, self.thread = service, server, thread
        self._runner = runner
        self._code: int | None = None

    def exit_code(self) -> int | None:
        return self._code

    def stop(self, timeout_s: float) -> None:
        if self._code is not None:
            return
        if timeout_s > 0 and not self._runner.killing:
            self._code = 0
            self.service.stop()
        else:
            self._code = -9  # killed: no last snapshot
            self.service.stop(last_snapshot=False)
        # Its worker threads end now (waitress ends them only on a signal); its loop
        # once the connections still open (a client's kept-alive ones) close or time
        # out (CHANNEL_TIMEOUT_S): not waited for.
        self.server.task_dispatcher.shutdown(timeout=2.0)  # type: ignore[attr-defined]
        # Closed once its workers are done: one that finishes a request after pulls
        # the server's trigger, which closing closes.
        self.server.close()  # type: ignore[attr-defined]


class ThreadedBuffers:
    """A `ShardRunner` that serves each shard in a thread (see the module's text)."""

    def __init__(self) -> None:
        self.runs: list[ThreadRun] = []
        #: Stop each as a killed process stops (`crash`).
        self.killing = False

    def start(self, env: dict[str, str], output: collections.deque[str]) -> ThreadRun:
        settings = BufferSettings.from_env(env)
        service = ShardService.open(settings, metrics=CollectorRegistry())
        # Few threads: a test sends a handful of requests at once, and a test module
        # may start dozens of jobs.
        threads = settings.limits.max_waiting_inserts + settings.limits.max_waiting_samples + 2
        limits = ServerLimits(
            threads=threads, channel_timeout_s=CHANNEL_TIMEOUT_S, cleanup_interval_s=1.0
        )
        server = create_server(service.app, settings.host, settings.port, limits)
        thread = threading.Thread(
            target=server.run, name=f"buffer-{settings.job_id}-{settings.shard}", daemon=True
        )
        thread.start()
        run = ThreadRun(service, server, thread, self)
        self.runs = [r for r in self.runs if r.exit_code() is None]  # let go of the stopped
        self.runs.append(run)
        return run

    def keep_spare(self, env: dict[str, str]) -> None:
        """Nothing to start ahead: a thread starts at once."""

    def close(self) -> None:
        """Whatever `BufferProcesses.close` did not stop (a job forgotten meanwhile)."""
        for run in self.runs:
            run.stop(0.0)
