"""How a job's buffer shard is served: a process of its own (`python -m
services.buffer`) that dies with the coordinator, started by `ProcessRunner`, which
keeps one spare process (its imports done) for the next job, so that a new job's buffer
answers at once. `BufferProcesses` (buffers.py) starts, watches and restarts them
through the `ShardRunner` interface; a test may serve them in threads instead
(tests/buffer_hosts.py).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from services.buffer.settings import SPARE_VARIABLE, SPEC_VARIABLE

#: A spare process taken by a new job is replaced this long after (a burst of new
#: jobs does not start processes while they start themselves).
SPARE_DELAY_S = 10.0
#: Linux's prctl option: the signal a child gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before it runs: SIGKILL when the coordinator dies, however it
    dies (a restarted coordinator starts the buffers anew from their snapshots)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ShardRun(Protocol):
    """One shard being served: a process of its own (`ProcessRun`), or in a test a
    thread of the coordinator's interpreter (tests/buffer_hosts.py)."""

    #: It answers from the moment it was started (a host in this interpreter); a
    #: process answers once its imports are done.
    listening: bool

    def exit_code(self) -> int | None:
        """None while it serves."""
        ...

    def stop(self, timeout_s: float) -> None:
        """It writes its last snapshot and stops serving; killed past `timeout_s`."""
        ...


class ShardRunner(Protocol):
    """How `BufferProcesses` starts a shard's server: `ProcessRunner`."""

    def start(self, env: dict[str, str], output: collections.deque[str]) -> ShardRun:
        """Serve the shard `env` names (services/buffer/settings.py), its log's last
        lines kept in `output`."""
        ...

    def keep_spare(self, env: dict[str, str]) -> None:
        """Called every poll: ready a server for the next job, if it does that."""
        ...

    def close(self) -> None: ...


class ProcessRun:
    """A buffer process (`python -m services.buffer`)."""

    listening = False

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def exit_code(self) -> int | None:
        return self.process.poll()

    def stop(self, timeout_s: float) -> None:
        """SIGTERM: it writes its last snapshot and exits."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class ProcessRunner:
    """Starts each shard as a process of its own, in `shared_dir`, that dies with the
    coordinator; keeps one spare process (started without a job, its imports done) for
    the next job, which then answers at once."""

    def __init__(self, shared_dir: Path) -> None:
        self.shared_dir = shared_dir
        self._lock = threading.Lock()
        #: A process started without a job, for the next one; not before `_spare_after`.
        self._spare: subprocess.Popen[bytes] | None = None
        self._spare_after = 0.0
        self._closed = False

    def start(self, env: dict[str, str], output: collections.deque[str]) -> ProcessRun:
        with self._lock:
            spare, self._spare = self._spare, None
            # A burst of new jobs starts no spare while they start themselves.
            self._spare_after = time.monotonic() + SPARE_DELAY_S
        if spare is None or not _adopt(spare, env):
            spare = self._popen(env)
        follow_output(spare, output)
        return ProcessRun(spare)

    def keep_spare(self, env: dict[str, str]) -> None:
        with self._lock:
            if self._spare is not None and self._spare.poll() is None:
                return
            if time.monotonic() < self._spare_after or self._closed:
                return
            self._spare = self._popen({**env, SPARE_VARIABLE: "1"}, spare=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None and spare.stdin is not None:
            spare.stdin.close()  # no job came: it exits
            try:
                spare.wait(5)
            except subprocess.TimeoutExpired:
                spare.kill()

    def _popen(self, env: dict[str, str], *, spare: bool = False) -> subprocess.Popen[bytes]:
        """`python -m services.buffer` with `env`; its output (its log) on a pipe that
        `follow_output` passes through; a spare reads its job from its input."""
        return subprocess.Popen(  # noqa: S603 - our own module, our own env
            [sys.executable, "-m", "services.buffer"],
            env=env,
            cwd=str(self.shared_dir),
            stdin=subprocess.PIPE if spare else None,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - one libc call, no locks
        )


def _adopt(spare: subprocess.Popen[bytes], env: dict[str, str]) -> bool:
    """Give a spare process the shard `env` names: the variables naming it, on its
    input. False: the spare had died."""
    if spare.poll() is not None:
        return False
    job = {name: env[name] for name in ("DROVER_BUFFER_JOB", SPEC_VARIABLE, "DROVER_PORT")}
    assert spare.stdin is not None
    try:
        spare.stdin.write(json.dumps(job).encode() + b"\n")
        spare.stdin.close()
    except OSError:
        return False
    return True


def follow_output(process: subprocess.Popen[bytes], lines: collections.deque[str]) -> None:
    """Copy the process's output to ours as it comes (the coordinator's log is the
    buffers' too), keeping its last lines in `lines`, on a thread that ends with it."""
    pipe = process.stderr
    if pipe is None:
        return

    def copy() -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for line in iter(pipe.readline, b""):
            lines.append(line.decode(errors="replace").rstrip())
            if out is not None:
                with contextlib.suppress(OSError, ValueError):
                    out.write(line)
                    out.flush()
        pipe.close()

    threading.Thread(target=copy, name=f"buffer-output-{process.pid}", daemon=True).start()
