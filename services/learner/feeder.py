"""A learner's feeder: a process of its own that asks the coordinator for batches, reads
their segments and gathers their rows, and hands the learner each batch as ready arrays
over a Unix socket.

One module on purpose (over 800 lines): both ends of one conversation, the frames they
exchange and the process that runs one end, so that a change to a frame and to the
two sides that read and write it lands in one place.

Why a process: a learner's training thread gives the interpreter lock up at every
torch call and waits to get it back, so Python work beside it in its own process
(parsing sample replies, reading and gathering rows) costs it its rate about one for
one (bench/learner_feed.py --gil-probe). The feeder does that work under its own lock,
on another core; the learner only receives bytes (a system call that lets the lock go)
and views them as arrays.

The conversation, one stream socket, each frame a kind, a JSON head and a binary body
(no pickle: the body is raw array bytes the head describes):

- learner -> feeder: `FeederStart` once; `taken` for each frame it takes to train (so
  the feeder may send one more); `Trained` for each reply trained on that has a hold
  or new priorities (the priorities in the body); a fresh task credential whenever
  the learner's heartbeats bring one (`credential`, the credential as its head); `stop`.
- feeder -> learner: `FedFrame`s of each sample reply's batches, as many batches a
  frame as fit in `FRAME_BYTES` (a batch larger goes alone), the reply's last frame
  marked, with its hold (a reply with no batches, none in time: one frame of none);
  `FeederEnd` last: stopped, the job is over, or the feeder failed. A frame's body
  holds it column by column: each column (and the items' keys and weights) is one
  array of the rows of all the frame's batches, one batch's after the other's, so the
  learner's reading thread views a few arrays a frame and slices them, rather than
  describing and viewing each batch's arrays one by one: that work holds the
  interpreter lock the training thread waits for.

At most `AHEAD` frames are sent and not yet taken, so the learner holds three frames at
most and the feeder one, whatever the size of a reply (a reply of image sequences can
be a gigabyte; a reply of CartPole's is one frame of 40 KB). The feeder asks for the
next reply while it hands over the one before, and goes no further ahead; the
priorities and holds it is told about ride on its next request
(`services/learner/sampling.py`), two or three requests after their items trained. On
`stop` it sends the priorities no request took and exits; when the learner's end of the
socket closes (the learner died) it exits at once.

Usage (BatchSession; `python -m services.learner.feeder --fd N` is the other end)::

    feed = ProcessFeed.start(feeder_start(...), stop, unusable)
    reply = feed.next()                 # StreamedReply; None once the task stops
    for batch in reply.batches: ...     # each ReadyBatch as it comes
    feed.trained(reply.hold_id, keys, priorities)
    feed.close()                        # the last priorities sent, the process ended
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import math
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from common.columns import ColumnSpec
from common.logs import setup_logging
from common.messages import SampledBatch, SampleReply, dump_json, message, parse
from common.settings import without_secrets
from common.storage import SharedStore
from services.buffer.client import DataClient, ShardedData, data_client
from services.learner.sampling import JobOver, Outbox, Sampler
from services.learner.segments import SegmentCache, SegmentSchema

log = logging.getLogger(__name__)

#: A frame: its kind, its head's length, its body's length; then the head, the body.
FRAME = struct.Struct("!BIQ")
START, TAKEN, TRAINED, STOP, BATCH, END, CREDENTIAL = 1, 2, 3, 4, 5, 6, 7
#: Arrays in a body start at multiples of this (aligned for any dtype's views).
ALIGN = 64
#: Frames the feeder may send before the learner takes them to train.
AHEAD = 2
#: A frame holds batches up to this many bytes of arrays (one batch larger goes alone).
FRAME_BYTES = 32 * 2**20
#: The most parts one `sendmsg` takes (the system's bound on a call's buffers).
IOV_MAX = os.sysconf("SC_IOV_MAX")
#: The sample weights' and the items' keys' names among a frame's arrays (no column is
#: named so).
WEIGHTS = "_weights"
KEYS = "_keys"
#: How long `close` waits for the feeder to send its last priorities and end.
CLOSE_WAIT_S = 15.0
#: How often a wait looks at its stop signal.
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
    #: Where it samples: the job's buffer process, its shards', or the coordinator.
    data_urls: list[str]
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


@message
class FedFrame:
    """Batches of a sample reply, in order, column by column (`pack_batches`)."""

    #: How many items each batch kept (rows of unusable segments left out), in order.
    batch_rows: list[int]
    #: Each column as one array of all the batches' rows (`[sum(batch_rows), ...]`),
    #: the items' keys (`KEYS`) and weights (`WEIGHTS`) among them.
    arrays: list[FedArray]
    #: The reply's last frame, which carries its hold (items of a fifo buffer kept for
    #: the task until acknowledged).
    last: bool
    hold_id: str | None
    #: Segments the feeder skipped since its last frame.
    unusable: list[str]


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
class _Frame:
    """A frame of batches as the learner's reading thread made it."""

    batches: list[ReadyBatch]
    last: bool
    hold_id: str | None


class FeederFailed(RuntimeError):
    """The feeder process failed or ended unasked: the learn task fails with this."""


# --- frames ------------------------------------------------------------------------


def send_frame(
    sock: socket.socket,
    kind: int,
    head: bytes,
    body: list[bytes | memoryview] | bytes = b"",
    lock: threading.Lock | None = None,
) -> None:
    """One frame; `body` may come in parts (sent as they are, not joined)."""
    parts = [body] if isinstance(body, bytes) else body
    size = sum(len(part) for part in parts)
    with lock if lock is not None else contextlib.nullcontext():
        _send_all(sock, [FRAME.pack(kind, len(head), size) + head, *parts])


def _send_all(sock: socket.socket, parts: list[bytes | memoryview]) -> None:
    """`parts` in as few system calls as the socket takes them (one, as a rule): a frame
    sent a part at a time woke the reading thread for each, and each wake took the
    interpreter lock from the learner's training thread."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if sent:
            views[0] = views[0][sent:]


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
            # All of it in one call as a rule (not a wake per chunk sent).
            n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
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


def unpack_arrays(arrays: list[FedArray], body: bytearray) -> dict[str, np.ndarray]:
    """Views of the body's arrays (the body is the frame's own: nothing else writes it).

    Raises:
        ValueError: an array lies outside the body.
    """
    out = {}
    for placed in arrays:
        dtype = np.dtype(placed.dtype)
        # math.prod: numpy's takes microseconds for a short list (a Python call each)
        count = math.prod(placed.shape)
        if (
            placed.offset < 0
            or min(placed.shape, default=0) < 0
            or placed.offset + count * dtype.itemsize > len(body)
        ):
            raise ValueError(f"array {placed.name} lies outside the frame")
        out[placed.name] = np.frombuffer(body, dtype, count, placed.offset).reshape(placed.shape)
    return out


def pack_batches(
    batches: list[tuple[dict[str, np.ndarray], np.ndarray, list[int]]],
) -> tuple[list[int], list[FedArray], list[bytes | memoryview]]:
    """A frame's batches (each its columns, weights and keys, as `SegmentCache.gather`
    returns them) column by column: each batch's row count, where each column lies in
    the body, and the body's parts (views of the batches' memory, not copies).

    Raises:
        ValueError: batches with rows differ in their columns, or a column's rows
            differ in dtype or shape between batches.
    """
    rows = [len(weights) for _, weights, _ in batches]
    # A batch with no rows has no columns (`gather`): it adds nothing to any of them.
    full = [
        {**columns, WEIGHTS: weights, KEYS: np.asarray(keys, np.int64)}
        for columns, weights, keys in batches
        if len(weights)
    ]
    if not full:
        full = [{WEIGHTS: np.zeros(0, np.float32), KEYS: np.zeros(0, np.int64)}]
    names = list(full[0])
    if any(list(batch) != names for batch in full):
        raise ValueError("the batches of a frame have different columns")
    body: list[bytes | memoryview] = []
    placed, offset = [], 0
    for name in names:
        arrays = [np.ascontiguousarray(batch[name]) for batch in full]
        first = arrays[0]
        if any(a.dtype != first.dtype or a.shape[1:] != first.shape[1:] for a in arrays):
            raise ValueError(f"column {name} differs in dtype or shape between batches")
        pad = -offset % ALIGN
        if pad:
            body.append(bytes(pad))
            offset += pad
        shape = [sum(len(a) for a in arrays), *first.shape[1:]]
        placed.append(FedArray(name=name, dtype=first.dtype.str, shape=shape, offset=offset))
        for array in arrays:
            body.append(memoryview(array).cast("B"))
            offset += array.nbytes
    return rows, placed, body


def unpack_batches(frame: FedFrame, body: bytearray) -> list[ReadyBatch]:
    """The frame's batches, each a view of its rows of every column.

    Raises:
        ValueError: the arrays lie outside the body, lack the keys or the weights, or do
            not hold the batches' rows.
    """
    arrays = unpack_arrays(frame.arrays, body)
    total = sum(frame.batch_rows)
    if any(n < 0 for n in frame.batch_rows):
        raise ValueError("a batch of a negative number of rows")
    if KEYS not in arrays or WEIGHTS not in arrays or arrays[KEYS].dtype.kind != "i":
        raise ValueError("a frame without its items' keys and weights")
    if any(a.ndim == 0 or len(a) != total for a in arrays.values()):
        raise ValueError(f"a frame's arrays do not hold its {total} rows")
    keys, weights = arrays.pop(KEYS), arrays.pop(WEIGHTS)
    batches, start = [], 0
    for n in frame.batch_rows:
        end = start + n
        columns = {name: array[start:end] for name, array in arrays.items()}
        batches.append(ReadyBatch(columns, weights[start:end], keys[start:end].tolist()))
        start = end
    return batches


# --- the learner's end ---------------------------------------------------------------


class StreamedReply:
    """One sample reply on the learner's side, its batches taken from the feeder as the
    learner trains them (`batches`, iterated once); `hold_id` is known after the last."""

    def __init__(self, feed: ProcessFeed, first: _Frame) -> None:
        self._feed = feed
        self._first = first
        self.hold_id: str | None = None

    @property
    def batches(self) -> Iterator[ReadyBatch]:
        frame: _Frame | None = self._first
        while frame is not None:
            yield from frame.batches
            if frame.last:
                self.hold_id = frame.hold_id
                return
            frame = self._feed.next_frame()  # None: the task stops


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
        self._inbox: queue.Queue[_Frame | FeederEnd | FeederFailed] = queue.Queue()
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="feeder-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, start: FeederStart, stop: threading.Event, unusable: set[str]) -> ProcessFeed:
        """Hand `start` to the feeder started ahead (`start_spare`), or to a new one.

        Raises:
            FeederFailed: the feeder could not be handed its start.
        """
        spare = _take_spare()
        if spare is None or spare[0].poll() is not None:
            if spare is not None:
                spare[1].close()
            spare = _spawn()
        process, ours = spare
        try:
            send_frame(ours, START, dump_json(start))
        except OSError as exc:
            ours.close()
            process.kill()
            _reap_later(process)
            raise FeederFailed(f"the feeder took no start: {exc}") from exc
        return cls(process, ours, stop, unusable)

    def _read(self) -> None:
        """Frames from the feeder into the inbox, each batch's arrays viewed in place;
        whatever ends this thread is put in the inbox for `next_frame` to raise."""
        try:
            self._read_frames()
        except BaseException as exc:
            self._inbox.put(FeederFailed(f"reading the feeder's frames failed: {exc!r}"))

    def _read_frames(self) -> None:
        while True:
            try:
                frame = recv_frame(self.sock)
            except OSError as exc:
                log.debug("feeder socket: %s", exc)
                frame = None
            if frame is None:
                self._inbox.put(self._gone())
                return
            kind, head, body = frame
            if kind == END:
                self._inbox.put(parse(FeederEnd, head))
                return
            try:
                fed = parse(FedFrame, head)
                batches = unpack_batches(fed, body)
            except Exception as exc:  # a frame this end cannot read: the feeder is not ours
                self._inbox.put(FeederFailed(f"unreadable frame from the feeder: {exc!r}"))
                return
            self.unusable.update(fed.unusable)
            self._inbox.put(_Frame(batches, fed.last, fed.hold_id))

    def _gone(self) -> FeederFailed:
        code = self.process.poll()
        return FeederFailed(
            "the feeder process ended without a word"
            + (f" (exit code {code})" if code is not None else "")
        )

    def next(self) -> StreamedReply | None:
        """The next reply (no batches: none came in time); None once `stop` is set.

        Raises:
            JobOver: the coordinator said the job or the task ended.
            FeederFailed: the feeder failed, or ended unasked.
        """
        frame = self.next_frame()
        return StreamedReply(self, frame) if frame is not None else None

    def next_frame(self) -> _Frame | None:
        """The next frame, the feeder told it is taken; None once `stop` is set."""
        while not self.stop.is_set():
            try:
                item = self._inbox.get(timeout=POLL_S)
            except queue.Empty:
                if not self._reader.is_alive() and self._inbox.empty():
                    raise self._gone() from None
                continue
            if isinstance(item, _Frame):
                self._send(TAKEN, b"{}")
                return item
            if isinstance(item, FeederFailed):
                raise item
            if item.outcome == "over":
                raise JobOver(item.message)
            raise FeederFailed(f"feeder {item.outcome}: {item.message}")
        return None

    def trained(self, hold_id: str | None, keys: list[int], priorities: list[float]) -> None:
        """Tell the feeder a reply is trained on: its hold and its items' new priorities
        go with its next request."""
        if hold_id is not None or keys:
            self._send(TRAINED, *trained_frame(hold_id, keys, priorities))

    def renew(self, credential: str) -> None:
        """The feeder's requests carry this credential from now on."""
        self._send(CREDENTIAL, credential.encode())

    def _send(self, kind: int, head: bytes, body: bytes = b"") -> None:
        try:
            send_frame(self.sock, kind, head, body, self._send_lock)
        except OSError as exc:  # the feeder is gone: `next_frame` says why
            log.debug("feeder socket: %s", exc)

    def close(self) -> None:
        """Ask the feeder to send the last priorities and end; wait for it within
        `CLOSE_WAIT_S`, then stop it. Raises nothing: it runs as a task ends."""
        self._send(STOP, b"{}")
        self._reader.join(timeout=CLOSE_WAIT_S)
        try:
            self.process.wait(timeout=POLL_S * 5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            try:
                self.process.wait(timeout=POLL_S * 5)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a hung mount)
                log.warning("feeder %d has not ended; reaping it later", self.process.pid)
                _reap_later(self.process)
        self.sock.close()


#: A feeder process started ahead of the learn task that takes it (`start_spare`).
_spare: tuple[subprocess.Popen[bytes], socket.socket] | None = None
_spare_lock = threading.Lock()


def _spawn() -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A new feeder process, waiting for its `FeederStart`, and our end of its socket.
    Its environment is the learner's without the cluster's secrets (its requests carry
    the credential its start gives it)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.learner.feeder", "--fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=without_secrets(os.environ),
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


def _reap_later(process: subprocess.Popen[bytes]) -> None:
    """Wait for a feeder that is ending (or stuck ending) on a thread, so that it leaves
    no zombie and nobody waits on it."""
    threading.Thread(target=process.wait, name="feeder-reap", daemon=True).start()


def start_spare() -> None:
    """Start a feeder ahead of the first learn task that takes one (a learner service
    calls this as it starts): the feeder's interpreter and imports, about half a second
    of CPU, are then paid while the learner registers and waits for its task, not
    between the task's start and its first batch."""
    global _spare
    with _spare_lock:
        if _spare is None:
            _spare = _spawn()
            atexit.register(_end_spare)


def _end_spare() -> None:
    """As the learner's process ends: stop the spare feeder, and wait for it. Left to
    read the end of its socket, it would outlive the learner by its imports (a `drover
    run` stopped at its start would exit with the feeder still running); it holds
    nothing yet, so it is killed."""
    spare = _take_spare()
    if spare is not None:
        process, ours = spare
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=CLOSE_WAIT_S)
        ours.close()


def discard_spare() -> None:
    """End the feeder started ahead, if any (a task that uses none: its memory back).
    It ends when it reads the end of its socket; it is reaped on a thread."""
    spare = _take_spare()
    if spare is not None:
        process, ours = spare
        ours.close()
        _reap_later(process)


def _take_spare() -> tuple[subprocess.Popen[bytes], socket.socket] | None:
    global _spare
    with _spare_lock:
        spare, _spare = _spare, None
    return spare


def feeder_start(
    coordinator: DataClient,
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
        data_urls=(
            coordinator.base_urls
            if isinstance(coordinator, ShardedData)
            else [coordinator.base_url]
        ),
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
    """The feeder process's work (`serve`): a thread asks for replies, one ahead of the
    one being handed over; the main thread gathers the batches and sends them in frames
    as the learner lets it (`AHEAD`); a thread listens to the learner."""

    def __init__(self, sock: socket.socket, start: FeederStart) -> None:
        self.sock = sock
        self.start = start
        self.stop = threading.Event()
        self.outbox = Outbox()
        #: Frames that may be sent before the learner takes another.
        self.credits = threading.Semaphore(AHEAD)
        #: Requests that may go out: one, then one more each time a reply is taken up.
        self.request_slots = threading.Semaphore(1)
        self.replies: queue.Queue[SampleReply | BaseException] = queue.Queue()
        self.send_lock = threading.Lock()
        client = data_client(start.data_urls, start.bearer, timeout_s=start.call_timeout_s)
        self.client = client
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
        """Hand over batches until told to stop (or the job is over); a failure is told
        to the learner, then raised."""
        threading.Thread(target=self._listen, name="feeder-listen", daemon=True).start()
        threading.Thread(target=self._request, name="feeder-request", daemon=True).start()
        try:
            while True:
                reply = self._next_reply()
                if reply is None:
                    return
                self.request_slots.release()  # the next request goes out meanwhile
                self._hand_over(reply.batches, reply.hold_id)
        except JobOver as exc:
            self._end("over", str(exc))
        except Exception as exc:
            self._end("failed", f"{type(exc).__name__}: {exc}")
            raise

    def _request(self) -> None:
        """Ask for replies, each once the one before is taken up (on its own thread)."""
        try:
            while self._acquire(self.request_slots):
                reply = self.sampler.sample(self.start.batch_size, self.start.num_batches)
                self.replies.put(reply if reply is not None else SampleReply(batches=[]))
        except BaseException as exc:  # JobOver or a failure: the main thread raises it
            self.replies.put(exc)

    def _next_reply(self) -> SampleReply | None:
        """The next reply asked for; None once stopping.

        Raises:
            JobOver, or what else the requesting thread met.
        """
        while not self.stop.is_set():
            try:
                item = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item
        return None

    def _acquire(self, semaphore: threading.Semaphore) -> bool:
        """Take one of `semaphore`'s; False once stopping."""
        while not self.stop.is_set():
            if semaphore.acquire(timeout=POLL_S):
                return not self.stop.is_set()
        return False

    def _hand_over(self, batches: list[SampledBatch], hold_id: str | None) -> None:
        """Gather the batches and send them in frames of up to `FRAME_BYTES`, each as
        the learner lets it; the last carries the hold."""
        self.cache.start_reads(batches)
        frame: list[tuple[dict[str, np.ndarray], np.ndarray, list[int]]] = []
        size = 0
        for batch in batches:
            gathered = self.cache.gather(batch)
            columns, weights, _ = gathered
            nbytes = weights.nbytes + sum(a.nbytes for a in columns.values())
            if frame and size + nbytes > FRAME_BYTES:
                if not self._send_frame(frame, last=False, hold_id=None):
                    return
                frame, size = [], 0
            frame.append(gathered)
            size += nbytes
        self._send_frame(frame, last=True, hold_id=hold_id)

    def _send_frame(
        self,
        batches: list[tuple[dict[str, np.ndarray], np.ndarray, list[int]]],
        *,
        last: bool,
        hold_id: str | None,
    ) -> bool:
        """Send one frame once the learner lets it; False once stopping."""
        if not self._acquire(self.credits):
            return False
        rows, placed, body = pack_batches(batches)
        unusable = sorted(self.cache.unusable - self._reported)
        self._reported.update(unusable)
        head = FedFrame(
            batch_rows=rows,
            arrays=placed,
            last=last,
            hold_id=hold_id,
            unusable=unusable,
        )
        send_frame(self.sock, BATCH, dump_json(head), body, self.send_lock)
        return True

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
        """Taken batches let one more go, trained replies feed the outbox, until `stop`
        (the last priorities are then sent) or the learner's end closes."""
        while True:
            frame = recv_frame(self.sock)
            if frame is None:
                self.stop.set()
                return
            kind, head, body = frame
            if kind == TAKEN:  # a frame taken: one more may go
                self.credits.release()
            elif kind == TRAINED:
                self.outbox.add(*read_trained(head, body))
            elif kind == CREDENTIAL:
                self.client.renew(head.decode())
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
    setup_logging("learner-feeder")
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
