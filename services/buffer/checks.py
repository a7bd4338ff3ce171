"""What whoever serves a buffer checks of an insert before the buffer takes it, and the
bound on inserts indexed at once: the coordinator (a buffer in its own process) and a
buffer process (services/buffer/host.py) both use these.

- `check_own_folder`: a worker inserts only what it wrote, into its own folder;
- `check_segment_file`: a reference describes its file (inside the job's segments
  folder, a regular file, the rows its header says);
- `InsertSlots`: at most `limit` inserts indexed at once; one more is told `429 busy`
  at once (`busy`), so a fleet that offers more than a core can index waits at its
  collectors, not in the server's queue where samples would wait behind it;
- `sweep_orphans`: segment files no insert claimed are indexed (or deleted, when
  stale or unreadable).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

from common.errors import ApiError, bad_request
from common.messages import MAX_SAMPLE_ITEMS, MessageError, SampleRequest, SegmentRef, parse
from common.storage import CorruptFileError, PathError, SharedStore
from services.buffer.core import BufferClosed, ReplayBuffer

log = logging.getLogger(__name__)

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


def check_sample_request(request: SampleRequest) -> None:
    """What a sample request's fields cannot say alone: at most MAX_SAMPLE_ITEMS items
    in all, and a priority for each key.

    Raises:
        ApiError: 400 naming `num_batches` or `priorities`.
    """
    items = request.batch_size * request.num_batches
    if items > MAX_SAMPLE_ITEMS:
        raise bad_request(
            "num_batches",
            f"batch_size x num_batches = {items} exceeds {MAX_SAMPLE_ITEMS} items",
        )
    if len(request.priority_keys) != len(request.priorities):
        raise bad_request(
            "priorities",
            f"{len(request.priority_keys)} priority_keys but {len(request.priorities)} priorities",
        )


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
    """One taken slot; given back by `release`, or at the end of a `with` block."""

    def __init__(self, slots: InsertSlots | None) -> None:
        self._slots = slots

    def __enter__(self) -> InsertSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.give_back()


class InsertSlots:
    """A count of the inserts in progress, bounded by `limit` (0: unbounded)."""

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

    def take_or_busy(self, count_busy: Callable[[], None]) -> InsertSlot:
        """A slot; when `limit` are taken, `count_busy()` and the 429 `busy` raised."""
        slot = self.take()
        if slot is None:
            count_busy()
            raise self.busy()
        return slot

    def busy(self) -> ApiError:
        """The answer to an insert that found every slot taken."""
        return ApiError(
            429,
            "busy",
            f"{self.limit} inserts are being indexed; retry shortly",
            retry_after_s=random.uniform(0.5, 1.5) * BUSY_RETRY_S,
        )


def _younger(store: SharedStore, path: str, age_s: float) -> bool:
    """Whether the file at `path` is younger than `age_s` (False: it cannot be told,
    as for a link out of the root: left to the deletion, which refuses such links)."""
    try:
        return store.age_s(path) < age_s
    except (OSError, ValueError):
        return False


def sweep_orphans(
    store: SharedStore,
    job_id: str,
    buffer: ReplayBuffer,
    grace_s: float,
    account: Callable[[list[SegmentRef]], None],
    *,
    delete_after_s: float | None = None,
) -> int:
    """Index the job's segment files no insert claimed (a collector died between
    writing and inserting, or whoever serves the buffer restarted after acknowledging
    them) once `grace_s` old, calling `account` with what each indexed; delete the
    stale or unreadable ones once `delete_after_s` old (`grace_s` when None: a restart
    indexes every readable file at once, and leaves a new unreadable one to a later
    sweep, since its writer may be about to insert it). Returns how many were indexed.
    Disk work: call it holding no lock."""
    delete_after = grace_s if delete_after_s is None else delete_after_s
    root, indexed = f"{job_id}/segments", 0
    for folder in store.list_dir(root):
        try:
            names = store.list_dir(f"{root}/{folder}")
        except PathError as exc:  # a symlink out of the root: never listed
            log.warning("segment folder %s/%s is unusable (%s): skipped", root, folder, exc)
            continue
        for name in names:
            path = f"{root}/{folder}/{name}"
            if not buffer.owns(path):
                continue  # another shard's
            try:
                kind = buffer.classify(path)
                if kind == "known" or (kind == "new" and store.age_s(path) < grace_s):
                    continue
                if kind == "new":
                    ref = parse(SegmentRef, store.read_segment_header(path))
                    if ref.path != path:
                        raise ValueError(f"header names {ref.path}")
                    check_segment_file(store, job_id, ref, "header")
                    result = buffer.insert([ref], force=True)
                    account(result.accepted_refs)
                    indexed += result.accepted
                    continue
            except (ValueError, OSError, CorruptFileError, MessageError, ApiError) as exc:
                if delete_after > 0 and _younger(store, path, delete_after):
                    continue
                log.warning("segment %s is unusable (%s): deleting it", path, exc)
            except BufferClosed:
                return indexed
            try:
                store.delete(path)
            except PathError:  # a symlink out of the root is refused here too: left
                continue
    if indexed:
        log.info("job %s: indexed %d segment files found on disk", job_id, indexed)
    return indexed
