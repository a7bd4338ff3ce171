"""Replay-buffer benchmark: in-process timings, HTTP throughput, index memory.

    python bench/buffer.py [--capacity 1000000]

1. In-process, a prioritized buffer filled to `capacity`: insert 1,000 items (one
   segment, evicting 1,000), and sample a batch of 256 with importance weights plus a
   priority update of 256 keys. Median and p90 over many repetitions.
2. Through a real coordinator process (waitress, HTTP on 127.0.0.1): sample requests
   of num_batches=8, batch_size=64 from one client, sequentially, for a few seconds.
3. Memory: resident-set growth of a fresh process that builds and fills a
   `capacity`-item prioritized index.

Prints a table. Timings vary with machine load: compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.config import ReplayBufferConfig  # noqa: E402
from common.messages import SegmentRef  # noqa: E402
from services.buffer.core import ReplayBuffer  # noqa: E402


class NoFiles:
    def delete(self, rel: str) -> bool:
        return True


def ref(seq: int, rows: int, job: str = "job-bench") -> SegmentRef:
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
    buffer = ReplayBuffer("job-bench", config, NoFiles(), error_buffer=0.0)
    seq = 0
    while buffer.size < capacity:
        buffer.insert([ref(seq, min(10_000, capacity - buffer.size))])
        seq += 1
    return buffer, seq


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
            cluster.client.insert_segments(job_id, refs)
            count, deadline = 0, time.monotonic() + seconds
            started = time.monotonic()
            while time.monotonic() < deadline:
                cluster.client.sample(job_id, batch_size=64, num_batches=8, timeout_s=1.0)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--http-seconds", type=float, default=5.0)
    args = parser.parse_args()
    console = Console(width=120)

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


if __name__ == "__main__":
    main()
