"""How a service process ends once it has stopped serving.

Usage (a service's `__main__`, after `serve` returns)::

    serve(app, ...)
    exit_without_teardown(0)
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn


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
