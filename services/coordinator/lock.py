"""The coordinator's one lock, and the rule that goes with it: state changes in
memory under the lock; the disk work a change needs runs after the lock is let go.

    with guard.changing():
        job.phase = "..."                      # memory, under the lock
        guard.defer(lambda: store.write(...))  # disk, once the lock is released
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from common.storage_full import WriteFailures

log = logging.getLogger(__name__)


class ChangeLock:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._dirty = False
        #: Per thread: how deep in `changing` it is, and the disk work it deferred.
        self._local = threading.local()
        self._failures = WriteFailures(log, "deferred disk work failed")

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Hold the lock for a change of state. Disk work the change needs (`defer`)
        runs after the lock is released, in order, in this thread: before the caller
        answers, and never while another request waits for the lock."""
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._local.effects = []
        self._local.depth = depth + 1
        try:
            with self.lock:
                yield
        finally:
            self._local.depth = depth
            if depth == 0:
                effects, self._local.effects = self._local.effects, []
                for effect in effects:
                    try:
                        effect()
                    except Exception as exc:
                        self._failures.report(exc)

    def defer(self, effect: Callable[[], Any]) -> None:
        """Run `effect` once the current change releases the lock (now, outside one)."""
        if getattr(self._local, "depth", 0):
            self._local.effects.append(effect)
        else:
            effect()

    def notify(self) -> None:
        """Something the scheduler or a waiting request cares about changed (call
        holding the lock)."""
        self._dirty = True
        self._changed.notify_all()

    def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Wait (holding the lock, which waiting releases) until `ready()`."""
        return self._changed.wait_for(ready, timeout_s)

    def wait_for_change(self, timeout_s: float) -> None:
        """Block until something changed since the last call, or `timeout_s`."""
        with self._changed:
            if not self._dirty:
                self._changed.wait(timeout_s)
            self._dirty = False


class BoundedWaits:
    """Requests waiting on the guard for something to happen (a long-poll), at most
    `limit` at once: each holds a server thread, so past the limit a request is
    answered at once instead, and its client asks again."""

    def __init__(self, guard: ChangeLock, limit: int) -> None:
        self.guard = guard
        self.limit = limit
        #: Requests waiting now (changed only holding the guard's lock).
        self.waiting = 0

    def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> None:
        """Wait (holding the guard's lock, which waiting releases) until `ready()` or
        `timeout_s`; at once when `timeout_s` is 0 or `limit` requests already wait."""
        if timeout_s <= 0 or self.waiting >= self.limit:
            return
        self.waiting += 1
        try:
            self.guard.wait_for(ready, timeout_s)
        finally:
            self.waiting -= 1
