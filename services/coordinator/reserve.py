"""Room kept on the shared volume for the coordinator's own records.

A volume that fills and stays full must still let a job end: its end is recorded
(durable) before it is shown, and a record that finds no room would keep the job
`running` forever. So, as databases keep a reserve file, the coordinator keeps a
preallocated file under the shared root (`RESERVE_NAME`, hidden from job listings) and
gives it back when one of its record writes finds the volume full: the write is tried
again at once in the room that freed. The reserve is taken again once there is room
(each snapshot pass).

Usage::

    reserve = RoomReserve(store.root / RESERVE_NAME, size_bytes=16 << 20)
    reserve.keep()                                  # at start, and every snapshot pass
    reserve.write(lambda: write_job_record(...))    # raises only if even that is full
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from common.storage_full import volume_full

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The reserve's file name under the shared root (a dot name: no job folder).
RESERVE_NAME = ".drover-record-reserve"


class RoomReserve:
    """A preallocated file whose room is spent on a record write that found none."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self._lock = threading.Lock()

    def keep(self) -> bool:
        """Hold the reserve's room (allocated blocks, not a sparse file): True when
        it is held. Without room for it, nothing is left behind; tried again later."""
        if self.size_bytes <= 0:
            return False
        with self._lock:
            try:
                if self.path.stat().st_size == self.size_bytes:
                    return True
            except FileNotFoundError:
                pass
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size_bytes)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    self.path.unlink()
                if not volume_full(exc):
                    log.warning("cannot keep a reserve of room at %s: %s", self.path, exc)
                return False
            log.info("keeping %d MiB of room for records at %s", self.size_bytes >> 20, self.path)
            return True

    def spend(self) -> bool:
        """Give the reserve's room back to the volume: True when there was some."""
        with self._lock:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return False
            log.warning(
                "the shared volume is full: %d MiB of room kept for records given back",
                self.size_bytes >> 20,
            )
            return True

    def release(self) -> None:
        """Give the room back as the coordinator stops (quietly)."""
        with self._lock, contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def write(self, write: Callable[[], T]) -> T:
        """`write()`; when it finds the volume full, again in the reserve's room. Raises
        its error when that is spent too, or the error is not a full volume."""
        try:
            return write()
        except OSError as exc:
            if not volume_full(exc) or not self.spend():
                raise
        return write()


def write_kept(reserve: RoomReserve | None, write: Callable[[], T]) -> T:
    """`write()`, in the reserve's room when it finds none (without a reserve: as is)."""
    return write() if reserve is None else reserve.write(write)
