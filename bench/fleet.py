"""Fleet load: one real coordinator under N simulated collectors and M simulated learners.

    python bench/fleet.py [--collectors 8,32,64,128] [--learners 4] [--jobs 4]
        [--seconds 20] [--insert-rate 20] [--profile-at 64]
    python bench/fleet.py --quick        # a smoke run: 2 collectors, 1 learner, 2 s
    python bench/fleet.py --coordinator-from DIR   # another checkout's coordinator

For each N in `--collectors`, a fresh coordinator process (`python -m
services.coordinator`, waitress, on a free port of 127.0.0.1, a temporary shared root)
gets `--jobs` DQN CartPole jobs, each with a prioritized buffer of `--buffer-items`
items. Then `--procs` generator processes (this script with `--generator`) play the
fleet, each worker with its own registration, its own secret and its own keep-alive
connections (one for data, one for heartbeats), all of a process's workers on one
asyncio loop (no thread per worker):

- a simulated collector registers as a collector, takes the collect task the
  scheduler sends to `POST /v1/tasks` (one small server per process answers for all
  its workers, telling them apart by the secret each gave at registration), writes
  64-row segment files into its own folder (`<job>/segments/<worker>.<task>/`) with the
  collector's own writer (`NStepBuilder` rows of the job's observation and action
  shapes, the `SegmentRef` in the header, `SharedStore.write_segment`), and inserts
  them as they become ready, `--insert-rate` a second, heartbeating all along. As the
  collector's uploader does, one insert carries every segment ready and not sent yet,
  up to `--segments-per-insert` (3, what a collector's uploader carried before it
  wrote the chunks queued during an upload as one file): one a request while the
  coordinator keeps up, more once it falls behind. The files are written
  before the timed window, enough for the whole of it at the nominal rate, so disk
  writes do not count: they wait in a folder beside the shared root and each is
  moved into its place (a rename) just before its insert, so the coordinator's
  orphan sweep sees what it would see with real collectors. Every insert names a
  real file of the job's schema, whose header the coordinator reads. A `429` waits
  its `Retry-After`, as a collector does, and sends the same segments again; an
  insert that falls behind its schedule is sent at once, so the offered load stays
  the nominal one;
- a simulated learner registers as a learner, takes its job's learn task, and in a
  closed loop asks for 8 batches of 64 (naming its task, acknowledging holds), and
  sends a priority for every key it got with its next request, as a real learner's
  sampler does; in binary frames both ways (common/array_bodies.py), as a real
  learner does, or, with `--wire json`, as JSON (what an operator's tool sends, and
  what a coordinator before the frames took).

After a warm-up (`--warmup-s`: the buffers pass `min_size_to_sample`, connections
open), the window of `--seconds` is measured. Per row: insert and sample latency
p50/p99/max (answered requests only: a long-poll that ends in data counts its wait),
errors (5xx, connection failures and timeouts, unexpected 4xx) and the documented
back-pressure answers (`429` on inserts, `503 sample_timeout` / `too_many_waiting` on
samples) counted apart, transitions indexed a second (rows of accepted inserts),
sample requests a second, the data plane's CPU (utime + stime from /proc/<pid>/stat,
summed over the coordinator and its buffer processes, one a job, which serve the
inserts and samples) as a share of one core and per 1,000 transitions, their resident
sets (VmRSS, and the peak VmHWM, summed), the generator's own CPU and what other
processes took of the machine meanwhile.

With `--profile-at N` (64 by default when 64 is a row), the N row runs once more with
py-spy recording the coordinator and its buffer processes (`--subprocesses`; `--gil`:
only the thread holding each one's GIL, i.e. where its core goes; `--nonblocking`:
they are not paused), and the top functions by own and by total time are printed.
That row is shown apart: py-spy's own CPU competes with them on a small machine.

Timings vary with machine load: the load before the start is printed, and each row
says how much CPU other processes took during its window.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import queue
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.procfs import cpu_s  # noqa: E402
from common.array_bodies import CONTENT_TYPE as ARRAYS_TYPE  # noqa: E402
from common.array_bodies import SAMPLE_REQUEST_ARRAYS, SampledItems, encode  # noqa: E402
from common.messages import SampleRequest, SegmentRef, dump  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from services.buffer.core import segment_shard  # noqa: E402
from services.buffer.sharding import split as split_draw  # noqa: E402
from services.buffer.table import shard_of  # noqa: E402
from services.collector.step_data import NStepBuilder  # noqa: E402
from tests.helpers import child_processes  # noqa: E402

API = "/api/v1"
#: Rows of every segment (the issue's 64-row segments; the DQN default `n_sample`).
SEGMENT_ROWS = 64
#: Most segments one simulated insert carries (the default of --segments-per-insert).
SEGMENTS_PER_INSERT = 3
#: Each learner's request: `num_batches` batches of `batch_size` (the DQN defaults).
BATCH_SIZE, NUM_BATCHES = 64, 8
#: How long a sample long-poll and a rate-limited insert may wait (the job config's
#: `sample_timeout_s` and `insert_timeout_s` defaults, what real workers send).
SAMPLE_TIMEOUT_S, INSERT_TIMEOUT_S = 5.0, 2.0
#: Every request's own limit on top of its long-poll.
REQUEST_TIMEOUT_S = 10.0
#: An insert's wait: the request's own and the rate limiter's.
INSERT_WAIT_S = REQUEST_TIMEOUT_S + 2.0
#: Segments written ahead beyond the window's nominal need (a late start, jitter).
PREWRITE_MARGIN = 1.05
#: The row the targets are for, and the targets.
TARGET_COLLECTORS, TARGET_LEARNERS = 64, 4
TARGET_P99_MS = 50.0
TARGET_TRANSITIONS_PER_S = 75_000
TARGET_SAMPLES_PER_S = 1_000
#: Back-pressure answers the API documents; anything else that is not 2xx is an error.
BACK_PRESSURE = {
    ("insert", 429),
    ("sample", 503, "sample_timeout"),
    ("sample", 503, "too_many_waiting"),
}


# --- the generator's side: HTTP over asyncio -------------------------------------------


class HttpError(Exception):
    """The server's answer could not be read as HTTP/1.1."""


async def read_head(reader: asyncio.StreamReader) -> dict[str, str]:
    """Header lines up to the blank line, names in lower case."""
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            return headers
        if not line:
            raise HttpError("connection closed inside the headers")
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await read_head(reader)  # trailers, up to the blank line
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get("content-length", "0"))
    return await reader.readexactly(length) if length else b""


class HttpConnection:
    """One keep-alive HTTP/1.1 connection, as a worker's `requests.Session` holds one,
    at a fraction of its cost a request: the fleet's client must not be what is
    measured. A request that finds its reused connection closed by the server before
    any answer is sent once more on a new one (what urllib3 does for a stale
    keep-alive connection); nothing else is retried here."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        auth: str,
        timeout_s: float,
        *,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body). Raises OSError, TimeoutError or HttpError."""
        request = self._request(method, path, body, auth, content_type, accept)
        try:
            return await asyncio.wait_for(request, timeout_s)
        except BaseException:
            self.close()  # a request cut anywhere leaves the connection unusable
            raise

    async def _request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        auth: str,
        content_type: str,
        accept: str,
    ) -> tuple[int, dict[str, str], bytes]:
        data = body or b""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {auth}\r\nContent-Type: {content_type}\r\n"
            f"Accept: {accept}\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        for attempt in range(2):
            reused = self._writer is not None
            if not reused:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            assert self._reader is not None and self._writer is not None
            try:
                self._writer.write(head + data)
                status_line = await self._reader.readline()
            except ConnectionError:
                status_line = b""
            if status_line:
                break
            self.close()
            if not reused or attempt:
                raise ConnectionResetError(f"{method} {path}: closed before an answer")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise HttpError(f"{method} {path}: not an HTTP status line: {status_line[:80]!r}")
        headers = await read_head(self._reader)
        answer = await read_body(self._reader, headers)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return int(parts[1]), headers, answer


def retry_after_s(headers: dict[str, str], answer: bytes) -> float:
    """The wait a back-pressure answer asks for: the body's precise one, else the
    header's whole seconds, else one second."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return float(json.loads(answer)["retry_after_s"])
    with contextlib.suppress(ValueError, KeyError):
        return float(headers["retry-after"])
    return 1.0


def error_code(answer: bytes) -> str:
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
        return str(json.loads(answer)["error"])
    return "?"


# --- the generator's side: what one process measures -----------------------------------


@dataclass
class Tally:
    """What one generator process saw in the timed window (requests sent in it)."""

    start_s: float = math.inf
    end_s: float = math.inf
    insert_ms: list[float] = field(default_factory=list)
    #: Segments each answered insert carried.
    segments_per_insert: list[int] = field(default_factory=list)
    sample_ms: list[float] = field(default_factory=list)
    rows_indexed: int = 0
    duplicates: int = 0
    heartbeats: int = 0
    #: Collectors whose prewritten segments ran out before the window ended.
    ran_out: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    back_pressure: collections.Counter[str] = field(default_factory=collections.Counter)
    cpu_s: float = 0.0

    def timed(self, sent_s: float) -> bool:
        return self.start_s <= sent_s < self.end_s

    def answered(self, what: str, sent_s: float, status: int, answer: bytes) -> str:
        """Sort an answer: 'ok' (2xx), 'back-pressure' (documented) or 'error'."""
        if 200 <= status < 300:
            return "ok"
        code = error_code(answer)
        if (what, status) in BACK_PRESSURE or (what, status, code) in BACK_PRESSURE:
            if self.timed(sent_s):
                self.back_pressure[f"{what} {status} {code}"] += 1
            return "back-pressure"
        if self.timed(sent_s):
            self.errors[f"{what} {status} {code}"] += 1
        return "error"

    def failed(self, what: str, sent_s: float, exc: BaseException) -> None:
        if self.timed(sent_s):
            self.errors[f"{what} {type(exc).__name__}"] += 1

    def result(self) -> dict[str, Any]:
        return {
            "insert_ms": [round(x, 3) for x in self.insert_ms],
            "segments_per_insert": self.segments_per_insert,
            "sample_ms": [round(x, 3) for x in self.sample_ms],
            "rows_indexed": self.rows_indexed,
            "duplicates": self.duplicates,
            "heartbeats": self.heartbeats,
            "ran_out": self.ran_out,
            "errors": dict(self.errors),
            "back_pressure": dict(self.back_pressure),
            "cpu_s": self.cpu_s,
        }


# --- the generator's side: simulated workers -------------------------------------------


class SimWorker:
    """A registered worker: its secret, its credential, its task, its heartbeats."""

    role = ""

    def __init__(self, plan: dict[str, Any], url: str, tally: Tally) -> None:
        self.plan, self.url, self.tally = plan, url, tally
        host, port = plan["coordinator_host"], plan["coordinator_port"]
        self.data = HttpConnection(host, port)
        #: Where the task's data goes: its job's buffer processes, one a shard.
        self.shards = [self.data]
        self.shard_answers: dict[int, bytes] = {}
        self.control = HttpConnection(host, port)
        self.slave_token = secrets.token_urlsafe(32)
        self.worker_id = ""
        self.credential = ""
        #: What its data requests carry: its credential, or its task's at a buffer process.
        self.data_auth = ""
        self.heartbeat_interval_s = 1.0
        self.task: dict[str, Any] | None = None
        self.assigned = asyncio.get_running_loop().create_future()
        self.cancelled = False
        self.progress: dict[str, float] = {}

    async def register(self) -> None:
        body = json.dumps(
            {
                "role": self.role,
                "url": self.url,
                "slave_token": self.slave_token,
                "resources": {"cpu_count": 1, "cuda_devices": 0},
            }
        ).encode()
        status, _, answer = await self.control.request(
            "POST", f"{API}/workers", body, self.plan["registration_token"], REQUEST_TIMEOUT_S
        )
        if status != 201:
            raise RuntimeError(f"registering a {self.role}: {status} {answer[:200]!r}")
        registered = json.loads(answer)
        self.worker_id = registered["worker_id"]
        self.credential = registered["credential"]
        self.data_auth = self.credential
        self.heartbeat_interval_s = float(registered["heartbeat_interval_s"])

    def assign(self, task: dict[str, Any]) -> int:
        """The coordinator's `POST /v1/tasks`: 202, or 409 while another task runs. A
        task whose job's buffer runs in a process of its own names it (`spec.data`):
        the task's data goes there, with the task's credential."""
        if self.task is not None and self.task["task_id"] != task["task_id"]:
            return 409
        self.task = task
        access = task["spec"].get("data")
        if self.plan["via"] == "coordinator":
            # An operator's path: the coordinator's routes with the cluster token, passed
            # on to the job's buffer process (or served there, with no buffer processes).
            self.data_auth = self.plan["operator_token"]
        elif access is not None:
            self.shards = []
            for address in access["urls"]:
                url = urllib.parse.urlsplit(address)
                self.shards.append(HttpConnection(url.hostname or "127.0.0.1", url.port or 80))
            self.data = self.shards[0]
            self.data_auth = access["credential"]
        if not self.assigned.done():
            self.assigned.set_result(task)
        return 202

    async def request_shards(
        self,
        path: str,
        bodies: dict[int, bytes],
        timeout_s: float,
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, str], bytes]:
        """One POST to each shard named, at once: the first refusal's answer if any was
        refused, else one answer whose counts (`accepted`, `duplicates`) are summed, or,
        for frames, the answers' bodies apart (`SHARD_ANSWERS`)."""
        answers = await asyncio.gather(
            *(
                self.shards[k].request(
                    "POST",
                    path,
                    body,
                    self.data_auth,
                    timeout_s,
                    content_type=content_type,
                    accept=content_type,
                )
                for k, body in bodies.items()
            )
        )
        if len(answers) == 1:
            return answers[0]
        for answer in answers:
            if answer[0] >= 300:
                return answer
        if content_type == ARRAYS_TYPE:
            self.shard_answers = {k: a[2] for k, a in zip(bodies, answers, strict=True)}
            return answers[0]
        replies = [json.loads(a[2]) for a in answers]
        merged = {
            "accepted": sum(r["accepted"] for r in replies),
            "duplicates": sum(r["duplicates"] for r in replies),
        }
        return answers[0][0], answers[0][1], json.dumps(merged).encode()

    def cancel(self, task_id: str) -> int:
        if self.task is None or self.task["task_id"] != task_id:
            return 404
        self.cancelled = True
        self.tally.errors[f"{self.role} task cancelled"] += 1
        return 202

    async def heartbeats(self, stop: asyncio.Event) -> None:
        """Renew the lease every `heartbeat_interval_s`, as a slave does, from
        registration until the process stops."""
        await asyncio.sleep(random.uniform(0, self.heartbeat_interval_s))
        path = f"{API}/workers/{self.worker_id}/heartbeat"
        while not stop.is_set():
            tasks = []
            if self.task is not None:
                report = {"task_id": self.task["task_id"], "state": "running"}
                tasks.append({**report, "progress": dict(self.progress)})
            sent = time.monotonic()
            try:
                status, _, answer = await self.control.request(
                    "POST", path, json.dumps({"tasks": tasks}).encode(), self.credential, 10.0
                )
            except (OSError, TimeoutError, HttpError) as exc:
                self.tally.failed("heartbeat", sent, exc)
            else:
                if self.tally.answered("heartbeat", sent, status, answer) == "ok":
                    self.tally.heartbeats += self.tally.timed(sent)
                    reply = json.loads(answer)
                    # Its task's buffer credential, signed anew (they expire), as a
                    # slave's heartbeats renew it.
                    if self.task is not None:
                        fresh = reply.get("credentials", {}).get(self.task["task_id"])
                        if fresh and self.data_auth not in (
                            self.credential,
                            self.plan["operator_token"],
                        ):
                            self.data_auth = fresh
                    # A steady fleet's jobs hold their shares: a release is as wrong.
                    if reply.get("cancel") or reply.get("release"):
                        self.cancelled = True
                        self.tally.errors[f"{self.role} task cancelled"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.heartbeat_interval_s)


class SimCollector(SimWorker):
    role = "collector"

    def __init__(self, plan: dict[str, Any], url: str, tally: Tally) -> None:
        super().__init__(plan, url, tally)
        #: Each prewritten segment: where it waits, where it goes, its reference.
        self.segments: list[tuple[Path, Path, dict[str, Any]]] = []

    def prewrite(self, shared: SharedStore, staging: SharedStore, count: int) -> None:
        """Write `count` segments for this task's own folder, with the collector's own
        writer: n-step transitions of the job's observation and action shapes (read
        from the job's resolved config), the `SegmentRef` in each header. They wait
        outside the shared root, on the same file system, each moved into its place
        just before its insert: the coordinator's orphan sweep finds no more files
        that no insert claimed than with real collectors."""
        assert self.task is not None
        job_id, task_id = self.task["job_id"], self.task["task_id"]
        columns = task_columns(shared, job_id, task_id)
        folder = f"{self.worker_id}.{task_id}"
        for seq in range(count):
            ref = segment_ref(shared, job_id, folder, seq)
            staging.write_segment(ref.path, columns, header=dump(ref))
            self.segments.append((staging.resolve(ref.path), shared.resolve(ref.path), dump(ref)))
        shared.resolve(ref.path).parent.mkdir(parents=True, exist_ok=True)

    async def run(self, go_s: float, stop: asyncio.Event) -> None:
        assert self.task is not None
        tally, rate = self.tally, self.plan["insert_rate"]
        path = f"{API}/jobs/{self.task['job_id']}/segments"
        # Each collector starts at its own phase, so the fleet does not insert in step.
        start = go_s + random.uniform(0, 1 / rate)
        seq = placed = 0
        while not self.cancelled:
            # Segment i is ready at start + i / rate; like the collector's uploader, an
            # insert takes every ready segment not sent yet, up to what it holds.
            wait = start + seq / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            if now >= tally.end_s:
                return
            if seq >= len(self.segments):
                tally.ran_out += 1
                return
            ready = min(int((now - start) * rate) + 1, len(self.segments))
            batch = self.segments[seq : min(ready, seq + self.plan["segments_per_insert"])]
            for waiting, place, _ in batch[placed - seq :]:  # a retry finds its files
                os.replace(waiting, place)
                placed += 1
            # Each segment to its shard (the one shard unless the job is sharded).
            groups: dict[int, list[dict[str, Any]]] = {}
            for _, _, ref in batch:
                groups.setdefault(segment_shard(ref["path"], len(self.shards)), []).append(ref)
            bodies = {
                k: json.dumps(
                    {
                        "segments": refs,
                        "timeout_s": INSERT_TIMEOUT_S,
                        "task_id": self.task["task_id"],
                    }
                ).encode()
                for k, refs in groups.items()
            }
            sent = time.monotonic()
            try:
                status, headers, answer = await self.request_shards(path, bodies, INSERT_WAIT_S)
            except (OSError, TimeoutError, HttpError) as exc:
                tally.failed("insert", sent, exc)
                await asyncio.sleep(0.1)
                continue  # the same segments again: inserts are idempotent by path
            kind = tally.answered("insert", sent, status, answer)
            if kind == "ok":
                if tally.timed(sent):
                    tally.insert_ms.append((time.monotonic() - sent) * 1e3)
                    tally.segments_per_insert.append(len(batch))
                    reply = json.loads(answer)
                    tally.rows_indexed += reply["accepted"] * SEGMENT_ROWS
                    tally.duplicates += reply["duplicates"]
                seq += len(batch)
                self.progress["env_steps"] = seq * SEGMENT_ROWS
            elif kind == "back-pressure":
                await asyncio.sleep(retry_after_s(headers, answer))
            else:
                await asyncio.sleep(0.1)
                if status < 500:
                    seq += len(batch)  # refused for good: the next ones


class SimLearner(SimWorker):
    role = "learner"

    async def run(self, go_s: float, stop: asyncio.Event) -> None:
        assert self.task is not None
        tally, task_id = self.tally, self.task["task_id"]
        job = f"{API}/jobs/{self.task['job_id']}"
        arrays = self.plan["wire"] == "arrays"
        holds: list[str] = []
        keys: list[int] = []
        masses = [0.0] * len(self.shards)
        rng = np.random.default_rng()
        await asyncio.sleep(max(0.0, go_s - time.monotonic()))
        iters = 0
        while not self.cancelled and time.monotonic() < tally.end_s:
            # The priorities of the last batches ride on the next request, as a real
            # learner's sampler sends them (services/learner/sampling.py).
            request = SampleRequest(
                batch_size=BATCH_SIZE,
                num_batches=NUM_BATCHES,
                timeout_s=SAMPLE_TIMEOUT_S,
                task_id=task_id,
                acknowledge=holds,
                priority_keys=keys,
                priorities=[round(random.uniform(0.05, 2.0), 4) for _ in keys],
            )
            if len(self.shards) == 1:
                bodies = {
                    0: encode(request, SAMPLE_REQUEST_ARRAYS) if arrays else json_body(request)
                }
            else:
                # A draw over the shards, as a real learner's (services/buffer/sharding.py).
                counts = split_draw(BATCH_SIZE * NUM_BATCHES, masses, rng)
                owner = shard_of(np.asarray(keys, dtype=np.int64), len(self.shards))
                values = np.asarray(request.priorities, dtype=np.float64)
                bodies = {
                    k: encode(
                        dataclasses.replace(
                            request,
                            items=counts[k],
                            priority_keys=np.asarray(keys, dtype=np.int64)[owner == k].tolist(),
                            priorities=values[owner == k].tolist(),
                        ),
                        SAMPLE_REQUEST_ARRAYS,
                    )
                    for k in range(len(self.shards))
                }
            sent = time.monotonic()
            try:
                status, headers, answer = await self.request_shards(
                    f"{job}/samples",
                    bodies,
                    REQUEST_TIMEOUT_S + SAMPLE_TIMEOUT_S,
                    content_type=ARRAYS_TYPE if arrays else "application/json",
                )
            except (OSError, TimeoutError, HttpError) as exc:
                tally.failed("sample", sent, exc)
                await asyncio.sleep(0.1)
                continue
            kind = tally.answered("sample", sent, status, answer)
            if kind == "back-pressure":
                if error_code(answer) == "too_many_waiting":
                    await asyncio.sleep(retry_after_s(headers, answer))
                continue  # a sample_timeout already waited: ask again
            if kind == "error":
                await asyncio.sleep(0.1)
                continue
            if tally.timed(sent):
                tally.sample_ms.append((time.monotonic() - sent) * 1e3)
            if arrays and len(self.shards) > 1:
                parts = {k: SampledItems.from_frame(a) for k, a in self.shard_answers.items()}
                for k, part in parts.items():
                    masses[k] = part.shard.mass if part.shard is not None else 0.0
                hold_id = None
                keys = [key for part in parts.values() for key in part.keys.tolist()]
                iters += NUM_BATCHES
            elif arrays:
                items = SampledItems.from_frame(answer)
                hold_id, keys = items.hold_id, items.keys.tolist()
                iters += len(keys) // items.batch_size
            else:
                reply = json.loads(answer)
                hold_id = reply.get("hold_id")
                keys = [key for batch in reply["batches"] for key in batch["keys"]]
                iters += len(reply["batches"])
            holds = [hold_id] if hold_id else []
            self.progress["train_iter"] = iters


def json_body(request: SampleRequest) -> bytes:
    """A sample request as JSON without the fields left at their defaults, as an
    operator's tool writes it: a coordinator from before a field was added (what
    `--coordinator-from` runs) refuses a field it does not know."""
    fields = {k: v for k, v in dump(request).items() if v is not None and v != []}
    return json.dumps(fields).encode()


def task_columns(store: SharedStore, job_id: str, task_id: str) -> dict[str, np.ndarray]:
    """The rows every segment of a simulated collect task holds: n-step transitions of
    its job's observation and action shapes (read from the job's resolved config)."""
    policy = store.read_json(f"{job_id}/job.json")["policy"]
    return transitions(policy, SEGMENT_ROWS, seed=hash(task_id) & 0xFFFF)


def segment_ref(store: SharedStore, job_id: str, folder: str, seq: int) -> SegmentRef:
    """The reference of a simulated collector's segment `seq` in its own `folder`."""
    return SegmentRef(
        path=store.segment_path(job_id, folder, seq),
        rows=SEGMENT_ROWS,
        env_steps=SEGMENT_ROWS,
        policy_version=0,
    )


def transitions(policy: dict[str, Any], rows: int, seed: int) -> dict[str, np.ndarray]:
    """`rows` n-step transitions as a collector writes them, of random steps in the
    job's observation and action shapes."""
    model = policy["model"]
    obs_shape = model["obs_shape"]
    obs_shape = tuple(obs_shape) if isinstance(obs_shape, list) else (int(obs_shape),)
    actions = int(model["action_shape"])
    # An algorithm without n-step returns (PPO, whose rows the coordinator indexes the
    # same way) gets 1-step ones.
    builder = NStepBuilder(1, int(policy.get("nstep", 1)), float(policy["discount_factor"]))
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((1, *obs_shape)).astype(np.float32)
    no = np.zeros(1, dtype=bool)
    while len(builder) < rows:
        next_obs = rng.standard_normal((1, *obs_shape)).astype(np.float32)
        action = rng.integers(0, actions, size=1)
        builder.add(obs, action, np.ones(1, np.float32), next_obs, no, no)
        obs = next_obs
    return {name: column[:rows] for name, column in builder.take().items()}


class TaskInbox:
    """The slave side of every worker of one process: `POST /v1/tasks` and `DELETE
    /v1/tasks/<id>`, told apart by the secret each worker registered with."""

    def __init__(self) -> None:
        self.by_token: dict[str, SimWorker] = {}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target = line.decode("latin-1").split()[:2]
                headers = await read_head(reader)
                body = await read_body(reader, headers)
                token = headers.get("authorization", "").removeprefix("Bearer ")
                worker = self.by_token.get(token)
                if worker is None:
                    status, answer = 401, {"error": "unauthorized", "message": "unknown secret"}
                elif method == "POST" and target == "/v1/tasks":
                    task = json.loads(body)
                    status = worker.assign(task)
                    answer = {"task_id": task["task_id"]}
                elif method == "DELETE" and target.startswith("/v1/tasks/"):
                    task_id = target.removeprefix("/v1/tasks/")
                    status, answer = worker.cancel(task_id), {"task_id": task_id}
                else:
                    status, answer = 404, {"error": "not_found", "message": target}
                data = json.dumps(answer).encode()
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n".encode()
                    + data
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, HttpError, ValueError):
            return
        finally:
            writer.close()


async def generate(plan: dict[str, Any]) -> None:
    """One generator process: register its workers, wait for their tasks, write the
    segments, say it is ready; at the parent's word, run the window; report."""
    tally = Tally()
    inbox = TaskInbox()
    server = await asyncio.start_server(inbox.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    collectors = [SimCollector(plan, url, tally) for _ in range(plan["collectors"])]
    learners = [SimLearner(plan, url, tally) for _ in range(plan["learners"])]
    workers: list[SimWorker] = [*collectors, *learners]
    for worker in workers:
        inbox.by_token[worker.slave_token] = worker
    stop = asyncio.Event()
    for i in range(0, len(workers), 16):  # a few at a time: the coordinator stays calm
        await asyncio.gather(*(w.register() for w in workers[i : i + 16]))
    beating = [asyncio.create_task(w.heartbeats(stop)) for w in workers]
    await asyncio.wait_for(asyncio.gather(*(w.assigned for w in workers)), plan["assign_timeout_s"])
    kinds = collections.Counter(w.task["spec"]["kind"] for w in workers if w.task)
    shared, staging = SharedStore(plan["shared_dir"]), SharedStore(plan["staging_dir"])
    count = math.ceil(plan["insert_rate"] * plan["run_s"] * PREWRITE_MARGIN) + 2
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(4) as pool:  # overlaps the fsyncs
        await asyncio.gather(
            *(loop.run_in_executor(pool, c.prewrite, shared, staging, count) for c in collectors)
        )
    say({"ready": True, "kinds": dict(kinds), "segments_each": count})
    go = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    go_s = go["go_s"]
    tally.start_s, tally.end_s = go_s + plan["warmup_s"], go_s + plan["run_s"]

    async def meter_cpu() -> None:
        await asyncio.sleep(max(0.0, tally.start_s - time.monotonic()))
        started = time.process_time()
        await asyncio.sleep(max(0.0, tally.end_s - time.monotonic()))
        tally.cpu_s = time.process_time() - started

    metering = asyncio.create_task(meter_cpu())
    running = [asyncio.create_task(w.run(go_s, stop)) for w in (*collectors, *learners)]
    await metering
    # Requests in flight at the end finish (their answers are not counted past it).
    await asyncio.wait(running, timeout=REQUEST_TIMEOUT_S + SAMPLE_TIMEOUT_S)
    stop.set()
    await asyncio.wait(beating, timeout=REQUEST_TIMEOUT_S)
    for task in (*running, *beating):
        task.cancel()
    say({"result": tally.result()})
    server.close()


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


# --- the parent's side: one row --------------------------------------------------------


def proc_memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MB (/proc/<pid>/status)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def machine_busy_s() -> float:
    """CPU time the whole machine has been busy, in seconds (/proc/stat, steal included:
    a core the hypervisor took was not ours either)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Generator:
    """One generator process and the lines it prints, read by a thread."""

    def __init__(self, plan: dict[str, Any], log_path: Path) -> None:
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--generator"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(plan) + "\n")
        self.process.stdin.flush()
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")

    def expect(self, key: str, deadline_s: float) -> dict[str, Any]:
        """The next record holding `key`, before `deadline_s` (monotonic)."""
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline_s - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"a generator sent no {key!r} in time:\n{self.tail()}") from None
            if not line:
                raise RuntimeError(f"a generator exited before {key!r}:\n{self.tail()}")
            record = json.loads(line)
            if key in record:
                return record

    def send(self, record: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(record) + "\n")
        self.process.stdin.flush()

    def tail(self, lines: int = 20) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._log.close()


def job_config(args: argparse.Namespace, collectors: int) -> dict[str, Any]:
    """A DQN CartPole job with a prioritized buffer and no rate limit unless asked;
    its share of the collectors; no step budget (it runs until stopped)."""
    replay: dict[str, Any] = {
        "type": "prioritized",
        "replay_buffer_size": args.buffer_items,
        "min_size_to_sample": 1000,
    }
    if args.shards > 1:  # unset otherwise: a coordinator from before shards refuses the key
        replay["shards"] = args.shards
    if args.samples_per_insert:
        replay["samples_per_insert"] = args.samples_per_insert
    return {
        "env": {"env_id": "CartPole-v1"},
        "policy": {
            "type": "dqn",
            "learn": {"batch_size": BATCH_SIZE, "num_batches": NUM_BATCHES},
            "collect": {"n_sample": SEGMENT_ROWS},
            "other": {"replay_buffer": replay},
        },
        "system": {"collector_num": max(1, math.ceil(collectors / args.jobs))},
    }


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_row(
    args: argparse.Namespace, collectors: int, *, profile_to: Path | None = None
) -> dict[str, Any]:
    """One coordinator under `collectors` collectors and `args.learners` learners."""
    from drover.local import LocalCluster

    run_s = args.warmup_s + args.seconds
    with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
        # Another checkout's coordinator, to compare versions in one run.
        extra_env = {"PYTHONPATH": str(args.coordinator_from)} if args.coordinator_from else {}
        extra_env |= dict(args.coordinator_env)
        cluster = LocalCluster(
            Path(tmp) / "shared", num_collectors=0, num_learners=0, extra_env=extra_env
        )
        generators: list[Generator] = []
        spy: subprocess.Popen | None = None
        try:
            cluster.start()
            assert cluster.coordinator.process is not None
            pid = cluster.coordinator.process.pid
            for _ in range(args.jobs):
                cluster.client.submit_job(job_config(args, collectors))
            procs = max(1, min(args.procs, collectors + args.learners))
            for i, (c, m) in enumerate(
                zip(split(collectors, procs), split(args.learners, procs), strict=True)
            ):
                plan = {
                    "coordinator_host": "127.0.0.1",
                    "coordinator_port": cluster.coordinator.port,
                    "registration_token": cluster.registration_token,
                    "operator_token": cluster.token,
                    "via": args.via,
                    "shared_dir": str(cluster.shared_dir),
                    "staging_dir": str(Path(tmp) / "staging"),
                    "collectors": c,
                    "learners": m,
                    "insert_rate": args.insert_rate,
                    "segments_per_insert": args.segments_per_insert,
                    "wire": args.wire,
                    "warmup_s": args.warmup_s,
                    "run_s": run_s,
                    "assign_timeout_s": 60.0,
                }
                generators.append(Generator(plan, Path(tmp) / f"generator-{i}.log"))
            deadline = time.monotonic() + args.setup_timeout_s
            readies = [g.expect("ready", deadline) for g in generators]
            kinds = collections.Counter()
            for ready in readies:
                kinds.update(ready["kinds"])
            go_s = time.monotonic() + 0.2
            for g in generators:
                g.send({"go_s": go_s})
            time.sleep(max(0.0, go_s + args.warmup_s - time.monotonic()))
            # The processes that serve the data: the coordinator, and its buffer
            # processes (the spare one too, if it started: it idles).
            serving = [pid, *child_processes(pid, "services.buffer")]
            cpu0, busy0, t0 = sum(map(cpu_s, serving)), machine_busy_s(), time.monotonic()
            if profile_to is not None:
                duration_s = max(1, min(15, int(args.seconds) - 1))
                spy = subprocess.Popen(
                    [
                        *py_spy(),
                        *f"record --pid {pid} --duration {duration_s} --rate 100".split(),
                        *["--subprocesses", "--gil", "--nonblocking"],
                        *["--format", "raw", "--output"],
                        str(profile_to),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            time.sleep(max(0.0, go_s + run_s - time.monotonic()))
            cpu1, busy1, t1 = sum(map(cpu_s, serving)), machine_busy_s(), time.monotonic()
            memory = [proc_memory_mb(p) for p in serving]
            rss_mb, peak_mb = sum(m[0] for m in memory), sum(m[1] for m in memory)
            deadline = time.monotonic() + REQUEST_TIMEOUT_S + SAMPLE_TIMEOUT_S + 30
            results = [g.expect("result", deadline)["result"] for g in generators]
            if spy is not None:
                _, err = spy.communicate(timeout=60)
                if spy.returncode != 0:
                    print(f"py-spy failed ({spy.returncode}): {err.strip()}", file=sys.stderr)
        except BaseException:
            for g in generators:
                print(f"generator log:\n{g.tail()}", file=sys.stderr)
            print(f"coordinator log:\n{cluster.coordinator.log_tail()}", file=sys.stderr)
            raise
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
                spy.wait()
            for g in generators:
                g.stop()
            cluster.stop()
    window_s = t1 - t0
    merged = merge(results)
    data_plane_cpu_s = cpu1 - cpu0
    return {
        "collectors": collectors,
        "learners": args.learners,
        "jobs": args.jobs,
        "insert_rate": args.insert_rate,
        "seconds": args.seconds,
        "window_s": window_s,
        "tasks": dict(kinds),
        "profiled": profile_to is not None,
        **merged,
        "inserts_per_s": len(merged["insert_ms"]) / args.seconds,
        "segments_per_s": sum(merged["segments_per_insert"]) / args.seconds,
        "transitions_per_s": merged["rows_indexed"] / args.seconds,
        "samples_per_s": len(merged["sample_ms"]) / args.seconds,
        "buffer_processes": len(serving) - 1,
        "data_plane_cpu_share": data_plane_cpu_s / window_s,
        "data_plane_cpu_ms_per_1k": (
            data_plane_cpu_s * 1e3 / (merged["rows_indexed"] / 1000)
            if merged["rows_indexed"]
            else None
        ),
        "data_plane_cpu_ms_per_round": (
            data_plane_cpu_s * 1e3 / len(merged["sample_ms"]) if merged["sample_ms"] else None
        ),
        "data_plane_rss_mb": rss_mb,
        "data_plane_peak_rss_mb": peak_mb,
        "generator_cpu_share": merged["cpu_s"] / args.seconds,
        "others_cpu_cores": max(0.0, (busy1 - busy0) - data_plane_cpu_s - merged["cpu_s"])
        / window_s,
    }


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {
        "insert_ms": [],
        "segments_per_insert": [],
        "sample_ms": [],
        "errors": collections.Counter(),
        "back_pressure": collections.Counter(),
    }
    for key in ("rows_indexed", "duplicates", "heartbeats", "ran_out", "cpu_s"):
        merged[key] = sum(r[key] for r in results)
    for r in results:
        for key in ("insert_ms", "segments_per_insert", "sample_ms"):
            merged[key] += r[key]
        merged["errors"].update(r["errors"])
        merged["back_pressure"].update(r["back_pressure"])
    merged["errors"] = dict(merged["errors"])
    merged["back_pressure"] = dict(merged["back_pressure"])
    for key in ("insert", "sample"):
        values = merged[f"{key}_ms"]
        merged[f"{key}_latency_ms"] = (
            {
                "p50": statistics.median(values),
                "p99": float(np.percentile(values, 99)),
                "max": max(values),
            }
            if values
            else None
        )
    return merged


def py_spy() -> list[str]:
    """The py-spy command: the one beside this Python, else on the PATH."""
    here = Path(sys.executable).parent / "py-spy"
    found = str(here) if here.exists() else shutil.which("py-spy")
    return [found] if found else []


# --- the parent's side: the profile and the table --------------------------------------

_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
#: Frames of the project's own code (the rest is the server, Flask, pydantic, ...).
_OURS = ("services/", "common/", "algorithms/")


@dataclass(frozen=True)
class Profile:
    """Where a profiled process spent its samples, from py-spy's raw (collapsed) stacks."""

    samples: int
    #: Functions by samples as the innermost frame (own time).
    own: list[tuple[str, int]]
    #: The project's functions by samples anywhere on the stack (total time).
    total: list[tuple[str, int]]
    #: Own time by where the code lives: a project package, or a library.
    places: list[tuple[str, int]]


def profile_summary(raw: Path, top: int) -> Profile:
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    places: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [_FRAME.match(f) for f in stack.split(";")]
        named = [f"{m['name']} ({m['path']})" if m else "?" for m in frames]
        own[named[-1]] += n
        for frame in set(named):
            if frame.endswith(")") and frame.rsplit("(", 1)[1].startswith(_OURS):
                total[frame] += n
        innermost = frames[-1]
        places[place_of(innermost["path"]) if innermost else "?"] += n
    return Profile(samples, own.most_common(top), total.most_common(top), places.most_common())


def place_of(path: str) -> str:
    """`services/buffer` for the project's code, else the library (`waitress`, `json`)."""
    parts = path.split("/")
    if path.startswith(_OURS):
        return "/".join(parts[:2]) if len(parts) > 2 else parts[0]
    return parts[0].removesuffix(".py") if len(parts) > 1 else f"{path} (stdlib)"


def latency_cell(latency: dict[str, float] | None) -> str:
    if latency is None:
        return "-"
    return f"{latency['p50']:.1f} / {latency['p99']:.0f} / {latency['max']:.0f}"


def counts_cell(counts: dict[str, int]) -> str:
    return ", ".join(f"{n:,} {what}" for what, n in sorted(counts.items())) or "0"


def targets_met(row: dict[str, Any]) -> list[tuple[str, bool]]:
    insert, sample = row["insert_latency_ms"], row["sample_latency_ms"]
    return [
        ("0 errors", not row["errors"]),
        ("0 busy answers", not any("busy" in kind for kind in row["back_pressure"])),
        (f"insert p99 < {TARGET_P99_MS:.0f} ms", bool(insert) and insert["p99"] < TARGET_P99_MS),
        (f"sample p99 < {TARGET_P99_MS:.0f} ms", bool(sample) and sample["p99"] < TARGET_P99_MS),
        (
            f">= {TARGET_TRANSITIONS_PER_S:,} transitions/s",
            row["transitions_per_s"] >= TARGET_TRANSITIONS_PER_S,
        ),
        (f">= {TARGET_SAMPLES_PER_S:,} samples/s", row["samples_per_s"] >= TARGET_SAMPLES_PER_S),
    ]


def table_of(rows: list[dict[str, Any]], args: argparse.Namespace) -> Any:
    from rich.table import Table

    table = Table(
        title=f"Fleet load: one coordinator, {args.jobs} job(s) with {args.buffer_items:,}-item "
        f"prioritized buffers; each collector inserts {SEGMENT_ROWS}-row segments at "
        f"{args.insert_rate:g}/s (those ready go in one insert, up to "
        f"{args.segments_per_insert}, as the collector's uploader sends them), each learner "
        f"samples {NUM_BATCHES} x {BATCH_SIZE} and sends "
        f"priorities in a closed loop ({args.wire} bodies"
        + (
            ", through the coordinator's routes with the cluster token"
            if args.via == "coordinator"
            else ""
        )
        + "".join(f", {name}={value}" for name, value in args.coordinator_env)
        + f"); {args.seconds:g} s a row after {args.warmup_s:g} s of warm-up"
    )
    for column in (
        "collectors",
        "learners",
        "segments/s (offered)",
        "inserts/s",
        "transitions/s",
        "insert ms p50/p99/max",
        "samples/s",
        "sample ms p50/p99/max",
        "errors",
        "back-pressure",
        "data plane CPU",
        "CPU / 1k transitions",
        "RSS (peak)",
        "generator CPU",
        "others' CPU",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        target = row["collectors"] == TARGET_COLLECTORS and row["learners"] == TARGET_LEARNERS
        label = f"{row['collectors']}"
        if row["profiled"]:
            label += " (profiled)"
        elif target:
            label += " (target)"
        offered = row["collectors"] * row["insert_rate"]
        per_1k = row["data_plane_cpu_ms_per_1k"]
        table.add_row(
            label,
            f"{row['learners']}",
            f"{row['segments_per_s']:,.0f} ({offered:,.0f})",
            f"{row['inserts_per_s']:,.0f}",
            f"{row['transitions_per_s']:,.0f}",
            latency_cell(row["insert_latency_ms"]),
            f"{row['samples_per_s']:,.0f}",
            latency_cell(row["sample_latency_ms"]),
            counts_cell(row["errors"]),
            counts_cell(row["back_pressure"]),
            f"{row['data_plane_cpu_share']:.0%}",
            f"{per_1k:,.1f} ms" if per_1k is not None else "-",
            f"{row['data_plane_rss_mb']:,.0f} ({row['data_plane_peak_rss_mb']:,.0f}) MB",
            f"{row['generator_cpu_share']:.0%}",
            f"{row['others_cpu_cores']:.2f} cores",
        )
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectors", default="8,32,64,128", help="N per row, comma-separated")
    parser.add_argument("--learners", type=int, default=4, help="at most one per job")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="the timed window a row")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument(
        "--insert-rate", type=float, default=20.0, help="segments/s a collector writes"
    )
    parser.add_argument("--buffer-items", type=int, default=1_000_000)
    parser.add_argument(
        "--samples-per-insert", type=float, help="the jobs' rate limiter (default: none)"
    )
    parser.add_argument("--procs", type=int, default=2, help="generator processes")
    parser.add_argument("--setup-timeout-s", type=float, default=300.0)
    parser.add_argument(
        "--profile-at", type=int, help="run this N once more under py-spy (default: 64 if a row)"
    )
    parser.add_argument(
        "--profile-out", type=Path, help="py-spy's raw stacks (default: a temp file)"
    )
    parser.add_argument(
        "--segments-per-insert",
        type=int,
        default=SEGMENTS_PER_INSERT,
        help="most segments one insert carries (1: a collector before batching)",
    )
    parser.add_argument(
        "--wire",
        choices=("arrays", "json"),
        default="arrays",
        help="the learners' sample bodies: binary frames (a real learner's) or JSON",
    )
    parser.add_argument(
        "--shards", type=int, default=1, help="buffer processes each job's buffer is split over"
    )
    parser.add_argument(
        "--via",
        choices=("buffer", "coordinator"),
        default="buffer",
        help="where workers send their data: where their task says (a worker's path), or "
        "the coordinator's routes with the cluster token (an operator's path, passed on)",
    )
    parser.add_argument(
        "--coordinator-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the coordinator (repeatable), e.g. to compare a limit",
    )
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--coordinator-from",
        type=Path,
        help="run the coordinator from this checkout (an earlier version, to compare)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 collectors, 1 learner")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--generator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.collectors, args.learners, args.jobs = "2", 1, 1
        args.seconds, args.warmup_s, args.procs = 2.0, 1.0, 1
        args.buffer_items, args.no_profile = 100_000, True
    try:
        args.collectors = [int(n) for n in args.collectors.split(",") if n.strip()]
    except ValueError:
        parser.error("--collectors: comma-separated integers")
    if not args.collectors or min(args.collectors) < 1:
        parser.error("--collectors: one or more counts of at least 1")
    if args.jobs < 1 or not 0 <= args.learners <= args.jobs:
        parser.error("--learners: from 0 to --jobs (a job has one learner)")
    if args.seconds <= 0 or args.warmup_s < 0 or args.insert_rate <= 0 or args.procs < 1:
        parser.error("--seconds, --insert-rate and --procs must be positive")
    if args.segments_per_insert < 1:
        parser.error("--segments-per-insert: at least 1")
    if args.via == "coordinator" and args.shards > 1:
        parser.error("--via coordinator: a learn task draws from shards where its task says")
    try:
        args.coordinator_env = [tuple(kv.split("=", 1)) for kv in args.coordinator_env]
        if any(len(kv) != 2 or not kv[0] for kv in args.coordinator_env):
            raise ValueError
    except ValueError:
        parser.error("--coordinator-env: NAME=VALUE")
    if args.profile_at is None and not args.no_profile and TARGET_COLLECTORS in args.collectors:
        args.profile_at = TARGET_COLLECTORS
    if args.no_profile:
        args.profile_at = None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.generator:
        asyncio.run(generate(json.loads(sys.stdin.readline())))
        return 0
    from rich.console import Console

    from bench.learner_scaling import cpu_line, print_load_before

    console = Console(width=230)
    console.print(cpu_line())
    print_load_before(console)
    if args.profile_at is not None and not py_spy():
        console.print("[yellow]py-spy is not installed (pip install py-spy): no profile")
        args.profile_at = None
    rows = []
    for n in args.collectors:
        rows.append(run_row(args, n))
        row = rows[-1]
        console.print(
            f"{n} collectors: {row['transitions_per_s']:,.0f} transitions/s, "
            f"{row['samples_per_s']:,.0f} samples/s, data plane at "
            f"{row['data_plane_cpu_share']:.0%} of a core ({row['buffer_processes']} "
            "buffer processes)"
        )
    profile = None
    if args.profile_at is not None:
        out = args.profile_out or Path(tempfile.gettempdir()) / f"fleet-{args.profile_at}.txt"
        rows.append(run_row(args, args.profile_at, profile_to=out))
        if out.exists():
            profile = profile_summary(out, 15)
        else:
            console.print(f"[yellow]py-spy wrote no profile to {out}")
    console.print(table_of(rows, args))
    console.print(
        "Latencies: answered requests sent in the window (2xx; a long-poll counts its wait). "
        "Errors: 5xx, connection failures and timeouts, unexpected 4xx. Back-pressure: 429 on "
        "inserts, 503 sample_timeout / too_many_waiting on samples. Data plane CPU: utime + "
        "stime over the window of the coordinator and its buffer processes, summed, as a share "
        "of one core. Generator CPU: the fleet's own "
        "processes, likewise. Others' CPU: the rest of the machine's busy time meanwhile, in "
        f"cores. Segments ({SEGMENT_ROWS} rows, the job's schema) written before the window "
        "and moved into place at each insert, so disk writes do not count. Segments/s: those "
        "acknowledged; inserts/s: the requests that carried them."
    )
    for row in rows:
        extra = [f"{row['heartbeats']:,} heartbeats"]
        if row["data_plane_cpu_ms_per_round"] is not None:
            extra.append(
                f"data plane CPU per learner round {row['data_plane_cpu_ms_per_round']:.2f} ms "
                "(all it did in the window, inserts included, over the rounds)"
            )
        if row["duplicates"]:
            extra.append(f"{row['duplicates']:,} duplicate inserts")
        if row["ran_out"]:
            extra.append(f"{row['ran_out']} collectors ran out of segments")
        console.print(f"{row['collectors']} collectors: tasks {row['tasks']}; " + "; ".join(extra))
    target = [
        r
        for r in rows
        if r["collectors"] == TARGET_COLLECTORS
        and r["learners"] == TARGET_LEARNERS
        and not r["profiled"]
    ]
    if target:
        verdicts = [f"{name}: {'met' if ok else 'NOT met'}" for name, ok in targets_met(target[0])]
        console.print(
            f"Targets at {TARGET_COLLECTORS} collectors and {TARGET_LEARNERS} learners: "
            + "; ".join(verdicts)
        )
    if profile is not None:
        console.print(
            f"Profile of the coordinator and its buffer processes at {args.profile_at} "
            f"collectors (py-spy --gil --subprocesses: {profile.samples:,} samples of whichever "
            "thread held each process's GIL, 100 a second each):"
        )
        for title, entries in (
            ("own time, by where the code lives", profile.places),
            ("own time, by function", profile.own),
            ("total time, the project's functions", profile.total),
        ):
            console.print(f"  {title}:")
            for frame, n in entries:
                console.print(f"    {n / max(profile.samples, 1):6.1%}  {frame}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
