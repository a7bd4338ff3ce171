"""What whoever serves a buffer checks of an insert before the buffer takes it, and the
bound on inserts indexed at once: the coordinator (a buffer in its own process) and a
buffer process (services/buffer/host.py) both use these.

- `check_own_folder`: a worker inserts only what it wrote, into its own folder;
- `check_segment_file`: a reference describes its file (inside the job's segments
  folder, a regular file, the rows its header says);
- `InsertSlots`: at most `limit` inserts indexed at once; one more is told `429 busy`
  at once (`busy`), so a fleet that offers more than a core can index waits at its
  collectors, not in the server's queue where samples would wait behind it.
"""

from __future__ import annotations

import random
import threading

from common.errors import ApiError, bad_request
from common.messages import SegmentRef
from common.storage import CorruptFileError, PathError, SharedStore

#: The mean wait a `busy` insert is told to take (jittered by half either way, so the
#: collectors refused together do not come back together).
BUSY_RETRY_S = 0.2


def check_own_folder(
    job_id: str, refs: list[SegmentRef], worker_id: str, task_id: str | None
) -> None:
    """A collector's own folder is named "<its worker id>.<task id>".

    Raises:
        ApiError: 403 naming the first segment outside it.
    """
    own = f"{job_id}/segments/{worker_id}.{task_id}/"
    for i, ref in enumerate(refs):
        if not ref.path.startswith(own):
            raise ApiError(403, "forbidden", f"segments.{i}.path: not in {worker_id}'s own folder")


def check_segment_file(store: SharedStore, job_id: str, ref: SegmentRef, field: str) -> None:
    """A reference must describe its file: inside the job's segments folder, a
    regular file, and as many rows as its header says (a declared size is never
    trusted: it decides what the buffer evicts). Reads the header only.

    Raises:
        ApiError: 400 naming `field`'s path or rows.
    """
    try:
        rows = store.segment_rows(ref.path, under=f"{job_id}/segments")
    except PathError as exc:
        raise bad_request(f"{field}.path", str(exc)) from None
    except FileNotFoundError:
        raise bad_request(f"{field}.path", f"no file at '{ref.path}'") from None
    except (OSError, CorruptFileError) as exc:
        raise bad_request(f"{field}.path", f"not a readable segment: {exc}") from None
    if rows != ref.rows:
        raise bad_request(f"{field}.rows", f"{ref.rows} declared, the file holds {rows}")


class InsertSlot:
    def __init__(self, slots: InsertSlots | None) -> None:
        self._slots = slots

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.give_back()


class InsertSlots:
    """A count of the inserts being indexed, bounded by `limit` (0: unbounded)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0
        self._lock = threading.Lock()

    def take(self) -> InsertSlot | None:
        """A slot, or None when `limit` are taken."""
        with self._lock:
            if self.limit and self.taken >= self.limit:
                return None
            self.taken += 1
        return InsertSlot(self)

    def give_back(self) -> None:
        with self._lock:
            self.taken -= 1

    def busy(self) -> ApiError:
        """The answer to an insert that found every slot taken."""
        return ApiError(
            429,
            "busy",
            f"{self.limit} inserts are being indexed; retry shortly",
            retry_after_s=random.uniform(0.5, 1.5) * BUSY_RETRY_S,
        )
