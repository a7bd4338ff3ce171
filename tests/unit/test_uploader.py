"""A collector's uploader: a thread that stops on an error fails its task, never hangs
it; the chunks queued during an upload go as one segment in the next."""

import threading
import time

import numpy as np
import pytest

from common.errors import ApiError
from common.messages import InsertReply, SegmentRef
from common.storage import SharedStore
from services.collector.uploader import PendingSegment, SegmentUploader, UploadFailed
from tests.fakes import CollectTaskContext
from tests.helpers import fill, tmpfs, wait_until


class FullDisk:
    def write_segment(self, *args, **kwargs):
        raise OSError(28, "No space left on device")


class Store:
    """Keeps what each write was given."""

    def __init__(self) -> None:
        self.written: dict[str, tuple[dict, dict]] = {}

    def write_segment(self, path, columns, header=None):
        self.written[path] = (columns, header)
        return 0


class Refusing:
    def insert_segments(self, *args, **kwargs):
        raise ApiError(400, "invalid", "segments.0.rows: 64 declared, the file holds 8")


class Accepting:
    def insert_segments(self, *args, **kwargs):
        return InsertReply(accepted=1, duplicates=0, env_steps=8)


def pending(seq, version=0):
    ref = SegmentRef(
        path=f"job-1/segments/w.collect-1/{seq:08d}.safetensors",
        rows=8,
        env_steps=8,
        policy_version=version,
        episode_returns=[float(seq)],
        episode_lengths=[seq + 1],
    )
    return PendingSegment(columns={"obs": np.full((8, 4), seq, np.float32)}, ref=ref)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("store", "coordinator", "reason"),
    [(FullDisk(), Accepting(), "No space left"), (Store(), Refusing(), "64 declared")],
    ids=["full disk", "insert refused for good"],
)
def test_a_dead_uploader_fails_the_task_with_its_reason(store, coordinator, reason):
    """(A full disk fails the task once `storage_grace_s` has passed without room.)"""
    ctx = CollectTaskContext(coordinator)
    uploader = SegmentUploader(ctx, store, insert_timeout_s=0.0, max_rows=8, storage_grace_s=1.0)
    started = time.monotonic()
    with pytest.raises(UploadFailed, match=reason):
        for seq in range(100):  # the queue would fill and block forever before
            uploader.put(pending(seq))
    assert time.monotonic() - started < 10
    uploader.close(timeout_s=2)


def test_a_working_uploader_acknowledges_every_segment():
    ctx = CollectTaskContext(Accepting())
    uploader = SegmentUploader(ctx, Store(), insert_timeout_s=0.0)
    for seq in range(5):
        uploader.put(pending(seq))
    uploader.close()
    assert uploader.rows_acknowledged == 40 and uploader.error is None


class Slow:
    """Holds the first insert until released, recording what each insert carried."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.inserts: list[list[str]] = []

    def insert_segments(self, job_id, refs, **kwargs):
        self.inserts.append([ref.path for ref in refs])
        self.release.wait(5)
        return InsertReply(accepted=len(refs), duplicates=0, env_steps=8 * len(refs))


@pytest.mark.timeout(20)
def test_chunks_queued_during_an_upload_go_as_one_segment_per_version():
    coordinator, store = Slow(), Store()
    ctx = CollectTaskContext(coordinator)
    uploader = SegmentUploader(ctx, store, insert_timeout_s=0.0, max_rows=32)
    uploader.put(pending(0))
    wait_until(lambda: coordinator.inserts, 5, "the first insert")
    for seq, version in ((1, 0), (2, 0), (3, 1), (4, 1)):  # queued meanwhile
        uploader.put(pending(seq, version))
    coordinator.release.set()
    uploader.close()
    path = [pending(seq).ref.path for seq in range(5)]
    # One upload of chunks 1-4, as two files: the version changes at 3.
    assert coordinator.inserts == [[path[0]], [path[1], path[3]]]
    columns, header = store.written[path[1]]
    np.testing.assert_array_equal(columns["obs"][:, 0], [1] * 8 + [2] * 8)
    assert header["rows"] == 16 and header["env_steps"] == 16
    assert header["episode_returns"] == [1.0, 2.0] and header["episode_lengths"] == [2, 3]
    assert uploader.segments_sent == 3 and uploader.rows_acknowledged == 40
    assert uploader.error is None


@pytest.mark.timeout(20)
def test_put_waits_while_the_queue_holds_max_rows():
    coordinator = Slow()
    uploader = SegmentUploader(
        CollectTaskContext(coordinator), Store(), insert_timeout_s=0.0, max_rows=16
    )
    uploader.put(pending(0))
    wait_until(lambda: coordinator.inserts, 5, "the first insert")
    uploader.put(pending(1))
    uploader.put(pending(2))  # 16 rows queued: full
    third = threading.Thread(target=uploader.put, args=(pending(3),))
    third.start()
    third.join(0.5)
    assert third.is_alive()  # waits for room
    coordinator.release.set()
    third.join(5)
    assert not third.is_alive()
    uploader.close()
    assert uploader.rows_acknowledged == 32


@pytest.mark.timeout(20)
def test_a_full_queue_starts_the_upload_without_waiting_for_the_oldest_chunk():
    coordinator = Slow()
    coordinator.release.set()
    uploader = SegmentUploader(
        CollectTaskContext(coordinator), Store(), insert_timeout_s=0.0, max_rows=12, wait_s=30.0
    )
    started = time.monotonic()
    for seq in range(3):  # the second fills the queue; the third waits for room
        uploader.put(pending(seq))
    assert time.monotonic() - started < 5  # not the 30 s the oldest chunk may wait
    uploader.close()
    assert uploader.rows_acknowledged == 24


@pytest.fixture
def small_volume(tmp_path):
    with tmpfs(tmp_path / "volume", "1m") as root:
        yield root


@pytest.mark.timeout(60)
def test_a_full_volume_pauses_the_uploader_and_room_again_resumes_it(small_volume):
    """A real ENOSPC: the uploader tries again (the queue fills, `put` waits: stepping
    pauses), nothing is inserted or lost meanwhile, and once there is room every
    segment is written and acknowledged."""
    filler = small_volume / "filler"
    fill(filler)
    ctx = CollectTaskContext(Accepting())
    uploader = SegmentUploader(
        ctx, SharedStore(small_volume), insert_timeout_s=0.0, max_rows=8, storage_grace_s=30.0
    )
    put = threading.Thread(target=lambda: [uploader.put(pending(seq)) for seq in range(6)])
    put.start()
    wait_until(lambda: uploader.metrics.storage_full_retries._value.get() >= 2, 20, "retries")
    assert uploader.rows_acknowledged == 0 and uploader.error is None
    assert put.is_alive()  # the queue is full: the loop waits, nothing is dropped
    filler.unlink()  # room again
    put.join(20)
    uploader.close(timeout_s=20)
    assert uploader.error is None and uploader.rows_acknowledged == 6 * 8
    written = sorted(p.name for p in (small_volume / "job-1/segments/w.collect-1").iterdir())
    assert written == [f"{seq:08d}.safetensors" for seq in range(6)]  # no temp file left
