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

from services.learner import feeder as feeder_module
from services.learner.feeder import (
    AHEAD,
    BATCH,
    CLOSE_WAIT_S,
    IOV_MAX,
    KEYS,
    TAKEN,
    TRAINED,
    WEIGHTS,
    FedArray,
    FedColumn,
    FedFrame,
    Feeder,
    FeederFailed,
    FeederStart,
    ProcessFeed,
    pack_batches,
    read_trained,
    recv_frame,
    send_frame,
    trained_frame,
    unpack_arrays,
    unpack_batches,
)
from tests.helpers import wait_until


def start_for(tmp_path, url: str = "http://127.0.0.1:9") -> FeederStart:
    """A feeder's start whose coordinator cannot be reached (port 9: nothing listens)."""
    return FeederStart(
        data_urls=[url],
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


def batch_of(rng: np.random.Generator, rows: int, first_key: int):
    """A gathered batch: its columns, weights and keys (`SegmentCache.gather`'s)."""
    columns = {
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "action": np.arange(rows, dtype=np.int64),
        "frames": rng.integers(0, 255, size=(rows, 3, 7), dtype=np.uint8),
    }
    weights = rng.uniform(size=rows).astype(np.float32)
    return columns, weights, list(range(first_key, first_key + rows))


def through_a_frame(batches) -> list:
    rows, placed, body = pack_batches(batches)
    data = bytearray(b"".join(bytes(part) for part in body))
    assert all(a.offset % 64 == 0 for a in placed)
    frame = FedFrame(batch_rows=rows, arrays=placed, last=True, hold_id=None, unusable=[])
    return unpack_batches(frame, data)


def test_batches_go_through_a_frame_as_they_were_column_by_column():
    """Each column is one array of every batch's rows; a batch of no rows (all its
    segments unusable) has none of them and comes out empty."""
    rng = np.random.default_rng(0)
    batches = [batch_of(rng, 5, 0), ({}, np.zeros(0, np.float32), []), batch_of(rng, 3, 2**62)]
    rows, placed, _ = pack_batches(batches)
    assert rows == [5, 0, 3]
    assert {a.name: a.shape for a in placed} == {
        "obs": [8, 4],
        "action": [8],
        "frames": [8, 3, 7],
        WEIGHTS: [8],
        KEYS: [8],
    }
    out = through_a_frame(batches)
    assert len(out) == 3
    for got, (columns, weights, keys) in zip(out, batches, strict=True):
        assert got.keys == keys and np.array_equal(got.weights, weights)
        assert got.weights.dtype == np.float32
        for name, array in columns.items():
            assert got.columns[name].dtype == array.dtype
            assert np.array_equal(got.columns[name], array)
    assert all(len(a) == 0 for a in out[1].columns.values())
    empty = through_a_frame([({}, np.zeros(0, np.float32), [])])
    assert len(empty) == 1 and empty[0].columns == {} and empty[0].keys == []
    assert through_a_frame([]) == []


def frame_parts(rng: np.random.Generator, count: int) -> list:
    """A body of `count` parts of odd sizes, views and bytes, some of them empty."""
    parts: list = []
    for i in range(count):
        size = int(rng.integers(0, 5000))
        data = rng.integers(0, 255, size=size, dtype=np.uint8)
        parts.append(memoryview(data) if i % 2 else data.tobytes())
    return parts


def test_a_frame_of_many_parts_comes_whole_through_the_socket():
    """More parts than one call may carry, and more bytes than the socket holds: the
    reading end gets the frame whole, byte for byte."""
    rng = np.random.default_rng(0)
    parts = frame_parts(rng, IOV_MAX + 300)
    expected = b"".join(bytes(part) for part in parts)
    assert len(expected) > 2**20  # past a socket's buffer: sends wait for reads
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(recv_frame(theirs)), daemon=True)
    reader.start()
    try:
        send_frame(ours, BATCH, b'{"head": 1}', parts)
        reader.join(timeout=30)
        assert not reader.is_alive()
    finally:
        ours.close()
        theirs.close()
    assert got[0] == (BATCH, b'{"head": 1}', bytearray(expected))


class TrickleSocket:
    """A socket that takes at most a few bytes of at most two parts per call."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.calls = 0

    def sendmsg(self, buffers) -> int:
        self.calls += 1
        room = 7
        for buffer in list(buffers)[:2]:
            taken = bytes(buffer[:room])
            self.sent += taken
            room -= len(taken)
            if room == 0:
                break
        return 7 - room


def test_a_frame_a_socket_takes_in_pieces_is_sent_whole_and_in_order():
    rng = np.random.default_rng(1)
    parts = frame_parts(rng, 12)
    sock = TrickleSocket()
    send_frame(sock, TRAINED, b"{}", parts)  # type: ignore[arg-type]
    body = b"".join(bytes(part) for part in parts)
    assert bytes(sock.sent) == feeder_module.FRAME.pack(TRAINED, 2, len(body)) + b"{}" + body
    assert sock.calls >= len(sock.sent) // 7


def test_batches_that_do_not_fit_one_frame_are_refused():
    rng = np.random.default_rng(0)
    columns, weights, keys = batch_of(rng, 2, 0)
    with pytest.raises(ValueError, match="different columns"):
        pack_batches([(columns, weights, keys), ({"obs": columns["obs"]}, weights, keys)])
    other = {**columns, "obs": columns["obs"].astype(np.float64)}
    with pytest.raises(ValueError, match="column obs differs"):
        pack_batches([(columns, weights, keys), (other, weights, keys)])


def test_an_array_outside_its_frame_is_refused():
    body = bytearray(64)
    with pytest.raises(ValueError, match="obs lies outside"):
        unpack_arrays([FedArray(name="obs", dtype="<f4", shape=[5, 4], offset=0)], body)
    with pytest.raises(ValueError, match="lies outside"):
        unpack_arrays([FedArray(name="obs", dtype="<f4", shape=[1], offset=-4)], body)
    with pytest.raises(ValueError, match="lies outside"):
        unpack_arrays([FedArray(name="obs", dtype="<f4", shape=[-1, 2], offset=0)], body)


def test_a_frame_whose_arrays_do_not_hold_its_batches_is_refused():
    rng = np.random.default_rng(0)
    rows, placed, body = pack_batches([batch_of(rng, 4, 0)])
    data = bytearray(b"".join(bytes(part) for part in body))

    def frame(**changes) -> FedFrame:
        fields = {"batch_rows": rows, "arrays": placed, "last": True, "hold_id": None}
        return FedFrame(**{**fields, **changes}, unusable=[])

    with pytest.raises(ValueError, match="do not hold its 5 rows"):
        unpack_batches(frame(batch_rows=[4, 1]), data)
    with pytest.raises(ValueError, match="negative"):
        unpack_batches(frame(batch_rows=[5, -1]), data)
    with pytest.raises(ValueError, match="keys and weights"):
        unpack_batches(frame(arrays=[a for a in placed if a.name != KEYS]), data)


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
    send_frame(ours, TAKEN, b"{}")  # a batch taken lets one more go
    assert feeder.credits.acquire(timeout=5.0)
    assert feeder.outbox.take() == (["hold-1"], [3, 2**62, 0, 9], [0.5, 1e6, 0.0, 2.0])
    ours.close()  # the learner's end: the listener returns, and the feeder stops
    listening.join(timeout=5.0)
    assert not listening.is_alive() and feeder.stop.is_set()
    theirs.close()


class Listener:
    """A process to stand for the feeder's, and the learner's end of a socketpair whose
    other end the test drives as the feeder."""

    def __init__(self) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait(5)
        self.theirs.close()
        self.ours.close()


@pytest.mark.parametrize("frame_bytes", [1, feeder_module.FRAME_BYTES])
def test_a_replys_batches_come_in_frames_as_the_learner_takes_them(
    tmp_path, monkeypatch, frame_bytes
):
    """Batches go in frames of up to FRAME_BYTES (one batch alone when it is larger);
    the feeder sends no more than AHEAD frames the learner has not taken; the learner
    views each batch's arrays in its frame; the last carries the hold, and the segments
    the feeder skipped join the task's unusable set."""
    monkeypatch.setattr(feeder_module, "FRAME_BYTES", frame_bytes)
    pair = Listener()
    feeder = Feeder(pair.theirs, start_for(tmp_path))
    feeder._reported.add("old")
    feeder.cache.unusable.update({"old", "job-1/segments/w/bad.safetensors"})
    taken = []
    real_release = feeder.credits.release

    def release(n=1):
        taken.append(n)
        real_release(n)

    feeder.credits.release = release

    class Batch:
        segments = []

    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    gathered = []

    def gather(batch):
        gathered.append(batch)
        return {"obs": rows + len(gathered)}, np.array([1.0, 0.5], np.float32), [7, len(gathered)]

    feeder.cache.gather = gather
    sending = threading.Thread(
        target=feeder._hand_over, args=([Batch() for _ in range(7)], "hold-9"), daemon=True
    )
    sending.start()
    listening = threading.Thread(target=feeder._listen_on, daemon=True)
    listening.start()
    unusable: set[str] = set()
    try:
        feed = ProcessFeed(pair.process, pair.ours, threading.Event(), unusable)
        # a batch a frame: AHEAD sent, one waiting to go, one gathered into the next
        expected = AHEAD + 2 if frame_bytes == 1 else 7
        wait_until(lambda: len(gathered) == expected, 5.0, "the batches gathered")
        time.sleep(0.3)
        assert len(gathered) == expected  # and no more until the learner takes one
        reply = feed.next()
        assert reply is not None
        batches = []
        for batch in reply.batches:
            batches.append(batch)
            if frame_bytes == 1:
                time.sleep(0.05)
                assert len(gathered) <= len(batches) + AHEAD + 2
        assert [b.keys for b in batches] == [[7, n] for n in range(1, 8)]
        for n, batch in enumerate(batches, 1):
            assert np.array_equal(batch.columns["obs"], rows + n)
            assert np.array_equal(batch.weights, [1.0, 0.5])
        assert reply.hold_id == "hold-9"
        assert unusable == {"job-1/segments/w/bad.safetensors"}
        # a frame taken, one credit (as soon as the listening thread reads it)
        wait_until(lambda: len(taken) == (7 if frame_bytes == 1 else 1), 5.0, "the credits")
        sending.join(timeout=5.0)
        feeder._hand_over([], None)  # no data in time: one frame of no batch
        empty = feed.next()
        assert empty is not None and list(empty.batches) == [] and empty.hold_id is None
    finally:
        feeder.stop.set()
        pair.close()


def test_a_frame_the_learner_cannot_read_fails_its_wait_not_hangs_it():
    pair = Listener()
    try:
        feed = ProcessFeed(pair.process, pair.ours, threading.Event(), set())
        send_frame(pair.theirs, BATCH, b'{"keys": "no"}')
        with pytest.raises(FeederFailed, match="unreadable frame"):
            feed.next()
    finally:
        pair.close()


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
