"""A full shared volume is a condition, not a failure: a write that finds no room
(ENOSPC, or EDQUOT: a quota) is tried again, with jittered backoff, until there is room
again or the job's `system.storage_grace_s` has passed without one succeeding, when the
last error is raised as it would have been at once. Meanwhile one log line a minute
says so, not one an attempt, and the task's progress (which its heartbeats carry)
holds how long it has waited (`ROOM_WAIT_KEY`): the coordinator shows the condition
and fails the job only when it lasts `storage_grace_s` with no progress.

Usage::

    size = retry_while_full(
        lambda: store.write_segment(path, columns),
        grace_s=config.system.storage_grace_s,
        stopped=ctx.dropping,
        what=f"segment {path}",
    )
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_any,
    wait_random_exponential,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The errors that say the volume has no room for the write.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Between attempts: jittered, doubling from RETRY_BASE_S up to RETRY_MAX_S seconds.
RETRY_BASE_S, RETRY_MAX_S = 0.5, 10.0
#: How often a write waiting for room says so.
LOG_EVERY_S = 60.0
#: The progress entry (seconds) of a task whose write waits for room.
ROOM_WAIT_KEY = "storage_full_s"


def volume_full(exc: BaseException) -> bool:
    """Whether `exc` says the volume has no room (for data or under a quota)."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def retry_while_full(
    write: Callable[[], T],
    *,
    grace_s: float,
    what: str,
    stopped: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], object] = time.sleep,
    on_full: Callable[[], None] | None = None,
    progress: dict[str, float] | None = None,
) -> T:
    """`write()`, tried again while the volume is full, for up to `grace_s` seconds (or
    until `stopped()`); any other error is raised at once.

    Args:
        what: what is written, for the log.
        sleep: waits between attempts (a task's own wait, which a stop ends early).
        on_full: called at each attempt that found the volume full (a metric).
        progress: the task's progress: `ROOM_WAIT_KEY` is the seconds waited so far,
            while it waits.
    """
    last_log = -math.inf

    def waiting(state: RetryCallState) -> None:
        nonlocal last_log
        if on_full is not None:
            on_full()
        if progress is not None:
            progress[ROOM_WAIT_KEY] = round(state.seconds_since_start, 1)
        now = time.monotonic()
        if now - last_log >= LOG_EVERY_S:
            last_log = now
            exc = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "the shared volume has no room for %s (%s): trying again, for up to %.0f s more",
                what,
                exc,
                max(0.0, grace_s - state.seconds_since_start),
            )

    retrying = Retrying(
        retry=retry_if_exception(volume_full),
        wait=wait_random_exponential(multiplier=RETRY_BASE_S, max=RETRY_MAX_S),
        stop=stop_any(stop_after_delay(grace_s), lambda _state: stopped()),
        sleep=sleep,
        before_sleep=waiting,
        reraise=True,
    )
    started = time.monotonic()
    try:
        result = retrying(write)
    finally:
        if progress is not None:
            progress.pop(ROOM_WAIT_KEY, None)
    if last_log > -math.inf:
        log.warning("%s written after %.0f s without room", what, time.monotonic() - started)
    return result


class WriteFailures:
    """How a loop that writes state now and then (a snapshot, a record) reports a write
    that failed: a full volume once a minute, with how many failed since (each attempt
    would say the same thing); any other error each time, with its traceback.

    Usage::

        failures = WriteFailures(log, "snapshot failed; the previous one stays in place")
        try:
            snapshot()
        except Exception as exc:
            failures.report(exc)
    """

    def __init__(self, logger: logging.Logger, message: str) -> None:
        self.log, self.message = logger, message
        self._last_s = -math.inf
        self._since = 0
        #: Writes that found the volume full, all told (a metric may read it).
        self.full = 0

    def report(self, exc: BaseException) -> None:
        if not volume_full(exc):
            self.log.error(self.message, exc_info=exc)
            return
        self.full += 1
        self._since += 1
        now = time.monotonic()
        if now - self._last_s >= LOG_EVERY_S:
            self.log.warning(
                "%s: the shared volume has no room (%s; %d such failure(s) since the last line)",
                self.message,
                exc,
                self._since,
            )
            self._last_s, self._since = now, 0
