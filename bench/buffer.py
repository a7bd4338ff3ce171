"""Replay-buffer benchmark: in-process timings, HTTP throughput, index memory.

    python bench/buffer.py [--capacity 1000000]
    python bench/buffer.py --samplers [--sampler-items 1000000 10000000]
    python bench/buffer.py --snapshot-items 10000000 [--snapshot-seconds 10]

1. In-process, a prioritized buffer filled to `capacity`: insert 1,000 items (one
   segment, evicting 1,000), and sample a batch of 256 with importance weights plus a
   priority update of 256 keys. Median and p90 over many repetitions.
2. Through a real coordinator process (waitress, HTTP on 127.0.0.1): sample requests
   of num_batches=8, batch_size=64 from one client, sequentially, for a few seconds.
3. Memory: resident-set growth of a fresh process that builds and fills a
   `capacity`-item prioritized index.
4. Samplers, at each of `--sampler-items` (one fresh process each): the index's
   memory (bytes of the table's arrays and of the sampler's, and the resident-set
   growth of building and filling it) and the time of one draw of 8 x 64 items, for
   the uniform sampler, the uniform sampler it replaced (two sum trees, kept here as
   `sum_tree_uniform`, the reference) and the prioritized one: with every slot
   live, half of them at random, and 5,000; and a whole request of 8 x 64 from the
   full buffer. `--samplers` runs only this.

With `--snapshot-items N`, only this instead: a prioritized buffer filled to N items
(segments of `--snapshot-segment-rows` items) and one thread sampling batches of 256
(and sending their priorities back) on a fixed schedule of `--snapshot-rate`
requests/s, for a few seconds each with no snapshot, with the old full copy under
the lock (kept here as `full_copy_snapshot`, the reference) back to back, and with
`ReplayBuffer.cut` back to back: sample latency p50/p99/max, counted from when each
request was due (so a request that waited behind a stalled one counts its wait too),
the longest the buffer's lock was held per snapshot, and a snapshot's duration.

Prints a table. Timings vary with machine load: compare within one run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import ReplayBufferConfig  # noqa: E402
from common.messages import PriorityUpdate, SampleRequest, SegmentRef  # noqa: E402
from common.process import yield_to_requests  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from services.buffer.core import _HOLD_COLUMNS, ReplayBuffer  # noqa: E402
from services.buffer.credentials import TaskGrants, credential_key  # noqa: E402
from services.buffer.host import ShardHost, ShardLimits  # noqa: E402
from services.buffer.selectors import PrioritizedSampler  # noqa: E402
from services.buffer.table import COLUMNS  # noqa: E402


class NoFiles:
    def delete(self, rel: str) -> bool:
        return True

    def write_bytes(self, rel: str, data: bytes) -> None:
        pass


#: The one job of every buffer here.
JOB_ID = "job-bench"


def ref(seq: int, rows: int, job: str = JOB_ID) -> SegmentRef:
    return SegmentRef(
        path=f"{job}/segments/w/{seq:08d}.safetensors",
        rows=rows,
        env_steps=rows,
        policy_version=0,
    )


def filled_buffer(capacity: int) -> tuple[ReplayBuffer, int]:
    config = ReplayBufferConfig(
        type="prioritized", replay_buffer_size=capacity, min_size_to_sample=1
    )
    buffer = ReplayBuffer(JOB_ID, config, NoFiles(), error_buffer=0.0)
    seq = 0
    while buffer.size < capacity:
        buffer.insert([ref(seq, min(10_000, capacity - buffer.size))])
        seq += 1
    return buffer, seq


def filled_segments(capacity: int, rows: int) -> ReplayBuffer:
    """A prioritized buffer of `capacity` items in segments of `rows` items."""
    config = ReplayBufferConfig(
        type="prioritized", replay_buffer_size=capacity, min_size_to_sample=1
    )
    buffer = ReplayBuffer(JOB_ID, config, NoFiles(), error_buffer=0.0)
    for seq in range(-(-capacity // rows)):
        buffer.insert([ref(seq, min(rows, capacity - buffer.size))])
    return buffer


def full_copy_snapshot(buffer: ReplayBuffer) -> tuple[bytes, dict, float]:
    """The reference: how `snapshot` worked before `cut` (every array copied, and the
    segments listed, under the buffer's lock; then `safetensors` serialized them).
    Returns (bytes, record, seconds the lock was held)."""
    from safetensors.numpy import save as st_save

    table = buffer.table
    with buffer._cond:
        held_from = time.perf_counter()
        arrays = {name: np.ascontiguousarray(getattr(table, name)).copy() for name in COLUMNS}
        arrays["free"] = table._free[: table.free_count].copy()
        pos = np.arange(table._head, table._tail) % table.capacity
        arrays["order_slot"] = table._ring_slot[pos]
        arrays["order_key"] = table._ring_key[pos]
        holds = list(buffer._holds.values())
        for column in _HOLD_COLUMNS:
            parts = [getattr(h, column) for h in holds]
            dtype = getattr(table, column).dtype
            arrays[f"held_{column}"] = np.concatenate(parts) if parts else np.zeros(0, dtype)
        segments = sorted(buffer._segments.items())
        meta = {
            "segments": [[sid, s.path, s.live_items] for sid, s in segments],
            "dead": sorted(buffer._dead),
            "last_seq": dict(buffer._last_seq),
            "lag_counts": buffer._lag_counts.tolist(),
            "sampler": buffer.sampler.state(),
            "rng": buffer._rng.bit_generator.state,
        }
        held_s = time.perf_counter() - held_from
    data = st_save(arrays)
    meta["arrays_sha256"] = hashlib.sha256(data).hexdigest()
    return data, meta, held_s


def sample_latencies(
    buffer: ReplayBuffer,
    seconds: float,
    rate: float,
    snapshot: Callable[[], tuple[float, float]] | None,
    host: ShardHost | None = None,
) -> tuple[list[float], list[tuple[float, float]]]:
    """Latencies (ms, from when each was due) of sample requests of 256 items due
    `rate` times a second for `seconds`, while another thread takes snapshots back to
    back; and (lock hold s, duration s) of each snapshot that ended in that time."""
    stop = threading.Event()
    snapshots: list[tuple[float, float]] = []

    def snapshotting() -> None:
        while not stop.is_set():
            snapshots.append(snapshot())

    thread = threading.Thread(target=snapshotting) if snapshot is not None else None
    if thread is not None:
        thread.start()
    rng = np.random.default_rng(0)
    latencies = []
    due = time.perf_counter()
    end = due + seconds
    while due < end:
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        priorities = rng.uniform(0, 2, 256).tolist()
        if host is None:
            (batch,) = buffer.sample(256, 1, timeout_s=10.0)
            latencies.append((time.perf_counter() - due) * 1e3)
            buffer.update_priorities(batch.keys, priorities)
        else:
            # What a learner's request does past HTTP: the buffer process's checks,
            # then the buffer.
            request = SampleRequest(batch_size=256, num_batches=1, timeout_s=10.0)
            (batch,) = host.sample(host.job_id, request).reply().batches
            latencies.append((time.perf_counter() - due) * 1e3)
            host.update_priorities(
                host.job_id, PriorityUpdate(keys=batch.keys, priorities=priorities)
            )
        due += 1.0 / rate
    stop.set()
    if thread is not None:
        thread.join()
    return latencies, snapshots


def shard_with_buffer(items: int, store: SharedStore) -> ShardHost:
    """A buffer process's host (what serves a job's buffer) of a prioritized buffer of
    `items` items, empty, its snapshots kept in `store`."""
    config = ReplayBufferConfig(type="prioritized", replay_buffer_size=items, min_size_to_sample=1)
    return ShardHost.open(
        store,
        JOB_ID,
        config,
        error_buffer=0.0,
        seed=0,
        grants=TaskGrants(credential_key("bench"), JOB_ID),
        limits=ShardLimits(),
    )


def timed_snapshot(host: ShardHost) -> tuple[float, float]:
    """A buffer process's snapshot, written to disk: (longest lock hold s, duration s)."""
    yield_to_requests()  # what its upkeep thread does first
    started = time.perf_counter()
    held_s = host.snapshot() or 0.0
    return held_s, time.perf_counter() - started


def snapshot_bench(items: int, rows: int, seconds: float, rate: float) -> Table:
    started = time.perf_counter()
    shared = tempfile.TemporaryDirectory()
    host = shard_with_buffer(items, SharedStore(shared.name))
    buffer = host.buffer
    for seq in range(-(-items // rows)):
        buffer.insert([ref(seq, min(rows, items - buffer.size), job=JOB_ID)])
    fill_s = time.perf_counter() - started

    def before() -> tuple[float, float]:
        t0 = time.perf_counter()
        _, _, held_s = full_copy_snapshot(buffer)
        return held_s, time.perf_counter() - t0

    def after() -> tuple[float, float]:
        taken = buffer.cut()
        return taken.longest_lock_hold_s, taken.duration_s

    runs = {
        "no snapshots": (None, None),
        "snapshots, before: full copy in the lock": (before, None),
        "snapshots, after: ReplayBuffer.cut": (after, None),
        "no snapshots, through the buffer process's host": (None, host),
        "snapshots, after: the buffer process's, written to disk": (
            lambda: timed_snapshot(host),
            host,
        ),
    }
    table = Table(
        title=f"Sample latency during snapshots: prioritized, {items:,} items in "
        f"{-(-items // rows):,} segments (filled in {fill_s:.0f} s); {rate:.0f} samples of "
        f"256 due a second, {seconds:.0f} s each"
    )
    for column in ("run", "samples", "p50", "p99", "max", "snapshots", "longest lock hold"):
        table.add_column(column, justify="left" if column == "run" else "right")
    table.add_column("snapshot time (mean)", justify="right")
    for name, (snapshot, through) in runs.items():
        latencies, snapshots = sample_latencies(buffer, seconds, rate, snapshot, through)
        lock_ms = [h * 1e3 for h, _ in snapshots]
        table.add_row(
            name,
            f"{len(latencies):,}",
            f"{statistics.median(latencies):.2f} ms",
            f"{np.percentile(latencies, 99):.2f} ms",
            f"{max(latencies):.1f} ms",
            f"{len(snapshots)}" if snapshot else "",
            f"{max(lock_ms):,.1f} ms" if snapshots else "",
            f"{statistics.mean(d for _, d in snapshots) * 1e3:,.0f} ms" if snapshots else "",
        )
    shared.cleanup()
    return table


class CountingStore(SharedStore):
    """A shared store that counts the bytes it writes into a buffer's snapshot folder."""

    written = 0

    def write_bytes(self, rel: str, data: bytes | memoryview) -> int:  # type: ignore[override]
        if "/buffer-" in rel:
            self.written += len(data)
        return super().write_bytes(rel, data)

    def write_json(self, rel: str, data: object) -> None:  # type: ignore[override]
        if "/buffer-" in rel:
            self.written += len(json.dumps(data))
        super().write_json(rel, data)


def steady_bench(
    items_list: list[int], seconds: float, insert_rate: float, sample_rate: float, period_s: float
) -> Table:
    """Snapshots during steady training: inserts of 64-item segments at `insert_rate`
    items/s into a full prioritized buffer (evicting the oldest), samples of 256 with
    their priorities sent back at `sample_rate`/s, and the coordinator's snapshot thread
    every `period_s`. Per buffer size and snapshot mode: bytes written per second, the
    sample latency while snapshots run, and the time a new coordinator takes to
    restore the job from what was written."""
    table = Table(
        title=f"Snapshots during steady training: {insert_rate:,.0f} items/s inserted in "
        f"64-item segments, {sample_rate:.0f} samples of 256 (+ priorities) a second, a "
        f"snapshot every {period_s:g} s, {seconds:.0f} s each"
    )
    for column in ("items", "snapshots", "written/s", "per item inserted", "sample p50", "p99"):
        table.add_column(column, justify="right")
    table.add_column("restore", justify="right")
    for items in items_list:
        for mode, compact_at in (("a whole cut each time (before)", 0.0), ("deltas (now)", 1.0)):
            row = steady_run(items, compact_at, seconds, insert_rate, sample_rate, period_s)
            table.add_row(f"{items:,}", mode, *row)
    return table


def steady_run(
    items: int,
    compact_at: float,
    seconds: float,
    insert_rate: float,
    sample_rate: float,
    period_s: float,
) -> list[str]:
    """One row of `steady_bench`."""
    shared = tempfile.TemporaryDirectory()
    store = CountingStore(shared.name)
    host = shard_with_buffer(items, store)
    host.chains.compact_at = compact_at
    buffer = host.buffer
    seq = 0
    while buffer.size < items:
        buffer.insert([ref(seq, min(256, items - buffer.size), job=JOB_ID)])
        seq += 1
    host.snapshot()  # the first cut, before the timed window
    store.written = 0
    stop = threading.Event()

    def inserting() -> None:
        due, n = time.perf_counter(), seq
        while not stop.is_set():
            buffer.insert([ref(n, 64, job=JOB_ID)], force=True)
            n += 1
            due += 64 / insert_rate
            time.sleep(max(0.0, due - time.perf_counter()))

    def snapshotting() -> None:
        yield_to_requests()
        while not stop.wait(period_s):
            host.snapshot()

    threads = [threading.Thread(target=inserting), threading.Thread(target=snapshotting)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    latencies, _ = sample_latencies(buffer, seconds, sample_rate, None, host)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    written = store.written
    t0 = time.perf_counter()
    again = shard_with_buffer(items, SharedStore(shared.name))
    again.restore()
    restore_s = time.perf_counter() - t0
    assert again.buffer.size == items
    again.stop()
    host.stop()
    shared.cleanup()
    return [
        f"{written / elapsed / 1e6:,.2f} MB/s",
        f"{written / (insert_rate * elapsed):,.0f} B",
        f"{statistics.median(latencies):.2f} ms",
        f"{np.percentile(latencies, 99):.2f} ms",
        f"{restore_s:.2f} s",
    ]


def in_process(capacity: int, repeats: int) -> dict[str, list[float]]:
    buffer, seq = filled_buffer(capacity)
    rng = np.random.default_rng(0)
    insert_ms, sample_update_ms = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buffer.insert([ref(seq, 1000)])
        insert_ms.append((time.perf_counter() - t0) * 1e3)
        seq += 1
        t0 = time.perf_counter()
        (batch,) = buffer.sample(256, 1, timeout_s=0)
        buffer.update_priorities(batch.keys, rng.uniform(0, 2, 256).tolist())
        sample_update_ms.append((time.perf_counter() - t0) * 1e3)
    return {"insert 1,000 items": insert_ms, "sample 256 + update 256": sample_update_ms}


def http_throughput(seconds: float) -> tuple[float, int]:
    from common.storage import SharedStore
    from drover.local import LocalCluster

    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), num_collectors=0, num_learners=0)
        with cluster:
            config = {
                "env": {"env_id": "CartPole-v1"},
                "policy": {
                    "other": {
                        "replay_buffer": {
                            "type": "prioritized",
                            "replay_buffer_size": 1_000_000,
                            "min_size_to_sample": 1000,
                        }
                    }
                },
            }
            job_id = cluster.client.submit_job(config).job_id
            store = SharedStore(cluster.shared_dir)
            columns = {"obs": np.zeros((1000, 4), np.float32)}
            refs = []
            for seq in range(100):
                path = store.segment_path(job_id, "w", seq)
                store.write_segment(path, columns)
                refs.append(SegmentRef(path=path, rows=1000, env_steps=1000, policy_version=0))
            cluster.data.insert_segments(job_id, refs)
            count, deadline = 0, time.monotonic() + seconds
            started = time.monotonic()
            while time.monotonic() < deadline:
                cluster.data.sample(job_id, batch_size=64, num_batches=8, timeout_s=1.0)
                count += 1
            return count / (time.monotonic() - started), count


MEMORY_PROBE = """
import sys
sys.path.insert(0, {root!r})
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import services.coordinator.core  # what a coordinator imports anyway
sys.path.insert(0, {bench!r})
from buffer import filled_buffer
before = rss_mb()
buffer, _ = filled_buffer({capacity})
print(rss_mb() - before, buffer.size)
"""


def index_memory_mb(capacity: int) -> tuple[float, int]:
    code = MEMORY_PROBE.format(root=str(ROOT), bench=str(ROOT / "bench"), capacity=capacity)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    ).stdout.split()
    return float(out[0]), int(out[1])


def sum_tree_uniform(capacity: int) -> PrioritizedSampler:
    """The reference: the uniform sampler before the current one, a prioritized
    sampler with alpha = beta = 0 (two float64 sum trees over the capacity)."""
    return PrioritizedSampler(capacity, alpha=0.0, beta=0.0, beta_anneal_steps=0)


#: Name: (the config's sampler type, what replaces its sampler, if anything).
SAMPLERS: dict[str, tuple[str, Callable[[int], PrioritizedSampler] | None]] = {
    "uniform": ("uniform", None),
    "uniform, before: two sum trees": ("uniform", sum_tree_uniform),
    "prioritized": ("prioritized", None),
}


def owned_bytes(value: object) -> int:
    """Bytes of the numpy arrays a value owns (views are not counted), looking into
    its attributes, dicts and lists."""
    if isinstance(value, np.ndarray):
        return value.nbytes if value.base is None else 0
    if isinstance(value, dict):
        return sum(owned_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(owned_bytes(v) for v in value)
    if hasattr(value, "__dict__"):
        return owned_bytes(vars(value))
    return 0


def median_us(draw: Callable[[], object], repeats: int, budget_s: float = 2.0) -> float:
    """Median time of `draw` in microseconds, over `repeats` calls or `budget_s`."""
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (not times or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        draw()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def sampler_probe(name: str, items: int, repeats: int) -> dict[str, float]:
    """Run in a fresh process: build and fill an `items`-item buffer with sampler
    `name`, then time draws of 8 x 64 as the table empties."""
    kind, reference = SAMPLERS[name]
    before_mb = rss_mb()
    config = ReplayBufferConfig(type=kind, replay_buffer_size=items, min_size_to_sample=1)
    buffer = ReplayBuffer(JOB_ID, config, NoFiles(), error_buffer=0.0)
    if reference is not None:
        buffer.sampler = reference(items)
    for seq in range(-(-items // 10_000)):
        buffer.insert([ref(seq, min(10_000, items - buffer.size))])
    grown_mb = rss_mb() - before_mb
    table, sampler = buffer.table, buffer.sampler
    rng = np.random.default_rng(0)

    def draw() -> object:
        return sampler.sample(512, table, rng)

    result = {
        "table_mb": owned_bytes(table) / 1e6,
        "sampler_mb": owned_bytes(sampler) / 1e6,
        "rss_mb": grown_mb,
        "request_us": median_us(lambda: buffer.sample(64, 8, timeout_s=0), repeats),
        "full_us": median_us(draw, repeats),
    }
    # Holes as max_use or staleness evictions leave them, through the sampler's
    # protocol (the segments' counts are not kept: only draws are timed from here).
    for key, keep in (("half_us", items // 2), ("sparse_us", 5_000)):
        live = table.live_slots()
        gone = rng.choice(live, size=max(0, len(live) - keep), replace=False)
        sampler.removed(gone)
        table.remove(gone)
        result[key] = median_us(draw, repeats)
    return result


def sampler_table(items_list: list[int], repeats: int) -> Table:
    table = Table(
        title="Samplers: index memory and one draw of 8 x 64 (median), each in a fresh process"
    )
    for column in ("items", "sampler", "table arrays", "sampler arrays", "RSS growth"):
        table.add_column(column, justify="left" if column == "sampler" else "right")
    for column in ("draw: all live", "half live", "5,000 live", "request 8 x 64"):
        table.add_column(column, justify="right")
    for items in items_list:
        for name in SAMPLERS:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--probe",
                    name,
                    "--probe-items",
                    str(items),
                    "--repeats",
                    str(repeats),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            ).stdout
            got = json.loads(out)
            table.add_row(
                f"{items:,}",
                name,
                f"{got['table_mb']:,.0f} MB",
                f"{got['sampler_mb']:,.0f} MB" if got["sampler_mb"] else "none",
                f"{got['rss_mb']:,.0f} MB",
                *(f"{got[k]:,.0f} µs" for k in ("full_us", "half_us", "sparse_us", "request_us")),
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--http-seconds", type=float, default=5.0)
    parser.add_argument("--snapshot-items", type=int, default=0, help="run the snapshot bench")
    parser.add_argument("--snapshot-segment-rows", type=int, default=256)
    parser.add_argument("--snapshot-seconds", type=float, default=10.0)
    parser.add_argument("--snapshot-rate", type=float, default=200.0)
    parser.add_argument(
        "--steady-items",
        type=int,
        nargs="+",
        help="run the steady-training snapshot bench at these sizes (e.g. 1000000 10000000)",
    )
    parser.add_argument("--steady-seconds", type=float, default=20.0)
    parser.add_argument("--steady-insert-rate", type=float, default=20_000.0)
    parser.add_argument("--steady-sample-rate", type=float, default=100.0)
    parser.add_argument("--samplers", action="store_true", help="run only the sampler bench")
    parser.add_argument("--sampler-items", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--probe", choices=SAMPLERS, help=argparse.SUPPRESS)
    parser.add_argument("--probe-items", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(sampler_probe(args.probe, args.probe_items, args.repeats)))
        return
    console = Console(width=140)
    if args.samplers:
        console.print(sampler_table(args.sampler_items, args.repeats))
        return
    if args.steady_items:
        console.print(
            steady_bench(
                args.steady_items,
                args.steady_seconds,
                args.steady_insert_rate,
                args.steady_sample_rate,
                period_s=2.0,
            )
        )
        return
    if args.snapshot_items:
        console.print(
            snapshot_bench(
                args.snapshot_items,
                args.snapshot_segment_rows,
                args.snapshot_seconds,
                args.snapshot_rate,
            )
        )
        return

    timings = in_process(args.capacity, args.repeats)
    rate, count = http_throughput(args.http_seconds)
    memory_mb, size = index_memory_mb(args.capacity)

    table = Table(title=f"Replay buffer: prioritized, {args.capacity:,} items")
    table.add_column("measure")
    table.add_column("median", justify="right")
    table.add_column("p90", justify="right")
    table.add_column("target", justify="right")
    targets = {"insert 1,000 items": "< 1 ms", "sample 256 + update 256": "< 0.5 ms"}
    for name, values in timings.items():
        p90 = float(np.percentile(values, 90))
        table.add_row(name, f"{statistics.median(values):.3f} ms", f"{p90:.3f} ms", targets[name])
    table.add_row(
        "HTTP samples (8 x 64), one client",
        f"{rate:,.0f} req/s",
        f"{count:,} requests",
        ">= 400 req/s",
    )
    table.add_row(f"index memory ({size:,} items)", f"{memory_mb:,.0f} MB", "", "< 200 MB")
    console.print(table)
    console.print(sampler_table(args.sampler_items, args.repeats))


if __name__ == "__main__":
    main()
