"""The feeder's frames and its process's life (services/learner/feeder.py), without a
coordinator: it ends when its learner's end closes or asks it to, and a feeder that
dies fails the learner's next wait instead of hanging it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from services.learner.feeder import (
    CLOSE_WAIT_S,
    REPLY,
    TRAINED,
    FedArray,
    FedColumn,
    Feeder,
    FeederFailed,
    FeederStart,
    ProcessFeed,
    pack_arrays,
    read_trained,
    send_frame,
    trained_frame,
    unpack_arrays,
)


def start_for(tmp_path, url: str = "http://127.0.0.1:9") -> FeederStart:
    """A feeder's start whose coordinator cannot be reached (port 9: nothing listens)."""
    return FeederStart(
        coordinator_url=url,
        bearer="t" * 32,
        call_timeout_s=1.0,
        root=str(tmp_path),
        job_id="job-1",
        task_id="learn-1",
        batch_size=4,
        num_batches=2,
        sample_timeout_s=1.0,
        columns=[FedColumn(name="obs", kind="float", shape=[4], dtype="float32", high=0)],
        sequence_length=None,
    )


def test_arrays_go_through_a_frame_as_they_were():
    rng = np.random.default_rng(0)
    arrays = {
        "obs": rng.normal(size=(5, 4)).astype(np.float32),
        "action": np.arange(5, dtype=np.int64),
        "frames": rng.integers(0, 255, size=(5, 3, 7), dtype=np.uint8),
        "weights": np.ones(5, np.float32),
    }
    body: list[bytes] = []
    placed, size = pack_arrays(arrays, body, 0)
    more, size = pack_arrays({"next": np.full(3, 7.5)}, body, size)
    data = bytearray(b"".join(body))
    assert len(data) == size
    assert all(a.offset % 64 == 0 for a in placed + more)
    out = unpack_arrays(placed + more, data)
    for name, array in arrays.items():
        assert out[name].dtype == array.dtype and np.array_equal(out[name], array)
    assert np.array_equal(out["next"], np.full(3, 7.5))


def test_an_array_outside_its_frame_is_refused():
    body = bytearray(64)
    with pytest.raises(ValueError, match="obs lies outside"):
        unpack_arrays([FedArray(name="obs", dtype="<f4", shape=[5, 4], offset=0)], body)
    with pytest.raises(ValueError, match="lies outside"):
        unpack_arrays([FedArray(name="obs", dtype="<f4", shape=[1], offset=-4)], body)


def test_trained_priorities_go_through_a_frame_and_into_the_feeders_outbox(tmp_path):
    head, body = trained_frame("hold-1", [3, 2**62, 0], [0.5, 1e6, 0.0])
    assert read_trained(head, bytearray(body)) == ("hold-1", [3, 2**62, 0], [0.5, 1e6, 0.0])
    with pytest.raises(ValueError, match="2 keys but 1 priorities"):
        trained_frame(None, [1, 2], [1.0])
    with pytest.raises(ValueError, match="has 8 bytes"):
        read_trained(head, bytearray(8))

    ours, theirs = socket.socketpair()
    feeder = Feeder(theirs, start_for(tmp_path))
    feeder.credits = threading.Semaphore(0)
    listening = threading.Thread(target=feeder._listen_on, daemon=True)
    listening.start()
    send_frame(ours, TRAINED, head, body)
    send_frame(ours, TRAINED, *trained_frame(None, [9], [2.0]))
    for _ in range(2):  # each trained reply lets one more request go
        assert feeder.credits.acquire(timeout=5.0)
    assert feeder.outbox.take() == (["hold-1"], [3, 2**62, 0, 9], [0.5, 1e6, 0.0, 2.0])
    ours.close()  # the learner's end: the listener returns
    listening.join(timeout=5.0)
    assert not listening.is_alive()
    theirs.close()


def test_a_reply_frame_becomes_ready_batches(tmp_path):
    """The learner's reading thread views a reply's arrays in its body; the segments
    the feeder skipped join the task's unusable set."""
    ours, theirs = socket.socketpair()
    feeder = Feeder(theirs, start_for(tmp_path))
    feeder._reported.add("old")
    feeder.cache.unusable.update({"old", "job-1/segments/w/bad.safetensors"})

    class Batch:
        segments = []

    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    feeder.cache.gather = lambda batch: ({"obs": rows}, np.array([1.0, 0.5], np.float32), [7, 8])
    feeder._hand_over([Batch(), Batch()], "hold-9")
    unusable: set[str] = set()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        feed = ProcessFeed(process, ours, threading.Event(), unusable)
        reply = feed.next()
        assert reply is not None and reply.hold_id == "hold-9" and len(reply.batches) == 2
        for batch in reply.batches:
            assert batch.keys == [7, 8]
            assert np.array_equal(batch.columns["obs"], rows)
            assert np.array_equal(batch.weights, [1.0, 0.5])
        assert unusable == {"job-1/segments/w/bad.safetensors"}
    finally:
        process.kill()
        process.wait(5)
        theirs.close()
        ours.close()


def test_a_frame_the_learner_cannot_read_fails_its_wait_not_hangs_it():
    ours, theirs = socket.socketpair()
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        feed = ProcessFeed(process, ours, threading.Event(), set())
        send_frame(theirs, REPLY, b'{"batches": "no"}')
        with pytest.raises(FeederFailed, match="unreadable frame"):
            feed.next()
    finally:
        process.kill()
        process.wait(5)
        theirs.close()
        ours.close()


@pytest.mark.timeout(30)
def test_the_feeder_ends_when_its_learners_end_of_the_socket_closes(tmp_path):
    """A learner that dies closes its end (the kernel does): its feeder ends at once,
    even while its sample requests find no coordinator."""
    feed = ProcessFeed.start(start_for(tmp_path), threading.Event(), set())
    time.sleep(0.5)  # started and asking
    assert feed.process.poll() is None
    feed.sock.close()
    assert feed.process.wait(timeout=10) == 0


@pytest.mark.timeout(30)
def test_close_ends_the_feeder_within_its_bound(tmp_path):
    feed = ProcessFeed.start(start_for(tmp_path), threading.Event(), set())
    time.sleep(0.5)
    started = time.monotonic()
    feed.close()
    assert time.monotonic() - started < CLOSE_WAIT_S
    assert feed.process.returncode is not None


@pytest.mark.timeout(30)
def test_a_feeder_that_dies_fails_the_learners_wait(tmp_path):
    feed = ProcessFeed.start(start_for(tmp_path), threading.Event(), set())
    os.kill(feed.process.pid, signal.SIGKILL)
    with pytest.raises(FeederFailed, match="ended without a word"):
        feed.next()
    feed.close()


@pytest.mark.timeout(30)
def test_a_stopped_task_stops_waiting_for_its_feeder(tmp_path):
    stop = threading.Event()
    feed = ProcessFeed.start(start_for(tmp_path), stop, set())
    threading.Timer(0.5, stop.set).start()
    assert feed.next() is None  # no coordinator: no reply, but the task stopped
    feed.close()


def test_the_feeder_imports_no_torch():
    """It starts in a fraction of a second and holds no torch in memory."""
    code = "import sys, services.learner.feeder; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.timeout(30)
def test_a_feeder_started_ahead_is_the_first_tasks_and_one_let_go_of_ends(tmp_path):
    from services.learner import feeder

    feeder.start_spare()
    spare_pid = feeder._spare[0].pid
    feeder.start_spare()  # one ahead at most
    assert feeder._spare[0].pid == spare_pid
    feed = ProcessFeed.start(start_for(tmp_path), threading.Event(), set())
    assert feed.process.pid == spare_pid and feeder._spare is None
    feed.close()
    assert feed.process.returncode is not None

    feeder.start_spare()
    process = feeder._spare[0]
    feeder.discard_spare()
    assert feeder._spare is None
    assert process.wait(timeout=10) == 0  # it read the end of its socket: no error
