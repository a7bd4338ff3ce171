"""The coordinator's one lock, and the rule that goes with it: state changes in
memory under the lock; the disk work a change needs runs after the lock is let go.

    with guard.changing():
        job.phase = "..."                      # memory, under the lock
        guard.defer(lambda: store.write(...))  # disk, once the lock is released
        guard.defer(lambda: store.write_json(path, record), latest_of=path)

A file written whole whose newest content is what counts (a pointer, a record) is
deferred `latest_of` it: its writes land in the order their changes were made, and
one that finds the shared volume full is kept and tried again (`retry_kept`, from the
snapshot thread) until it, or a newer one, lands.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from common.storage_full import WriteFailures, volume_full

log = logging.getLogger(__name__)


class ChangeLock:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._changed = threading.Condition(self.lock)
        self._dirty = False
        #: Per thread: how deep in `changing` it is, and the disk work it deferred.
        self._local = threading.local()
        self._failures = WriteFailures(log, "deferred disk work failed")
        self.latest = LatestWrites()

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

    def defer(self, effect: Callable[[], Any], *, latest_of: str | None = None) -> None:
        """Run `effect` once the current change releases the lock (now, outside one).

        `latest_of`: the file `effect` writes whole (module doc): an older write of it
        never lands after a newer one, and one that finds no room is kept."""
        if latest_of is not None:
            write, number = effect, self.latest.number()
            effect = lambda: self.latest.run(latest_of, number, write)  # noqa: E731
        if getattr(self._local, "depth", 0):
            self._local.effects.append(effect)
        else:
            effect()

    def retry_kept(self) -> None:
        """Try again the writes kept for want of room (call without the lock)."""
        try:
            self.latest.retry()
        except Exception as exc:
            self._failures.report(exc)

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


class LatestWrites:
    """Writes of whole files whose newest content is what counts, numbered in the order
    their changes were made (`number`, under the coordinator's lock): one older than a
    write that landed is dropped, and one that found the volume full is kept, the
    newest of each file, until it or a newer one lands (`retry`)."""

    #: Files whose last landed write is remembered (the oldest forgotten past it).
    REMEMBERED = 10_000

    def __init__(self) -> None:
        #: One write at a time: the check of what landed and the write go together.
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._landed: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._kept: dict[str, tuple[int, Callable[[], Any]]] = {}

    def number(self) -> int:
        return next(self._numbers)

    @property
    def kept(self) -> int:
        """Writes waiting for room."""
        return len(self._kept)

    def run(self, path: str, number: int, write: Callable[[], Any]) -> None:
        with self._lock:
            if self._landed.get(path, 0) > number:
                return  # a newer write of the file landed
            try:
                write()
            except Exception as exc:
                if volume_full(exc) and self._kept.get(path, (0, None))[0] < number:
                    self._kept[path] = (number, write)
                raise
            self._landed[path] = number
            self._landed.move_to_end(path)
            while len(self._landed) > self.REMEMBERED:
                self._landed.popitem(last=False)
            kept = self._kept.get(path)
            if kept is not None and kept[0] <= number:
                del self._kept[path]

    def retry(self) -> None:
        """Each kept write again, oldest first; raises the first that fails (the rest
        wait for the next try: the volume is still full)."""
        for path, (number, write) in sorted(self._kept.items(), key=lambda kv: kv[1][0]):
            self.run(path, number, write)


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
