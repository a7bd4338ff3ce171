"""A fork server for the local cluster: the collectors and learners of `drover run`
forked from one process that has imported what they import.

Each of those services imports torch and the services' modules (about a second and a
half of CPU, and 200 MB that each would hold alone). The fork server imports them
once, beside the coordinator's start, and then forks every collector and learner from
itself: each starts with the imports done, and the pages the imports filled stay
shared between them until one writes to them. What runs in a forked process is what
`python -m services.<name>` runs: the module's `__main__`, run by runpy, with the
service's own environment, working directory, session and log; compose and
Kubernetes start the same modules with `python -m`.

Protocol, on the server's stdin and stdout, one JSON object a line (no pickle):

    -> {"module": "services.collector", "args": [], "env": {...}, "cwd": "...", "log": "..."}
    <- {"pid": 1234}          or  {"error": "..."}

The launcher (`ForkServer`) makes itself a child subreaper and the server forks twice,
so each service's parent is the launcher: it waits for it, signals it and reads its
exit status as it would a process it started itself (`ForkedProcess`).

The server imports and starts no thread before it forks (torch's thread pools start at
the first operation, never at import), so each child starts as a fresh process would.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from common.process import exit_without_teardown
from common.settings import without_secrets

#: What the collectors and learners import at start or at their first task, but for
#: the modules that start threads when imported (the learner's segment reads): a fork
#: keeps only the thread that forked, so those are imported in each child. torch's
#: compiler module is not here (1.2-1.4 s of CPU that every service would wait for):
#: only a learner needs it, for torch.optim, and imports it on a thread of its own as
#: it starts (algorithms.step.warm_up_soon). Everything is imported before the first
#: fork: what the server imports after one copies the pages it shares with the
#: children forked before (bench/memory.py).
PRELOAD = (
    "services.collector.app",
    "services.slave.main",
    "services.learner.group",
    "services.learner.resume",
    "services.learner.tensorboard",
    "services.learner.metrics",
    "services.learner.guards",
    "common.env_guard",
    "algorithms.registry",
    "algorithms.dqn.learner",
)


#: How long a request may wait for its answer: the preload before it (torch's import
#: on a busy machine) and the fork.
SPAWN_TIMEOUT_S = 120.0

#: prctl's option that makes orphaned descendants this process's children.
_PR_SET_CHILD_SUBREAPER = 36


# --- the server --------------------------------------------------------------------------


def serve(stdin: IO[str], stdout: IO[str]) -> None:
    """Preload, then fork one service per request line until stdin closes; once no
    request has come for IDLE_S, hand back the code pages only this process maps."""
    preload(PRELOAD)
    handed_back = True  # nothing forked yet: the children will want these pages
    while True:
        # The launcher sends a request only once the last one is answered, so no line
        # waits in stdin's buffer while select says nothing is readable.
        if not handed_back and not select.select([stdin], [], [], IDLE_S)[0]:
            hand_back_unshared_code()
            handed_back = True
        line = stdin.readline()
        if not line:
            break
        try:
            request = json.loads(line)
            reply: dict[str, Any] = {"pid": fork_service(request)}
        except Exception as exc:  # a bad request or a failed fork: the launcher says why
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()
        handed_back = False
    # The launcher closed our stdin: the services run on. Nothing here needs the
    # interpreter's teardown (a second with torch loaded).
    exit_without_teardown(0)


#: How long the server waits for another request before `hand_back_unshared_code`.
IDLE_S = 0.2

#: madvise's advice to reclaim pages now (Linux 5.4 and later).
_MADV_PAGEOUT = 21


def hand_back_unshared_code() -> None:
    """Ask the kernel to reclaim the pages of this process's code (its libraries' and
    python's executable mappings) that no other process maps.

    Importing torch runs code that nothing runs again, torch's start-up (about 40 MB
    of libtorch_cpu.so here); the children never touch it, so those pages stay mapped
    by this process alone, counted in full in its memory (bench/memory.py), for as
    long as it waits for the next fork. Pages the children map as well are left as
    they are (the kernel reclaims a page only where it is mapped once), and a page
    reclaimed here is read back from its file if ever needed again: nothing but
    memory changes. Skipped where the kernel has no MADV_PAGEOUT."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/self/maps") as maps:
            regions = [line.split() for line in maps]
    except OSError:
        return
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    advised = 0
    for region in regions:
        # r-xp with a path: code read from a file, never written, so never dirty.
        if len(region) < 6 or region[1] != "r-xp" or not region[5].startswith("/"):
            continue
        start, end = (int(bound, 16) for bound in region[0].split("-"))
        if libc.madvise(start, end - start, _MADV_PAGEOUT) == 0:
            advised += 1
        elif not advised:
            return  # the first refused: a kernel without MADV_PAGEOUT


def preload(modules: tuple[str, ...]) -> None:
    """Import `modules`, checking that no thread was started."""
    for name in modules:
        importlib.import_module(name)
    started = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if started:
        # A child would lack them (and any lock they held could stay taken there):
        # exit, and the launcher starts each service as a fresh python instead.
        raise SystemExit(f"drover.forkserver: the preload started threads {started}")
    # Objects that exist now are never collected in the children: a collection there
    # would write to every page it scans and so copy it.
    gc.freeze()


def fork_service(request: dict[str, Any]) -> int:
    """Fork twice: the grandchild becomes the service; the child exits at once, so the
    grandchild is re-parented to the launcher (a subreaper). Returns its pid."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        try:
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write_fd)
                become_service(request)  # never returns
            os.write(write_fd, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        pid_text = pipe.read()
    os.waitpid(child, 0)
    if not pid_text:
        raise OSError("the service's process could not be forked")
    return int(pid_text)


def become_service(request: dict[str, Any]) -> None:
    """In the forked process: what `python -m <module> <args>` in `cwd` with `env`, its
    output to `log`, in a session of its own, would be; then exit with its status."""
    code = 1
    try:
        os.setsid()
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # The streams were the server's pipes: now the log, line by line
        # (PYTHONUNBUFFERED's effect on a fresh interpreter).
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.argv = [sys.executable, *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        exit_without_teardown(code)


def exit_code(code: Any) -> int:
    """The status `sys.exit(code)` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


# --- the launcher's side -------------------------------------------------------------------


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux); False where that
    cannot be done, and then no fork server can be used."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return False


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The fork server's own environment: the launcher's, without its secrets (each
    service gets its own environment with each request), and with nothing in the
    working directory importable."""
    return {
        **without_secrets(environ),
        "PYTHONSAFEPATH": "1",
        "PYTHONUNBUFFERED": "1",
    }


class ForkServer:
    """The server process, started at once; its preload runs while the launcher starts
    the coordinator. `spawn` waits for the preload the first time.

    `drover run` starts it before the command's own imports (`ForkServer.early`, from
    drover/__main__.py): the preload is what the first learner and collectors wait
    for, so it goes first."""

    def __init__(self, env: dict[str, str], cwd: Path, log_path: Path | None) -> None:
        """`log_path`: where the server's own output goes (it writes only when it
        fails); None: the launcher's stderr."""
        with contextlib.ExitStack() as stack:
            log = None if log_path is None else stack.enter_context(open(log_path, "ab"))
            self.process = subprocess.Popen(
                [sys.executable, "-m", "drover.forkserver"],
                env=env,
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                # Its own session: Ctrl-C reaches only the launcher.
                start_new_session=True,
            )
        #: A request is written but its answer was never read (Ctrl-C or SIGTERM came
        #: while `spawn` waited): the server forks that service all the same, and
        #: `close` stops it.
        self._unanswered = False

    @classmethod
    def early(cls) -> ForkServer | None:
        """A server started now, from the launcher's environment and working directory,
        its output on the launcher's stderr; None where no fork server can be used."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            return cls(server_env(os.environ), Path.cwd(), None)
        except OSError:
            return None

    def discard(self) -> None:
        """Stop a server that will fork nothing (the command ended before it needed
        one) now, preload or not; nothing to do once it has ended or been closed."""
        self.process.kill()
        self.close()

    def spawn(
        self, module: str, args: list[str], env: dict[str, str], cwd: Path, log_path: Path
    ) -> ForkedProcess:
        """A service forked from the server.

        Raises:
            OSError: the server is gone or could not fork it.
        """
        assert self.process.stdin is not None and self.process.stdout is not None
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd)}
        request["log"] = str(log_path)
        # An answer may wait for a preload; a server that gives none in time is
        # stopped, and the services start as fresh pythons.
        timeout_s = SPAWN_TIMEOUT_S
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            self._unanswered = True
            line = self._answer(timeout_s)
            self._unanswered = False
        except (OSError, ValueError) as exc:
            raise OSError(f"the fork server is gone: {exc}") from None
        if line is None:
            self.process.kill()
            self.process.wait()
            raise OSError(f"the fork server gave no answer within {timeout_s:g} s")
        if not line:
            raise OSError(f"the fork server exited ({self.process.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise OSError(f"the fork server could not start {module}: {reply['error']}")
        return ForkedProcess(int(reply["pid"]))

    def _answer(self, timeout_s: float) -> str | None:
        """The answer's line ("" once the server has exited); None if none came."""
        assert self.process.stdout is not None
        # One request at a time, answered by one whole line: once the pipe is
        # readable, the line is there.
        readable, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        return self.process.stdout.readline() if readable else None

    def end(self) -> None:
        """Tell the server to end (its stdin closes) without waiting for it: `close`
        then waits for less. It forks nothing more."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """End the server (its stdin closes) and wait for it; the services it forked run
        on, but for one whose answer was never read, which is stopped here (no one else
        knows it)."""
        self.end()
        if self._unanswered:
            self._unanswered = False
            self._stop_unanswered(timeout_s)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _stop_unanswered(self, timeout_s: float) -> None:
        try:
            line = self._answer(SPAWN_TIMEOUT_S)  # the preload may still be under way
            pid = int(json.loads(line)["pid"]) if line else None
        except (OSError, ValueError, KeyError, TypeError):  # gone, or it could not fork
            pid = None
        if pid is None:
            return
        forked = ForkedProcess(pid)
        # ChildProcessError: not this process's child (no subreaper), or reaped already
        with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
            forked.send_signal(signal.SIGTERM)
            try:
                forked.wait(timeout_s)
            except subprocess.TimeoutExpired:
                forked.kill()
                forked.wait(timeout_s)


class ForkedProcess:
    """A service forked by the server, a child of this process (its subreaper): what
    LocalCluster uses of subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, once it has exited.

        Raises:
            subprocess.TimeoutExpired: still running after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            exited: int | None = os.pidfd_open(self.pid)
        except (OSError, AttributeError):  # gone already, or no pidfd here
            exited = None
        try:
            while self.poll() is None:
                left_s = None if deadline is None else deadline - time.monotonic()
                if left_s is not None and left_s <= 0:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
                if exited is not None:
                    select.select([exited], [], [], left_s)  # readable once it exits
                else:
                    time.sleep(0.05 if left_s is None else min(0.05, left_s))
        finally:
            if exited is not None:
                os.close(exited)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.stdin, sys.stdout)
