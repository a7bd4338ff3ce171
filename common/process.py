"""How a process ends: a service once it has stopped serving, a command on SIGTERM.

Usage (a service's `__main__`, after `serve` returns)::

    serve(app, ...)
    exit_without_teardown(0)

and a command that starts processes (`drover run`), first thing::

    stop_on_terminate()  # SIGTERM and SIGHUP now raise Terminated, as Ctrl-C would
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_terminate() -> None:
    """Make SIGTERM and SIGHUP stop this command as Ctrl-C does (`except
    KeyboardInterrupt` catches them too): `timeout`, a CI runner's cancel and a closed
    terminal then stop what it started, where Python's default would end this process
    alone and leave its children running. Main thread only (signal handlers)."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Once only: a second signal inside the stop the first one started would cut that
    # stop short. A Python handler, not SIG_IGN, because an ignored signal stays
    # ignored in the processes this one starts, and those must still stop on SIGTERM.
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGHUP, _ignore)
    raise Terminated(signum)


def _ignore(signum: int, frame: FrameType | None) -> None:
    pass


def exit_without_teardown(code: int) -> NoReturn:
    """End the process now that its work is done and on disk, skipping the interpreter's
    teardown of every module and object.

    That teardown frees torch's and every other module's objects one by one: a second
    or more in a collector or learner (bench/whole_run.py --timeline), which `drover
    run`, a container's stop and a rolling restart all wait for, and which leaves
    nothing behind that matters. What a normal exit does that does matter still
    happens, in the same order: threads that are not daemons are waited for, the
    atexit handlers run (logging's among them), and stdout and stderr are flushed.
    """
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    # The handlers a normal exit would run (multiprocessing's, logging's, the
    # libraries'); the interpreter runs them through this same call.
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # closed, or its pipe's reader is gone: nothing more can reach it
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


#: The snapshot thread's niceness: copying, hashing and writing a large buffer must
#: not take the cores from the threads that answer requests.
SNAPSHOT_NICENESS = 10


def yield_to_requests() -> None:
    """Lower the calling thread's CPU priority (Linux schedules threads one by one; a
    platform without per-thread priorities keeps its own)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SNAPSHOT_NICENESS)
