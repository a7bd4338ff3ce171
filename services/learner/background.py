"""Work a learn task's training thread hands off: writing a policy version (safetensors,
sha256, fsync, then the announce) or a checkpoint takes milliseconds that the next
updates need not wait for.

One job at a time, in the order handed off: a new job first waits for the one before
it, so versions are written and announced in order, never two at once, and a slow
disk holds the training thread back by at most one job instead of letting writes pile
up. A job's exception is raised again on the training thread, at its next `check`,
`submit` or `wait`, where the same call inline would have raised it.

Usage::

    writes = BackgroundWrites("publish")
    writes.submit(write_and_announce, version, tensors)   # the caller snapshots first
    writes.check()           # each iteration: a failed job raises here
    writes.wait()            # before the last checkpoint: the job under way ends
    writes.close()           # in a finally: waits, raises nothing
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

log = logging.getLogger(__name__)


class BackgroundWrites:
    """One thread that runs handed-off jobs one at a time (see the module's docstring)."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._pending: Future[None] | None = None

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        """Run `job(*args)` on the thread, once the job before it has ended (raising
        that one's exception, if it failed, instead of starting this one)."""
        self.wait()
        self._pending = self._pool.submit(job, *args)

    def check(self) -> None:
        """Raise the exception of the job handed off last if it has failed (it is then
        forgotten); return at once otherwise."""
        pending = self._pending
        if pending is not None and pending.done():
            self._pending = None
            pending.result()

    def wait(self) -> None:
        """Wait for the job under way, if any, raising its exception."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Let the job under way end and stop the thread. For a `finally`: raises
        nothing (a failure an exception already on its way would hide is logged)."""
        try:
            self.wait()
        except Exception:
            log.exception("a background write failed while the task ended")
        finally:
            self._pool.shutdown(wait=True)


def copy_state(state: Any) -> Any:
    """A (nested) state dict with every tensor copied, so that training can go on while
    the copy is written. The copies are on the CPU: that is where they are written
    from, and one copy serves both (`Tensor.to(copy=True)`)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: copy_state(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(copy_state(value) for value in state)
    return state
