"""A learner's feeder: a process of its own that asks the coordinator for batches, reads
their segments and gathers their rows, and hands the learner each sample reply's
batches as ready arrays over a Unix socket.

Why a process: a learner's training thread gives the interpreter lock up at every
torch call and waits to get it back, so Python work beside it in its own process
(parsing sample replies, reading and gathering rows) costs it its rate about one for
one (bench/learner_feed.py --gil-probe). The feeder does that work under its own lock,
on another core; the learner only receives bytes (a system call that lets the lock go)
and views them as arrays.

The conversation, one stream socket, each frame a kind, a JSON head and a binary body
(no pickle: the body is raw array bytes the head describes):

- learner -> feeder: `FeederStart` once; then, for each reply it has trained on,
  `Trained` (its hold, and the new priorities of its items in the body); `stop`.
- feeder -> learner: `FedReply` for each sample request (no batches when none came in
  time); `FeederEnd` last: stopped, the job is over, or the feeder failed.

The feeder asks for the next reply while the learner trains on the one before, and
goes no further ahead: it waits for that one's `Trained` first, whose priorities and
hold then ride on the request after (`services/learner/sampling.py`), as with a
sampling thread. On `stop` it sends the priorities no request took and exits; when the
learner's end of the socket closes (the learner died) it exits at once.

Usage (BatchSession; `python -m services.learner.feeder --fd N` is the other end)::

    feed = ProcessFeed.start(ctx, config, schema, store.root, sequence_length)
    reply = feed.next()                 # ReadyReply; None once the task stops
    feed.trained(reply.hold_id, keys, priorities)
    feed.close()                        # the last priorities sent, the process ended
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from common.columns import ColumnSpec
from common.messages import bulk_message, dump_json, message, parse
from common.storage import SharedStore
from services.coordinator.client import CoordinatorClient
from services.learner.sampling import JobOver, Outbox, Sampler
from services.learner.segments import SegmentCache, SegmentSchema

log = logging.getLogger(__name__)

#: A frame: its kind, its head's length, its body's length; then the head, the body.
FRAME = struct.Struct("!BIQ")
START, TRAINED, STOP, REPLY, END = 1, 2, 3, 4, 5
#: Arrays in a body start at multiples of this (aligned for any dtype's views).
ALIGN = 64
#: Replies the feeder may hand over before the first of them is trained on: the one
#: training and the next, asked for meanwhile.
AHEAD = 2
#: How long `close` waits for the feeder to send its last priorities and end.
CLOSE_WAIT_S = 15.0
#: How long the learner waits for a reply before it looks at its stop signal again.
POLL_S = 0.2


# --- messages ----------------------------------------------------------------------


@message
class FedColumn:
    """One column of the job's `SegmentSchema`."""

    name: str
    kind: str
    shape: list[int]
    dtype: str
    high: int


@message
class FeederStart:
    coordinator_url: str
    #: The learner's own credential (or the cluster token): never in argv or env.
    bearer: str
    #: The coordinator client's timeout for one call (a long poll adds its wait).
    call_timeout_s: float
    root: str
    job_id: str
    task_id: str | None
    batch_size: int
    num_batches: int
    sample_timeout_s: float
    columns: list[FedColumn]
    sequence_length: int | None


@message
class FedArray:
    """Where one array of a batch lies in the frame's body."""

    name: str
    dtype: str
    shape: list[int]
    offset: int


@bulk_message
class FedBatch:
    #: The keys of the items kept (rows of unusable segments left out), in order.
    keys: list[int]
    #: The batch's columns, and its items' weights as `weights`.
    arrays: list[FedArray]


@message
class FedReply:
    batches: list[FedBatch]
    #: The reply's hold (items of a fifo buffer kept for the task until acknowledged).
    hold_id: str | None
    #: Segments the feeder skipped since its last reply.
    unusable: list[str]
    #: Requests so far that found no data in time.
    sample_timeouts: int


@message
class Trained:
    """A reply trained on: its hold, and `count` new priorities (the body: `count`
    int64 keys, then `count` float64 priorities)."""

    hold_id: str | None
    count: int


@message
class FeederEnd:
    outcome: Literal["stopped", "over", "failed"]
    message: str


@dataclass(frozen=True)
class ReadyBatch:
    """One batch's usable rows, gathered: what `SegmentCache.gather` returns."""

    columns: dict[str, np.ndarray]
    weights: np.ndarray
    keys: list[int]


@dataclass(frozen=True)
class ReadyReply:
    batches: list[ReadyBatch]
    hold_id: str | None


class FeederFailed(RuntimeError):
    """The feeder process failed or ended unasked: the learn task fails with this."""


# --- frames ------------------------------------------------------------------------


def send_frame(
    sock: socket.socket,
    kind: int,
    head: bytes,
    body: bytes = b"",
    lock: threading.Lock | None = None,
) -> None:
    data = FRAME.pack(kind, len(head), len(body)) + head
    if lock is None:
        sock.sendall(data)
        sock.sendall(body)
        return
    with lock:
        sock.sendall(data)
        sock.sendall(body)


def recv_frame(sock: socket.socket) -> tuple[int, bytes, bytearray] | None:
    """The next frame (kind, head, body); None when the other end closed."""
    prefix = _recv_exact(sock, FRAME.size)
    if prefix is None:
        return None
    kind, head_len, body_len = FRAME.unpack(prefix)
    head = _recv_exact(sock, head_len)
    body = _recv_exact(sock, body_len)
    if head is None or body is None:
        return None
    return kind, bytes(head), body


def _recv_exact(sock: socket.socket, size: int) -> bytearray | None:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        try:
            n = sock.recv_into(view[got:], size - got)
        except ConnectionError:  # closed with our last frame unread: a reset, not EOF
            return None
        if n == 0:
            return None
        got += n
    return buf


def trained_frame(
    hold_id: str | None, keys: list[int], priorities: list[float]
) -> tuple[bytes, bytes]:
    """A `Trained` frame's head and body."""
    if len(keys) != len(priorities):
        raise ValueError(f"{len(keys)} keys but {len(priorities)} priorities")
    body = np.asarray(keys, np.int64).tobytes() + np.asarray(priorities, np.float64).tobytes()
    return dump_json(Trained(hold_id=hold_id, count=len(keys))), body


def read_trained(head: bytes, body: bytearray) -> tuple[str | None, list[int], list[float]]:
    """A `Trained` frame's hold, keys and priorities.

    Raises:
        ValueError: the body does not hold `count` keys and priorities.
    """
    trained = parse(Trained, head)
    count = trained.count
    if len(body) != count * 16:
        raise ValueError(f"a trained frame of {count} priorities has {len(body)} bytes")
    keys = np.frombuffer(body, np.int64, count).tolist()
    priorities = np.frombuffer(body, np.float64, count, count * 8).tolist()
    return trained.hold_id, keys, priorities


def pack_arrays(
    arrays: dict[str, np.ndarray], body: list[bytes], offset: int
) -> tuple[list[FedArray], int]:
    """Append `arrays` to `body` (aligned), from byte `offset`; returns where each lies
    and the offset after them."""
    placed = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        pad = -offset % ALIGN
        if pad:
            body.append(bytes(pad))
            offset += pad
        placed.append(
            FedArray(name=name, dtype=array.dtype.str, shape=list(array.shape), offset=offset)
        )
        body.append(array.tobytes())
        offset += array.nbytes
    return placed, offset


def unpack_arrays(arrays: list[FedArray], body: bytearray) -> dict[str, np.ndarray]:
    """Views of the body's arrays (the body is the reply's own: nothing else writes it).

    Raises:
        ValueError: an array lies outside the body.
    """
    out = {}
    for placed in arrays:
        dtype = np.dtype(placed.dtype)
        count = int(np.prod(placed.shape, dtype=np.int64))
        if placed.offset < 0 or placed.offset + count * dtype.itemsize > len(body):
            raise ValueError(f"array {placed.name} lies outside the frame")
        out[placed.name] = np.frombuffer(body, dtype, count, placed.offset).reshape(placed.shape)
    return out


# --- the learner's end ---------------------------------------------------------------


class ProcessFeed:
    """The learner's end of a feeder process (one per learn task)."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        sock: socket.socket,
        stop: threading.Event,
        unusable: set[str],
    ) -> None:
        self.process = process
        self.sock = sock
        self.stop = stop
        #: Segments the feeder skipped (the task context's set, which heartbeats report).
        self.unusable = unusable
        self.sample_timeouts = 0
        self._inbox: queue.Queue[ReadyReply | FeederEnd | FeederFailed] = queue.Queue()
        self._send_lock = threading.Lock()
        self._end: FeederEnd | None = None
        self._reader = threading.Thread(target=self._read, name="feeder-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, start: FeederStart, stop: threading.Event, unusable: set[str]) -> ProcessFeed:
        """Hand `start` to the feeder started ahead (`start_spare`), or to a new one."""
        global _spare
        with _spare_lock:
            spare, _spare = _spare, None
        if spare is None or spare[0].poll() is not None:
            spare = _spawn()
        process, ours = spare
        send_frame(ours, START, dump_json(start))
        return cls(process, ours, stop, unusable)

    def _read(self) -> None:
        """Frames from the feeder into the inbox, each reply's arrays viewed in place."""
        while True:
            try:
                frame = recv_frame(self.sock)
            except OSError as exc:
                frame = None
                log.debug("feeder socket: %s", exc)
            if frame is None:
                self._inbox.put(FeederFailed("the feeder process ended without a word"))
                return
            kind, head, body = frame
            try:
                if kind == END:
                    self._inbox.put(parse(FeederEnd, head))
                    return
                reply = parse(FedReply, head)
                self.unusable.update(reply.unusable)
                self.sample_timeouts = reply.sample_timeouts
                batches = []
                for batch in reply.batches:
                    arrays = unpack_arrays(batch.arrays, body)
                    weights = arrays.pop("weights")
                    batches.append(ReadyBatch(arrays, weights, batch.keys))
                self._inbox.put(ReadyReply(batches, reply.hold_id))
            except Exception as exc:  # a frame this end cannot read: the feeder is not ours
                self._inbox.put(FeederFailed(f"unreadable frame from the feeder: {exc!r}"))
                return

    def next(self) -> ReadyReply | None:
        """The next reply (no batches: none came in time); None once `stop` is set.

        Raises:
            JobOver: the coordinator said the job or the task ended.
            FeederFailed: the feeder failed, or ended unasked.
        """
        while not self.stop.is_set():
            try:
                item = self._inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, ReadyReply):
                return item
            if isinstance(item, FeederFailed):
                raise item
            self._end = item
            if item.outcome == "over":
                raise JobOver(item.message)
            raise FeederFailed(f"feeder {item.outcome}: {item.message}")
        return None

    def trained(self, hold_id: str | None, keys: list[int], priorities: list[float]) -> None:
        """Tell the feeder a reply is trained on: its hold and its items' new priorities
        go with its next request but one. Sent for every reply, with or without them:
        it is what lets the feeder ask for the next."""
        try:
            send_frame(
                self.sock, TRAINED, *trained_frame(hold_id, keys, priorities), self._send_lock
            )
        except OSError as exc:  # the feeder is gone: `next` says why
            log.debug("feeder socket: %s", exc)

    def close(self) -> None:
        """Ask the feeder to send the last priorities and end; wait for it within
        `CLOSE_WAIT_S`, then stop it."""
        with contextlib.suppress(OSError):  # the feeder is gone already
            send_frame(self.sock, STOP, b"{}", lock=self._send_lock)
        self._reader.join(timeout=CLOSE_WAIT_S)
        try:
            self.process.wait(timeout=max(0.1, CLOSE_WAIT_S / 3))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=CLOSE_WAIT_S)
        self.sock.close()


#: A feeder process started ahead of the learn task that takes it (`start_spare`).
_spare: tuple[subprocess.Popen[bytes], socket.socket] | None = None
_spare_lock = threading.Lock()


def _spawn() -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A new feeder process, waiting for its `FeederStart`, and our end of its socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.learner.feeder", "--fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


def start_spare() -> None:
    """Start a feeder ahead of the first learn task that takes one (a learner service
    calls this as it starts): the feeder's interpreter and imports, about half a second
    of CPU, are then paid while the learner registers and waits for its task, not
    between the task's start and its first batch."""
    global _spare
    with _spare_lock:
        if _spare is None:
            _spare = _spawn()


def discard_spare() -> None:
    """End the feeder started ahead, if any (a task that uses none: its memory back).
    It ends when it reads the end of its socket; it is reaped on a thread."""
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    if spare is not None:
        process, ours = spare
        ours.close()
        threading.Thread(target=process.wait, name="feeder-reap", daemon=True).start()


def feeder_start(
    coordinator: CoordinatorClient,
    job_id: str,
    task_id: str | None,
    root: str,
    schema: SegmentSchema,
    *,
    batch_size: int,
    num_batches: int,
    sample_timeout_s: float,
    sequence_length: int | None,
) -> FeederStart:
    """What a feeder needs to sample and gather as the learn task would."""
    return FeederStart(
        coordinator_url=coordinator.base_url,
        bearer=coordinator.bearer,
        call_timeout_s=coordinator.timeout_s,
        root=root,
        job_id=job_id,
        task_id=task_id,
        batch_size=batch_size,
        num_batches=num_batches,
        sample_timeout_s=sample_timeout_s,
        columns=[
            FedColumn(
                name=name,
                kind=spec.kind,
                shape=list(spec.shape),
                dtype=np.dtype(spec.dtype).name,
                high=spec.high,
            )
            for name, spec in schema.columns.items()
        ],
        sequence_length=sequence_length,
    )


# --- the feeder's end ----------------------------------------------------------------


class Feeder:
    """The feeder process's work (`serve`)."""

    def __init__(self, sock: socket.socket, start: FeederStart) -> None:
        self.sock = sock
        self.start = start
        self.stop = threading.Event()
        self.outbox = Outbox()
        self.credits = threading.Semaphore(AHEAD)
        self.send_lock = threading.Lock()
        client = CoordinatorClient(
            start.coordinator_url, start.bearer, timeout_s=start.call_timeout_s
        )
        self.sampler = Sampler(
            client,
            start.job_id,
            start.task_id,
            self.outbox,
            sample_timeout_s=start.sample_timeout_s,
            stop=self.stop,
        )
        schema = SegmentSchema(
            {
                c.name: ColumnSpec(c.kind, tuple(c.shape), np.dtype(c.dtype).type, c.high)  # type: ignore[arg-type]
                for c in start.columns
            }
        )
        self.cache = SegmentCache(
            SharedStore(start.root), start.job_id, schema, sequence_length=start.sequence_length
        )
        self._reported: set[str] = set()

    def serve(self) -> None:
        """Sample and hand over until told to stop (or the job is over); a failure is
        told to the learner, then raised."""
        threading.Thread(target=self._listen, name="feeder-listen", daemon=True).start()
        try:
            while True:
                self.credits.acquire()
                if self.stop.is_set():
                    return
                reply = self.sampler.sample(self.start.batch_size, self.start.num_batches)
                if self.stop.is_set():
                    return
                self._hand_over(reply.batches if reply else [], reply.hold_id if reply else None)
        except JobOver as exc:
            self._end("over", str(exc))
        except Exception as exc:
            self._end("failed", f"{type(exc).__name__}: {exc}")
            raise

    def _hand_over(self, batches: list, hold_id: str | None) -> None:
        self.cache.start_reads([segment.path for batch in batches for segment in batch.segments])
        body: list[bytes] = []
        offset = 0
        fed = []
        for batch in batches:
            columns, weights, keys = self.cache.gather(batch)
            placed, offset = pack_arrays({**columns, "weights": weights}, body, offset)
            fed.append(FedBatch(keys=keys, arrays=placed))
        unusable = sorted(self.cache.unusable - self._reported)
        self._reported.update(unusable)
        head = FedReply(
            batches=fed, hold_id=hold_id, unusable=unusable, sample_timeouts=self.sampler.timeouts
        )
        send_frame(self.sock, REPLY, dump_json(head), b"".join(body), self.send_lock)

    def _listen(self) -> None:
        """The learner's frames (`_listen_on`), then the process's end: once told to
        stop, once the learner is gone (nobody to feed), and on a frame this end cannot
        read (the learner then hears the socket close)."""
        try:
            self._listen_on()
        except Exception:
            log.exception("the learner's frames cannot be read")
            os._exit(1)
        os._exit(0)

    def _listen_on(self) -> None:
        """Trained replies feed the outbox and let the next request go, until `stop`
        (the last priorities are then sent) or the learner's end closes."""
        while True:
            frame = recv_frame(self.sock)
            if frame is None:
                return
            kind, head, body = frame
            if kind == TRAINED:
                self.outbox.add(*read_trained(head, body))
                self.credits.release()
            elif kind == STOP:
                self.stop.set()
                self.sampler.send_last_priorities()
                self._end("stopped", "")
                return

    def _end(self, outcome: str, text: str) -> None:
        end = FeederEnd(outcome=outcome, message=text[:1000])  # type: ignore[arg-type]
        with contextlib.suppress(OSError):  # the learner is gone: nobody to tell
            send_frame(self.sock, END, dump_json(end), lock=self.send_lock)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A learner's feeder (started by the learner).")
    parser.add_argument("--fd", type=int, required=True, help="the learner's socket")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s feeder %(levelname)s %(name)s: %(message)s"
    )
    sock = socket.socket(fileno=args.fd)
    frame = recv_frame(sock)
    if frame is None:
        return  # started ahead, and let go of unused (or its learner ended)
    if frame[0] != START:
        raise SystemExit("drover feeder: no start from the learner")
    Feeder(sock, parse(FeederStart, frame[1])).serve()
    # Stopped or over: the listener ends the process once told; a job over waits for it.
    threading.Event().wait()


if __name__ == "__main__":
    main()
