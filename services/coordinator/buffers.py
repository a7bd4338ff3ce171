"""Buffer processes: each running job's replay served by a process of its own (`python
-m services.buffer`), started, watched and restarted by the coordinator in its own
container or pod, on its volume. Collectors and learners insert and sample there
directly, with a credential for their task (services/buffer/credentials.py); the
coordinator keeps the control plane, a job's `BufferProcess` (remote_buffer.py).

`BufferProcesses` starts them and watches them: every `poll_s` it reads each one's
report (env steps, episode returns, size), which the coordinator counts its job by
(`on_report`), and restarts a process that died, on the same port when it can, telling
it again the learner's version (the tasks that ended before need no telling: it takes
only credentials signed since it started), with a jittered backoff, and not past
`max_restarts` in a window (its job then fails). A `ShardProcess` is one process: its
command thread, its report, its output's last lines. A process restores its buffer
from its own snapshot and indexes the segment files written since, so nothing
acknowledged is lost; meanwhile workers retry. The processes die with the coordinator
(the kernel's parent-death signal) and a restarted coordinator starts them anew; how
one is started (and the spare kept ready) is shard_runs.py's.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.config import ReplayBufferConfig
from common.errors import ApiError
from common.http_client import ServiceUnavailable
from common.messages import ShardReport
from services.buffer.client import BufferControl
from services.buffer.settings import SPEC_VARIABLE, spec_json
from services.coordinator.remote_buffer import SERVED, BufferProcess, ReportRead
from services.coordinator.shard_runs import ProcessRunner, ShardRun, ShardRunner

log = logging.getLogger(__name__)

#: How often each buffer process's report is read (and a dead one noticed).
POLL_S = 0.25
#: How long a new process has to answer before it counts as failed to start.
START_TIMEOUT_S = 60.0
#: A restart after the first in a window waits this long, doubled for each one more
#: (jittered), up to RESTART_BACKOFF_MAX_S: a process that dies at once is not
#: started again in a tight loop.
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S = 0.5, 10.0
#: The last lines of its output each process's failure is told with.
LOG_LINES_KEPT = 20


@dataclass(frozen=True, kw_only=True)
class BufferProcessSettings:
    """How the coordinator runs buffer processes (CoordinatorSettings.buffers)."""

    #: Where they listen: the coordinator's own host.
    bind_host: str = "127.0.0.1"
    #: How workers reach them: the coordinator's address as workers see it (compose:
    #: its service name; Kubernetes: its pod's IP). Empty: `bind_host`.
    advertise_host: str = ""
    #: The ports they may take (first, last); None: any free one.
    ports: tuple[int, int] | None = None
    shared_dir: Path = Path("runs")
    token: str = ""
    metrics_token: str = ""
    #: What a buffer process reads of the coordinator's settings (limits, periods).
    passed_env: dict[str, str] = field(default_factory=dict)
    #: A process that exits more than `max_restarts` times within `restart_window_s`
    #: is not started again: its job fails, with the process's last lines of output.
    max_restarts: int = 5
    restart_window_s: float = 60.0

    @property
    def url_host(self) -> str:
        return self.advertise_host or self.bind_host


class ShardProcess:
    """One buffer process: shard `index` of its job's buffer (the only one unless the
    job's `replay_buffer.shards` is more)."""

    def __init__(
        self,
        job_id: str,
        index: int,
        port: int,
        env: dict[str, str],
        settings: BufferProcessSettings,
        closed: Callable[[], bool],
        runner: ShardRunner,
    ) -> None:
        self.job_id = job_id
        self.index = index
        self.port = port
        self._env = env
        self._settings = settings
        self._closed = closed
        self.url = f"http://{settings.url_host}:{port}"
        self.control = BufferControl(
            f"http://{_connect_host(settings.bind_host)}:{port}", settings.token, timeout_s=10.0
        )
        self._runner = runner
        self.run: ShardRun | None = None
        self.restarts = 0
        #: When it exited, for each exit within the restart window (monotonic s).
        self.exits: collections.deque[float] = collections.deque()
        #: When the exited process is started again (None: it runs, or is not to be).
        self.restart_at: float | None = None
        #: When its report was last answered, or it was (re)started (monotonic s).
        self.answered_s = time.monotonic()
        #: The last lines of its output (stderr, where it logs).
        self.output: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        #: Its own watcher (`BufferProcesses._watch_shard`): a frozen process delays
        #: only its own job's reports.
        self.watcher: threading.Thread | None = None
        self.stopped = threading.Event()
        self.report = ShardReport(env_steps=0, size=0)
        self.returns_seq = 0
        #: It answered once: its job's data tasks may go out (until then they would
        #: only retry against a process still starting).
        self.ready = False
        #: One report read at a time (the watcher's, a restore's first).
        self._reading = threading.Lock()
        self._commands: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._sender = threading.Thread(
            target=self._send_loop, name=f"buffer-{job_id}-{index}", daemon=True
        )

    @property
    def name(self) -> str:
        return f"{self.job_id}'s buffer" + (f" (shard {self.index})" if self.index else "")

    # --- the process ---------------------------------------------------------------------

    def spawn(self) -> None:
        """Start serving the shard (again): a spare process when there is one."""
        self.run = self._runner.start({**self._env, "DROVER_PORT": str(self.port)}, self.output)
        self.answered_s = time.monotonic()
        if self.run.listening:
            self.ready = True
        if not self._sender.is_alive():
            self._sender.start()

    def silent_s(self) -> float:
        """Seconds since its report was last answered (or it was started)."""
        return time.monotonic() - self.answered_s

    def alive(self) -> bool:
        return self.run is not None and self.run.exit_code() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """It writes its last snapshot and exits (killed past `timeout_s`)."""
        self.stopped.set()
        self._commands.put(None)
        self.control.close()  # its connections, kept alive until now
        if self.run is not None:
            self.run.stop(timeout_s)

    # --- calls -----------------------------------------------------------------------------

    def send(self, name: str, arg: Any) -> None:
        """`task_ends`, `learner_version` or `elsewhere`, sent in order on this shard's
        own thread."""
        self._commands.put((name, arg))

    def _send_loop(self) -> None:
        while (command := self._commands.get()) is not None:
            name, arg = command
            if name == "elsewhere":
                # Only the newest matters, and the next one comes in a quarter second.
                with contextlib.suppress(ServiceUnavailable, ApiError):
                    self.control.elsewhere(arg)
                continue
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    if name == "task_ends":
                        self.control.task_ends(arg)
                    else:
                        self.control.learner_version(arg)
                    break
                except (ServiceUnavailable, ApiError) as exc:
                    if time.monotonic() > deadline or self._closed():
                        log.warning("%s: %s not sent: %s", self.name, name, exc)
                        break
                    time.sleep(0.2)  # restarting: told again once it is back anyway

    def patiently(self, call: Callable[[float], Any], deadline_s: float) -> Any:
        """`call(timeout_s)`, tried again while the process starts or restarts (a job
        can end before its buffer process first answers) until `deadline_s` (the
        monotonic clock's): each try has what is left of it."""
        while True:
            try:
                return call(max(0.1, deadline_s - time.monotonic()))
            except ServiceUnavailable:
                if time.monotonic() + 0.2 > deadline_s or self.run is None:
                    raise
                time.sleep(0.2)

    def poll_report(self) -> ReportRead:
        """The process's report now, with what is new in it since the last."""
        with self._reading:
            report = self.control.report(self.returns_seq)
            self.ready = True
            self.answered_s = time.monotonic()
            last, self.report = self.report, report
            if report.returns_seq < self.returns_seq:
                self.returns_seq = 0  # a restarted process numbers its episodes anew
                return ReportRead(report, [], {})
            self.returns_seq = report.returns_seq
            served = {}
            for name in SERVED:
                now, before = getattr(report, name), getattr(last, name)
                # A restarted process counts from 0 again.
                served[name] = now - before if now >= before else now
            return ReportRead(report, list(report.episode_returns), served)


def _connect_host(bind_host: str) -> str:
    """Where the coordinator reaches a process it started: itself."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "", "::") else bind_host


class BufferProcesses:
    """Starts, watches and restarts the buffer processes (see the module's text).

    Args:
        on_report: called with a job's id and its report read (`ReportRead`), from the
            watching thread, for every report read.
        on_failed: called with a job's id and why, from the watching thread, when one
            of its processes exited more than `max_restarts` times in the window: it
            is not started again, and the job must fail.
    """

    def __init__(
        self,
        settings: BufferProcessSettings,
        on_report: Callable[[str, ReportRead], None],
        *,
        on_failed: Callable[[str, str], None] = lambda job_id, why: None,
        poll_s: float = POLL_S,
        runner: ShardRunner | None = None,
    ) -> None:
        self.settings = settings
        self.runner = runner if runner is not None else ProcessRunner(settings.shared_dir)
        self._on_report = on_report
        self._on_failed = on_failed
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._processes: dict[str, BufferProcess] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="buffers", daemon=True)
        self._thread.start()

    def start(
        self, job_id: str, config: ReplayBufferConfig, *, error_buffer: float, seed: int
    ) -> BufferProcess:
        """The processes of the job's buffer, one a shard, started (each restores
        what its folder holds): the spare one first when there is one."""
        with self._lock:
            shards: list[ShardProcess] = []
            closed = lambda: buffer.closed  # noqa: E731 - read once the buffer exists
            taken = {p.port for job in self._processes.values() for p in job.shards}
            for index in range(config.shards):
                env = {
                    **self._base_env(),
                    "DROVER_BUFFER_JOB": job_id,
                    SPEC_VARIABLE: spec_json(config, error_buffer, seed, index),
                }
                port = self._free_port(taken)
                taken.add(port)
                shards.append(
                    ShardProcess(job_id, index, port, env, self.settings, closed, self.runner)
                )
            buffer = BufferProcess(job_id, shards, self.settings)
            # Started before the watcher can see them: one not started would look dead.
            for shard in shards:
                shard.spawn()
            self._processes[job_id] = buffer
            for shard in shards:
                shard.watcher = threading.Thread(
                    target=self._watch_shard,
                    args=(buffer, shard),
                    name=f"watch-{shard.job_id}-{shard.index}",
                    daemon=True,
                )
                shard.watcher.start()
        log.info(
            "job %s: its buffer runs in %d process(es) of its own at %s",
            job_id,
            len(shards),
            ", ".join(s.url for s in shards),
        )
        return buffer

    def _base_env(self) -> dict[str, str]:
        """What every buffer process is started with (a job's adds its own)."""
        env = {
            **os.environ,
            **self.settings.passed_env,
            "DROVER_HOST": self.settings.bind_host,
            "DROVER_SHARED_DIR": str(Path(self.settings.shared_dir).resolve()),
            "DROVER_TOKEN": self.settings.token,
            "DROVER_METRICS_TOKEN": self.settings.metrics_token,
            "PYTHONSAFEPATH": "1",
        }
        env.pop("DROVER_TOKEN_FILE", None)
        return env

    def read_reports(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Read every process's report now and count it, waiting for those that do not
        answer yet (starting: restoring their buffers) up to `timeout_s`; those that
        did not are counted by the watcher once they answer."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            pending = {job.job_id: (job, list(job.shards)) for job in self._processes.values()}
        while pending:
            for job_id, (job, shards) in list(pending.items()):
                reads = []
                for shard in list(shards):
                    try:
                        reads.append(shard.poll_report())
                    except (ServiceUnavailable, ApiError):
                        continue
                    shards.remove(shard)
                if reads:
                    self._on_report(job_id, job.merged(reads))
                if not shards:
                    del pending[job_id]
            if pending and time.monotonic() > deadline:
                log.warning(
                    "the buffer processes of %s did not answer in %.0f s: counted once they do",
                    ", ".join(pending),
                    timeout_s,
                )
                return
            if pending:
                time.sleep(0.1)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._processes.pop(job_id, None)

    def close(self) -> None:
        """Stop watching and stop every process (each writes its last snapshot)."""
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
        self.runner.close()
        for process in processes:
            process.stop()

    def _free_port(self, taken: set[int]) -> int:
        host = _connect_host(self.settings.bind_host)
        candidates = (
            range(self.settings.ports[0], self.settings.ports[1] + 1)
            if self.settings.ports
            else [0] * 20
        )
        for port in candidates:
            if port in taken:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return int(s.getsockname()[1])
        raise RuntimeError(f"no free port for a buffer process in {self.settings.ports}")

    def _watch(self) -> None:
        """Keep a spare process ready (each shard has a watcher of its own)."""
        while not self._stop.wait(self._poll_s):
            self.runner.keep_spare(self._base_env())

    def _watch_shard(self, job: BufferProcess, shard: ShardProcess) -> None:
        """Read the shard's report every `poll_s` and count it; restart it when it
        exited (`_exited`). One thread per process: a frozen one holds up its own
        reads (up to its client's timeout), never another job's counts."""
        while not (self._stop.wait(self._poll_s) or shard.stopped.is_set()):
            if job.closed:
                continue  # ending: its end reads the last report
            if not shard.alive():
                self._exited(job, shard)
                continue
            try:
                read = shard.poll_report()
            except (ServiceUnavailable, ApiError):
                continue  # starting, restarting or frozen: `silent_s` grows
            job.relay_limiter_counts()
            try:
                self._on_report(job.job_id, job.merged([read]))
            except Exception:
                log.exception("counting the report of %s's buffer failed", job.job_id)

    def _exited(self, job: BufferProcess, shard: ShardProcess) -> None:
        """A process that exited is started again: at once the first time in the
        restart window, then after a jittered backoff that doubles; past
        `max_restarts` in the window it is not, and its job fails with its last
        lines of output."""
        now, settings = time.monotonic(), self.settings
        if shard.restart_at is None:
            shard.exits.append(now)
            while shard.exits and shard.exits[0] < now - settings.restart_window_s:
                shard.exits.popleft()
            recent = len(shard.exits)
            code = shard.run.exit_code() if shard.run is not None else None
            if recent > settings.max_restarts:
                shard.stopped.set()
                lines = " | ".join(line for line in list(shard.output)[-5:] if line)
                why = (
                    f"{shard.name} process exited {recent} times in "
                    f"{settings.restart_window_s:g} s (last exit code {code}; "
                    f"DROVER_BUFFER_MAX_RESTARTS {settings.max_restarts}): {lines or 'no output'}"
                )
                log.error("%s; not started again", why)
                self._on_failed(job.job_id, why[:2000])
                return
            backoff_s = 0.0
            if recent > 1:
                backoff_s = min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_S * 2 ** (recent - 2))
                backoff_s *= random.uniform(0.5, 1.0)
            shard.restart_at = now + backoff_s
            log.warning(
                "%s's process exited (code %s, %d times in %g s); restarting it in %.1f s",
                shard.name,
                code,
                recent,
                settings.restart_window_s,
                backoff_s,
            )
        if now >= shard.restart_at:
            shard.restart_at = None
            shard.restarts += 1
            shard.spawn()
            job.tell_again(shard)
