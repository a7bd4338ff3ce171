"""A full shared volume is a condition, not a failure: a write that finds no room
(ENOSPC, or EDQUOT: a quota) is tried again, with jittered backoff, until there is room
again or the job's `system.storage_grace_s` has passed without one succeeding, when the
last error is raised as it would have been at once. Meanwhile one log line a minute
says so, not one an attempt.

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
) -> T:
    """`write()`, tried again while the volume is full, for up to `grace_s` seconds (or
    until `stopped()`); any other error is raised at once.

    Args:
        what: what is written, for the log.
        sleep: waits between attempts (a task's own wait, which a stop ends early).
        on_full: called at each attempt that found the volume full (a metric).
    """
    last_log = -math.inf

    def waiting(state: RetryCallState) -> None:
        nonlocal last_log
        if on_full is not None:
            on_full()
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
    result = retrying(write)
    if last_log > -math.inf:
        log.warning("%s written after %.0f s without room", what, time.monotonic() - started)
    return result
