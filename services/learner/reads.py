"""File reads that may never return, run where they cannot hold up training.

A read of a file on the shared file system can block in the kernel with nothing to
interrupt it: a hung network mount, or a FIFO opened the blocking way. Reads run on a
few daemon threads; whoever needs a result waits for it with a bound, and a read past
its bound keeps its thread while a new thread takes that thread's place, so the reads
after it go on.

Usage::

    read = READS.submit(lambda: store.read_segment(path))
    try:
        columns = READS.result(read, timeout_s=5.0)
    except TimeoutError:
        ...  # skip the file: its read holds a thread, never the caller
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

#: Threads a process reads segment files on (reads release the GIL, so a few overlap).
READ_THREADS = 4


@dataclass(eq=False)
class Read:
    """One read: what it calls and its future."""

    call: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)
    #: Set when its call returned (or raised).
    done: bool = False
    #: Set when a waiter gave up on it while it ran: its thread leaves once it returns.
    abandoned: bool = False


class BoundedReads:
    """Daemon threads that run reads, `size` at a time, each waited for with a bound.

    Daemon threads, so one stuck in a read never holds the process at exit (an
    executor's threads are joined then). Threads are added only to replace one that
    is stuck, so there are `size` plus one per read that never returned.
    """

    def __init__(self, size: int = READ_THREADS, name: str = "segment-read") -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Read] = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: Threads started in all (replacements included).
        self.threads_started = 0
        for _ in range(size):
            self._add_thread()

    def submit(self, call: Callable[[], Any]) -> Read:
        """Queue `call` for the next free thread."""
        read = Read(call)
        self._jobs.put(read)
        return read

    def result(self, read: Read, timeout_s: float) -> Any:
        """What the read returned (or raised), waited for at most `timeout_s`.

        Raises:
            TimeoutError: not done in time. A read still queued is dropped; a read
                under way goes on on its thread, and another thread takes its place.
        """
        try:
            return read.future.result(timeout=max(0.0, timeout_s))
        except TimeoutError:
            if not read.future.cancel():  # under way (a queued one is cancelled)
                with self._lock:
                    replace = not read.done and not read.abandoned
                    read.abandoned = read.abandoned or replace
                if replace:
                    self._add_thread()
            raise

    def _add_thread(self) -> None:
        with self._lock:
            self.threads_started += 1
        threading.Thread(target=self._work, name=self.name, daemon=True).start()

    def _work(self) -> None:
        while True:
            read = self._jobs.get()
            if not read.future.set_running_or_notify_cancel():
                continue  # cancelled: its waiter gave up before it started
            try:
                read.future.set_result(read.call())
            except BaseException as exc:  # handed to whoever waits for the result
                read.future.set_exception(exc)
            with self._lock:
                read.done = True
                if read.abandoned:
                    return  # another thread took this one's place meanwhile


#: The learner process's segment reads.
READS = BoundedReads()
