"""A collector's uploader thread that stops on an error fails its task, never hangs it."""

import threading
import time

import numpy as np
import pytest

from common.errors import ApiError
from common.messages import InsertReply, SegmentRef
from services.collector.uploader import PendingSegment, SegmentUploader, UploadFailed
from tests.fakes import CollectTaskContext
from tests.helpers import wait_until


class FullDisk:
    def write_segment(self, *args, **kwargs):
        raise OSError(28, "No space left on device")


class Store:
    def write_segment(self, *args, **kwargs):
        return 0


class Refusing:
    def insert_segments(self, *args, **kwargs):
        raise ApiError(400, "invalid", "segments.0.rows: 64 declared, the file holds 8")


class Accepting:
    def insert_segments(self, *args, **kwargs):
        return InsertReply(accepted=1, duplicates=0, env_steps=8)


def pending(seq):
    ref = SegmentRef(
        path=f"job-1/segments/w.collect-1/{seq:08d}.safetensors",
        rows=8,
        env_steps=8,
        policy_version=0,
    )
    return PendingSegment(columns={"obs": np.zeros((8, 4), np.float32)}, ref=ref)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("store", "coordinator", "reason"),
    [(FullDisk(), Accepting(), "No space left"), (Store(), Refusing(), "64 declared")],
    ids=["full disk", "insert refused for good"],
)
def test_a_dead_uploader_fails_the_task_with_its_reason(store, coordinator, reason):
    ctx = CollectTaskContext(coordinator)
    uploader = SegmentUploader(ctx, store, insert_timeout_s=0.0, max_pending=1)
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
    assert uploader.segments_sent == 5 and uploader.error is None


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
def test_segments_queued_during_an_insert_go_in_the_next_one():
    coordinator = Slow()
    ctx = CollectTaskContext(coordinator)
    uploader = SegmentUploader(ctx, Store(), insert_timeout_s=0.0, max_pending=2)
    uploader.put(pending(0))
    wait_until(lambda: coordinator.inserts, 5, "the first insert")
    for seq in (1, 2):  # queued while the first insert is out
        uploader.put(pending(seq))
    coordinator.release.set()
    uploader.close()
    path = [pending(seq).ref.path for seq in range(3)]
    assert coordinator.inserts == [[path[0]], [path[1], path[2]]]
    assert uploader.segments_sent == 3 and uploader.rows_acknowledged == 24
    assert uploader.error is None
