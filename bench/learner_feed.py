"""Learner feed on CartPole-v1: a learner fed through a coordinator and the shared file
system, against the same algorithm training on the same batches held in memory.

    python bench/learner_feed.py [--algos dqn,ppo] [--iters 2000] [--rounds 4]
        [--repeats 3] [--profile-s 0] [--profile-out /tmp/learner-feed.txt] [--gil-probe]
        [--pin-trainer]

For DQN (examples/cartpole_dqn.yaml: batch 64, 8 batches a sample request, PER,
publish every 50 iterations, checkpoint every 1,000) and PPO (examples/cartpole_ppo.yaml:
rounds of 2,048 steps, 10 epochs of minibatches of 64), both unchanged:

- in memory (the reference): the job's learner (`new_learner`, as a learn task builds
  it) trains in this process on data held in memory, with the job's
  `system.torch_num_threads`: DQN `learn_batch` on the batches of a few sample replies
  (gathered from the same segments before timing) in turn; PPO `train_round` on one
  round's columns again and again. No HTTP, no files, no publishing.
- fed: a real coordinator process (`drover.local.LocalCluster` with no collectors or
  learners) holds the job, and this process runs a learn task through the learner
  service's own code (`LearnerRunner.run` in a thread, as a learner's task thread runs
  it): sample requests, segment reads, priority updates, publishing, checkpoints.
  A process the bench starts stands in for the collectors (`Collectors`), so that no
  collector is waited for:
  - DQN: it writes random CartPole transitions, one segment of `collect.n_sample` rows
    after another, and inserts each as fast as the limiter (`samples_per_insert`) lets
    it in, as the example's collectors would; it runs through the timed windows, since
    the limiter's error buffer admits only so many inserts ahead of the samples;
  - PPO: it long-polls for each new policy version and inserts the round of segments
    for it (two, as the example's two collectors write, with that version in their
    header), as collectors would once the version is announced: one round is one
    version.
  The task sends no task id (the bench calls the coordinator with the cluster's
  token, as a tool would, and no learner worker is registered); nothing else differs.
  DQN's task samples in its feeder process (`learn.feed: process`, the default); a
  third window, `dqn, thread feed`, runs the same task with `learn.feed: thread` (a
  prefetch thread of this process, what a learner did before the feeder).

Each repeat times one in-memory window and one fed window of each feed (a fresh learn
task, which resumes from the last one's checkpoint), in rotating order, each after
untimed warm-up iterations (the fed task's first publish and cold segment cache). The
fed window is read off the task's progress (`train_iter`), timed as it is set:
DQN `--iters` iterations, PPO `--rounds` rounds from the end of the first one.
Reported: train iterations/s of each (the fastest repeat's), fed / in memory (the
fastest repeats' ratio, and its lowest and highest over the repeats), and the CPU
seconds the coordinator, the learner (this process), its feeder process and the
collectors' stand-in spent per 1,000 fed train iterations (medians over the fed
windows). Their sum bounds the fed rate on this machine's CPUs however well the
processes overlap: the bench prints that bound beside the target (>= 0.9).

`--profile-s` (0: none) records this process with py-spy (`record --format raw --idle
--threads`, 100 Hz) for that long during an extra fed DQN window, and prints the
training thread's wall time by innermost project frame and the top frames by own
time over all threads.

Each fed row also shows how its training thread spent the window, from the scheduler's
own count (/proc/PID/task/TID/schedstat): on a CPU, runnable but waiting for one
(other processes had both CPUs), or blocked (on the interpreter lock, or waiting for a
batch). In memory it is on a CPU all the time. Beside it, the training thread's CPU
milliseconds per iteration, in memory and fed (medians): fed / in memory is about the
in-memory CPU per iteration over the fed one, times the fed on-CPU share.

`--pin-trainer` adds a DQN window, and a row, fed as the job's is, but with the
training thread on a CPU of its own for the window and every other thread and process
of the bench (the coordinator, the feeder, the collectors' stand-in) on the others: what
the feed costs the training thread when nothing else is scheduled on its CPU. A
comparison, not held to the target.

With DQN, a last table gives the CPU one sample reply costs each process on its way, on
the example's buffer (its size, in segments of `collect.n_sample` rows): the coordinator
drawing it and writing its JSON; the feeder parsing it, gathering its batches from
cached segments, packing them into a frame and sending it; the learner's reading thread
receiving the frame and reading it (which holds the interpreter lock the training thread
waits for). The frame crosses a socket to and from a process of this script that stands
in for the other end, one frame a credit, as between a learner and its feeder. The
fastest part of the feed to time on its own.

`--gil-probe` adds what bounds the fed DQN learner: its in-memory rate alone and with
a thread of the same process running Python for a share of each few milliseconds (as
the learner's sampling thread parses replies and gathers rows), no coordinator and no
files: the training thread gives the interpreter lock up at every torch call and waits
for it back.

Timings vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.buffer import NoFiles  # noqa: E402
from bench.learner_scaling import BUSY_SHARE, CpuMeter, cpu_line, print_load_before  # noqa: E402
from bench.procfs import cpu_s, shares_text, thread_sched_s, threads_of, window_shares  # noqa: E402
from bench.results import write_figures  # noqa: E402
from common.config import JobConfig  # noqa: E402
from common.envs import usable_cpus  # noqa: E402
from common.errors import ApiError  # noqa: E402
from common.messages import (  # noqa: E402
    LearnSpec,
    PolicyRef,
    SampleReply,
    SegmentRef,
    TaskAssignment,
    dump,
    dump_json,
    parse,
)
from common.storage import SharedStore  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from jobconfig import (  # noqa: E402
    algorithm_of,
    fit_to_env,
    load_config_file,
    read_job_config,
    resolve_job_config,
)
from services.buffer.client import BufferData  # noqa: E402
from services.buffer.core import ReplayBuffer  # noqa: E402
from services.coordinator.client import CoordinatorClient  # noqa: E402
from services.learner import sessions  # noqa: E402
from services.learner.core import LearnerRunner  # noqa: E402
from services.learner.feeder import (  # noqa: E402
    BATCH,
    FedFrame,
    FeederStart,
    feeder_start,
    pack_batches,
    recv_frame,
    send_frame,
    unpack_batches,
)
from services.learner.segments import SegmentCache, SegmentSchema  # noqa: E402
from services.learner.training import new_learner  # noqa: E402
from services.slave.core import TaskContext  # noqa: E402
from tests.helpers import child_processes  # noqa: E402

EXAMPLES = {
    "dqn": ROOT / "examples" / "cartpole_dqn.yaml",
    "ppo": ROOT / "examples" / "cartpole_ppo.yaml",
}
#: Fed iterations/s over in-memory iterations/s that the learner should reach.
TARGET_RATIO = 0.9
#: Sample replies whose batches the DQN reference trains on in turn.
REFERENCE_REPLIES = 4
#: Untimed iterations of each mode before a DQN window.
DQN_WARMUP_ITERS = 100
#: The longest the collectors' stand-in's insert or long-poll waits at the coordinator.
FEED_WAIT_S = 2.0
#: The longest a fed window may take before the bench gives up.
WINDOW_TIMEOUT_S = 600.0
#: What feeds a fed window: `learn.feed`'s two, and the job's own with the training
#: thread on a CPU of its own (`--pin-trainer`).
FED_KINDS = ("process", "thread", "pinned")
#: The CPUs this process may use, as it started (`unpin` gives them back).
ALLOWED_CPUS = frozenset(os.sched_getaffinity(0))


def raw_config(algo: str) -> dict[str, Any]:
    return load_config_file(EXAMPLES[algo])


def job_config(algo: str) -> JobConfig:
    config, _ = resolve_job_config(raw_config(algo))
    return fit_to_env(config)


# --- step data ------------------------------------------------------------------------


def dqn_columns(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """Random CartPole 3-step transitions (the columns `NStepBuilder.take` writes)."""
    return {
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "action": rng.integers(0, 2, rows),
        "reward": rng.uniform(0, 3, rows).astype(np.float32),
        "next_obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "done": (rng.random(rows) < 0.05).astype(np.float32),
        "discount": np.full(rows, 0.99**3, np.float32),
    }


def ppo_columns(rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
    """A random CartPole round's steps (the columns the rounds loop writes)."""
    return {
        "obs": rng.normal(size=(rows, 4)).astype(np.float32),
        "action": rng.integers(0, 2, rows),
        "logp": np.full(rows, np.log(0.5), np.float32),
        "adv": rng.normal(size=rows).astype(np.float32),
        "ret": rng.normal(size=rows).astype(np.float32),
    }


COLUMNS = {"dqn": dqn_columns, "ppo": ppo_columns}


class Segments:
    """Segment files of one job, each written just before it is inserted (as a
    collector does: the coordinator sweeps files nobody inserts)."""

    def __init__(self, client: BufferData, store: SharedStore, job_id: str) -> None:
        self.client, self.store, self.job_id = client, store, job_id
        self.rng = np.random.default_rng(os.getpid())
        self.seq = 0

    def write(self, algo: str, rows: int, version: int) -> SegmentRef:
        path = self.store.segment_path(self.job_id, f"bench-{os.getpid()}", self.seq)
        self.seq += 1
        columns = COLUMNS[algo](self.rng, rows)
        ref = SegmentRef(path=path, rows=rows, env_steps=rows, policy_version=version)
        # The header a collector writes: a file the limiter holds back past the
        # coordinator's orphan grace is then indexed by its sweep, not deleted.
        self.store.write_segment(path, columns, header=dump(ref))
        return ref

    def insert(self, refs: list[SegmentRef]) -> None:
        """Insert, waiting while the limiter holds inserts back (the learner is behind)."""
        while True:
            try:
                self.client.insert_segments(self.job_id, refs, timeout_s=FEED_WAIT_S)
                return
            except ApiError as exc:
                if exc.status != 429:
                    raise


def collect(algo: str) -> None:
    """The collectors' stand-in (`--collectors`): collectors' inserts for the job the environment
    names, until it is stopped. DQN: one segment of `collect.n_sample` rows after
    another, as fast as the limiter (`samples_per_insert`) lets them in. PPO: for each
    new policy version, one round of segments of that version (two halves, as the
    example's two collectors write it)."""
    url, token = os.environ["FEED_URL"], os.environ["FEED_TOKEN"]
    client = CoordinatorClient(url, token, timeout_s=10.0)
    job_id = os.environ["FEED_JOB"]
    segments = Segments(
        BufferData(url, token, timeout_s=10.0), SharedStore(os.environ["FEED_DIR"]), job_id
    )
    config = job_config(algo)
    rows = config.policy.collect.n_sample
    if algo == "dqn":
        while True:
            segments.insert([segments.write(algo, rows, 0)])
    # From version 0, as a collector's rounds loop: the version already out when this
    # process first asks needs its round too (the learn task announced it, and waits
    # for that round, while this process was starting).
    fed = 0
    while True:
        ref = client.latest_policy(job_id, newer_than=fed, timeout_s=FEED_WAIT_S)
        if ref is None or ref.version <= fed:
            continue
        fed = ref.version
        segments.insert([segments.write(algo, half, fed) for half in (rows // 2, rows - rows // 2)])


class Collectors:
    """The collectors' stand-in for one job (`collect`), a process of its own as
    collectors are, so its work takes no time from the learner's threads."""

    def __init__(self, cluster: LocalCluster, algo: str, job_id: str) -> None:
        env = {
            **os.environ,
            "FEED_URL": cluster.coordinator_url,
            "FEED_TOKEN": cluster.token,
            "FEED_JOB": job_id,
            "FEED_DIR": str(cluster.shared_dir),
        }
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--collectors", algo], env=env, stdout=subprocess.DEVNULL
        )

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5.0)


# --- the learn task -------------------------------------------------------------------


class AsTool:
    """The coordinator client as a learn task calls it, the task id left out: the bench
    calls with the cluster's token, and no task is assigned to it."""

    def __init__(self, client: CoordinatorClient) -> None:
        self.client = client

    def announce_policy(self, job_id: str, ref: PolicyRef, *, task_id: str | None = None) -> None:
        self.client.announce_policy(job_id, ref)

    def latest_policy(self, job_id: str, **kw: Any) -> PolicyRef | None:
        return self.client.latest_policy(job_id, **kw)


class ToolData(BufferData):
    """The buffer's data calls as a learn task makes them, the task id left out (as
    AsTool's): through the coordinator's routes, with the cluster's token."""

    def sample(self, job_id: str, *, task_id: str | None = None, **kw: Any) -> SampleReply:
        return super().sample(job_id, **kw)

    def update_priorities(
        self, job_id: str, keys: list[int], priorities: list[float], *, task_id: str | None = None
    ) -> int:
        return super().update_priorities(job_id, keys, priorities)


def _feeder_start_as_tool(*args: Any, **kw: Any) -> FeederStart:
    """A feeder's start for the bench's task: its requests name no task, as AsTool's."""
    return dataclasses.replace(feeder_start(*args, **kw), task_id=None)


sessions.feeder_start = _feeder_start_as_tool  # type: ignore[assignment]


class Progress(dict):  # type: ignore[type-arg]
    """A task's progress that notes when `train_iter` first reaches a mark, so the bench
    reads the window's times without polling (a polling thread would take the GIL from
    the learner hundreds of times a second)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()
        self.reached: dict[int, tuple[float, int]] = {}  # mark: (monotonic time, train_iter)
        self.marks: list[int] = []

    def __setitem__(self, key: str, value: float) -> None:
        super().__setitem__(key, value)
        if key == "train_iter" and self.marks and value >= self.marks[0]:
            with self.changed:
                while self.marks and value >= self.marks[0]:
                    self.reached[self.marks.pop(0)] = (time.monotonic(), int(value))
                self.changed.notify_all()


class FedTask:
    """One learn task through the learner service's code, in a thread of this process."""

    def __init__(
        self,
        cluster: LocalCluster,
        job_id: str,
        mode: str,
        number: int,
        feed: str,
        collectors: Collectors,
    ) -> None:
        self.feed = feed
        #: The stand-in feeding the job: a window cannot end once it has exited.
        self.collectors = collectors
        task = TaskAssignment(
            task_id=f"bench-learn-{number}", job_id=job_id, spec=LearnSpec(seed=0, mode=mode)
        )
        self.progress = Progress()
        self.ctx = TaskContext(
            task=task,
            worker_id="bench-learner",
            coordinator=AsTool(cluster.client),  # type: ignore[arg-type]
            data=ToolData(cluster.coordinator_url, cluster.token, timeout_s=10.0),
            metrics=CollectorRegistry(),
            progress=self.progress,
        )
        self.runner = LearnerRunner(SharedStore(cluster.shared_dir))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"task-{task.task_id}", daemon=True)

    def start(self, marks: list[int]) -> None:
        """Start the task, noting when it reaches each of `marks` (train iterations after
        the one it resumes at)."""
        self.progress.marks = sorted(marks)
        self.thread.start()

    def _run(self) -> None:
        try:
            # What `LearnerRunner.run` does, with the job's `learn.feed` set as asked.
            config = read_job_config(self.runner.store, self.ctx.task.job_id)
            learn = dataclasses.replace(config.policy.learn, feed=self.feed)
            policy = dataclasses.replace(config.policy, learn=learn)
            config = dataclasses.replace(config, policy=policy)
            torch.set_num_threads(config.system.torch_num_threads)
            self.runner.learn(self.ctx, config, self.ctx.task.spec)
        except BaseException as exc:  # raised again on the bench's thread
            self.error = exc
        finally:
            with self.progress.changed:
                self.progress.changed.notify_all()

    def wait_mark(self, mark: int) -> tuple[float, int]:
        """(monotonic time, train_iter) when the task first reported `mark` or more."""
        deadline = time.monotonic() + WINDOW_TIMEOUT_S
        with self.progress.changed:
            while mark not in self.progress.reached:
                if self.error is not None or not self.thread.is_alive():
                    raise RuntimeError(
                        f"the learn task ended at {self.progress.get('train_iter')}"
                    ) from self.error
                code = self.collectors.process.poll()
                if code is not None:
                    raise RuntimeError(
                        f"the collectors' stand-in exited (code {code}) at train_iter "
                        f"{self.progress.get('train_iter')}: see its error above"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"train_iter {self.progress.get('train_iter')}")
                self.progress.changed.wait(1.0)
            return self.progress.reached[mark]

    def stop(self) -> None:
        self.ctx.stop.set()
        self.thread.join(WINDOW_TIMEOUT_S)
        if self.error is not None:
            raise RuntimeError("the learn task failed") from self.error


#: `--gil-probe`'s busy thread: (ms running Python, ms asleep), in turn.
GIL_PROBE_DUTIES = ((1, 6), (2, 6), (1, 1))


def gil_probe(console: Console, iters: int) -> None:
    """DQN's in-memory rate alone and beside a thread that holds the interpreter lock
    for a share of the time (`--gil-probe`), as a table."""
    config = job_config("dqn")
    torch.set_num_threads(config.system.torch_num_threads)
    learner = new_learner(config, 0, None)
    columns = dqn_columns(np.random.default_rng(0), config.policy.learn.batch_size)
    weights = np.ones(config.policy.learn.batch_size, np.float32)

    def rate() -> float:
        for _ in range(DQN_WARMUP_ITERS):
            learner.learn_batch(columns, weights)
        started = time.perf_counter()
        for _ in range(iters):
            learner.learn_batch(columns, weights)
        return iters / (time.perf_counter() - started)

    def busy(stop: threading.Event, work_ms: int, sleep_ms: int) -> None:
        while not stop.is_set():
            until = time.perf_counter() + work_ms / 1000
            while time.perf_counter() < until:  # pure Python: holds the lock
                pass
            time.sleep(sleep_ms / 1000)

    table = Table(title="DQN in memory beside a busy Python thread of the same process")
    for column in ("busy thread", "share of a core", "iters/s", "of alone"):
        table.add_column(column, justify="right")
    alone = rate()
    table.add_row("none", "0%", f"{alone:,.0f}", "1.00")
    for work_ms, sleep_ms in GIL_PROBE_DUTIES:
        stop = threading.Event()
        thread = threading.Thread(target=busy, args=(stop, work_ms, sleep_ms), daemon=True)
        thread.start()
        try:
            probed = rate()
        finally:
            stop.set()
            thread.join()
        share = work_ms / (work_ms + sleep_ms)
        what = f"{work_ms} ms of every {work_ms + sleep_ms} ms"
        table.add_row(what, f"{share:.0%}", f"{probed:,.0f}", f"{probed / alone:.2f}")
    console.print(table)


def reply_costs(console: Console) -> None:
    """The CPU one DQN sample reply costs each process it passes through, as a table,
    on the example's buffer (`replay_buffer_size` rows in segments of
    `collect.n_sample`, filled with random transitions in a temporary folder): the
    coordinator drawing it and writing its JSON, the feeder parsing it, gathering its
    batches (segments already cached), packing them into a frame and sending it, and the
    learner's reading thread receiving the frame and reading it (which holds the
    interpreter lock the training thread waits for). The fastest part of the feed to
    time on its own."""
    config = job_config("dqn")
    learn, replay = config.policy.learn, config.policy.other.replay_buffer
    segment_rows = config.policy.collect.n_sample
    rng = np.random.default_rng(0)
    job_id = "job-bench"
    with tempfile.TemporaryDirectory() as tmp:
        store = SharedStore(Path(tmp))
        # Without the example's rate limiter, which would stop the timed draws.
        unlimited = dataclasses.replace(replay, samples_per_insert=None)
        buffer = ReplayBuffer(job_id, unlimited, NoFiles(), error_buffer=0.0)
        for seq in range(-(-replay.replay_buffer_size // segment_rows)):
            path = store.segment_path(job_id, "bench", seq)
            ref = SegmentRef(path=path, rows=segment_rows, env_steps=segment_rows, policy_version=0)
            store.write_segment(path, dqn_columns(rng, segment_rows), header=dump(ref))
            buffer.insert([ref])
        names = algorithm_of(config).column_names_for(config.policy)
        cache = SegmentCache(store, job_id, SegmentSchema.for_policy(config.policy, names))

        def draw() -> SampleReply:
            return buffer.sample_for(
                "task", learn.batch_size, learn.num_batches, timeout_s=0
            ).reply()

        reply = draw()
        data = dump_json(reply)
        batches = [cache.gather(batch) for batch in reply.batches]  # cached from here

        def pack() -> tuple[bytes, list[bytes | memoryview]]:
            rows, placed, parts = pack_batches(batches)
            frame = FedFrame(batch_rows=rows, arrays=placed, last=True, hold_id=None, unusable=[])
            return dump_json(frame), parts

        head, parts = pack()
        body = bytearray(b"".join(parts))  # as the learner receives it
        entries = sum(len(batch.segments) for batch in reply.batches)
        table = Table(
            title=f"One sample reply ({learn.num_batches} batches of {learn.batch_size} "
            f"CartPole rows from {entries} segment entries; {len(data):,} bytes of JSON, a "
            f"{len(head) + len(body):,}-byte frame): CPU per reply"
        )
        for column in ("process", "work", "µs (fastest of 20 x 50)"):
            table.add_column(column, justify="right")
        # The frame crosses a socket to and from a process that stands in for the other
        # end (`--frame-peer`): one frame each way a turn, as a credit lets it go.
        with FramePeer("receive") as receiver, FramePeer("send", head, parts) as sender:

            def send() -> None:
                send_frame(receiver.sock, BATCH, head, parts)
                receiver.sock.recv(1)  # its acknowledgement

            def receive() -> None:
                sender.sock.send(b"x")  # a credit: one frame may come
                recv_frame(sender.sock)

            works = (
                ("coordinator", "draw the batches (`ReplayBuffer.sample_for`)", draw),
                ("coordinator", "write the reply's JSON", lambda: dump_json(reply)),
                ("feeder", "parse the reply", lambda: parse(SampleReply, data)),
                ("feeder", "gather the batches", lambda: [cache.gather(b) for b in reply.batches]),
                ("feeder", "pack the batches, write the frame's head", pack),
                ("feeder", "send the frame (socket)", send),
                ("learner's reading thread", "receive the frame (socket)", receive),
                (
                    "learner's reading thread",
                    "parse the head, view the batches",
                    lambda: unpack_batches(parse(FedFrame, head), body),
                ),
            )
            # The works take turns, so that a change in the machine's speed (twofold
            # within a minute on a shared VM) reaches all of them; the fastest turn of
            # each counts.
            timings_us: list[list[float]] = [[] for _ in works]
            for _ in range(20):
                for timing_us, (_, _, call) in zip(timings_us, works, strict=True):
                    started = time.thread_time()
                    for _ in range(50):
                        call()
                    timing_us.append((time.thread_time() - started) * 1e6 / 50)
        for timing_us, (end, work, _) in zip(timings_us, works, strict=True):
            table.add_row(end, work, f"{min(timing_us):,.0f}")
    console.print(table)


class FramePeer:
    """A process at the other end of a socket (this script with `--frame-peer`): it
    receives frames and acknowledges each (`receive`), or sends the frame it was given
    once per credit (`send`), its body in the same parts, as the feeder sends it."""

    def __init__(
        self, role: str, head: bytes = b"", parts: list[bytes | memoryview] | None = None
    ) -> None:
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--frame-peer", role, "--fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        if role == "send":
            # The frame to send, and where its body's parts lie in what the peer gets.
            sizes = [len(memoryview(part).cast("B")) for part in parts or []]
            layout = json.dumps({"head_bytes": len(head), "part_bytes": sizes}).encode()
            send_frame(self.sock, BATCH, layout, [head, *(parts or [])])

    def __enter__(self) -> FramePeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()  # the peer's end of file: it exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def frame_peer(role: str, fd: int) -> None:
    """`FramePeer`'s process."""
    sock = socket.socket(fileno=fd)
    if role == "receive":
        while recv_frame(sock) is not None:
            sock.send(b"k")
        return
    given = recv_frame(sock)
    assert given is not None
    _, layout_json, data = given
    layout = json.loads(layout_json)
    view, offset = memoryview(data), layout["head_bytes"]
    head, parts = bytes(view[:offset]), []
    for size in layout["part_bytes"]:
        parts.append(view[offset : offset + size])
        offset += size
    while sock.recv(1):
        send_frame(sock, BATCH, head, parts)


# --- one algorithm ----------------------------------------------------------------------


class Bench:
    """One algorithm's job on the coordinator, and its in-memory reference."""

    mode = "batches"

    def __init__(self, algo: str, cluster: LocalCluster) -> None:
        self.algo = algo
        self.cluster = cluster
        self.config = job_config(algo)
        store = SharedStore(cluster.shared_dir)
        job_id = cluster.client.submit_job(raw_config(algo), name=f"bench-{algo}").job_id
        self.job_id = job_id
        names = algorithm_of(self.config).column_names_for(self.config.policy)
        self.cache = SegmentCache(
            store, job_id, SegmentSchema.for_policy(self.config.policy, names)
        )
        self.tasks = 0
        #: The train iteration the next learn task resumes at.
        self.resumed = 0
        #: The collectors' stand-in (each algorithm's bench starts one).
        self.collectors: Collectors
        #: CPU seconds a fed window took per 1,000 train iterations, each window's, by
        #: `learn.feed`: (the coordinator's, the learner's: this process, the bench
        #: idle in it, its feeder process's, if it has one, and the collectors').
        self.cpu_per_kilo_iter: dict[str, list[tuple[float, float, float, float]]] = {
            kind: [] for kind in FED_KINDS
        }
        #: The training thread's CPU milliseconds per train iteration, in memory (each
        #: window's) and fed (each fed window's, by kind).
        self.in_memory_cpu_ms: list[float] = []
        self.trainer_cpu_ms: dict[str, list[float]] = {kind: [] for kind in FED_KINDS}
        #: The training thread's shares of each fed window, by kind: on a CPU, and
        #: runnable but waiting for one (the rest it was blocked: on the interpreter
        #: lock, or waiting for a batch).
        self.trainer_shares: dict[str, list[tuple[float, float]]] = {kind: [] for kind in FED_KINDS}

    def in_memory(self) -> float:
        """Train iterations/s of a fresh learner of the job on data in memory."""
        torch.set_num_threads(self.config.system.torch_num_threads)
        learner = new_learner(self.config, 0, None)
        self.train(learner, self.warmup_iters())
        started, first, cpu_started = time.perf_counter(), learner.train_iter, time.thread_time()
        self.train(learner, self.window_iters())
        iters = learner.train_iter - first
        self.in_memory_cpu_ms.append((time.thread_time() - cpu_started) * 1e3 / iters)
        return iters / (time.perf_counter() - started)

    def fed(
        self, profile: Callable[[], None] | None = None, feed: str = "process", pin: bool = False
    ) -> float:
        """Train iterations/s of a learn task fed through the coordinator, its batches
        asked for and gathered as `feed` says (`learn.feed`: the job's default
        `process`, or `thread`). With `pin`, for the window, the training thread runs on
        a CPU of its own and every other process and thread of the bench on the others
        (its numbers are kept as the `pinned` feed's)."""
        self.tasks += 1
        task = FedTask(self.cluster, self.job_id, self.mode, self.tasks, feed, self.collectors)
        kind = "pinned" if pin else feed
        # The task resumes where the last one stopped (its final checkpoint).
        warm = self.resumed + self.warmup_iters()
        task.start([warm, warm + self.window_iters()])
        coordinator = self.cluster.coordinator.process
        assert coordinator is not None
        try:
            started, began = task.wait_mark(warm)
            coordinator_s, learner_s = cpu_s(coordinator.pid), time.process_time()
            # the fed task's feeder process (`learn.feed: process`), a child of this one
            feeders = child_processes(os.getpid(), "services.learner.feeder")
            feeder_s = sum(cpu_s(pid) for pid in feeders)
            collectors_s = cpu_s(self.collectors.process.pid)
            trainer = task.thread.native_id
            assert trainer is not None
            others = [coordinator.pid, self.collectors.process.pid, *feeders]
            if pin:
                pin_apart(trainer, others)
            sched = thread_sched_s(os.getpid(), trainer)
            if profile is not None:
                profile()
            ended, done = task.wait_mark(warm + self.window_iters())
            sched_end = thread_sched_s(os.getpid(), trainer)
            if pin:
                unpin([os.getpid(), *others])
            self.trainer_shares[kind].append(window_shares(sched, sched_end, ended - started))
            self.trainer_cpu_ms[kind].append((sched_end[0] - sched[0]) * 1e3 / (done - began))
            kilo_iters = (done - began) / 1000
            self.cpu_per_kilo_iter[kind].append(
                (
                    (cpu_s(coordinator.pid) - coordinator_s) / kilo_iters,
                    (time.process_time() - learner_s) / kilo_iters,
                    (sum(cpu_s(pid) for pid in feeders) - feeder_s) / kilo_iters,
                    (cpu_s(self.collectors.process.pid) - collectors_s) / kilo_iters,
                )
            )
            return (done - began) / (ended - started)
        finally:
            task.stop()
            self.resumed = int(task.progress.get("train_iter", self.resumed))

    def train(self, learner: Any, iters: int) -> None: ...
    def warmup_iters(self) -> int: ...
    def window_iters(self) -> int: ...
    def close(self) -> None: ...


class DQNBench(Bench):
    def __init__(self, cluster: LocalCluster, iters: int) -> None:
        super().__init__("dqn", cluster)
        self.iters = iters
        self.collectors = Collectors(cluster, "dqn", self.job_id)
        # The reference trains on batches the buffer sampled, as the fed learner does.
        learn = self.config.policy.learn
        self.batches = []
        for _ in range(REFERENCE_REPLIES):
            reply = cluster.client.sample(
                self.job_id,
                batch_size=learn.batch_size,
                num_batches=learn.num_batches,
                timeout_s=60.0,
            )
            for batch in reply.batches:
                columns, weights, _ = self.cache.gather(batch)
                self.batches.append((columns, weights))

    def train(self, learner: Any, iters: int) -> None:
        for i in range(iters):
            learner.learn_batch(*self.batches[i % len(self.batches)])

    def warmup_iters(self) -> int:
        return DQN_WARMUP_ITERS

    def window_iters(self) -> int:
        return self.iters

    def close(self) -> None:
        self.collectors.close()


class PPOBench(Bench):
    mode = "rounds"

    def __init__(self, cluster: LocalCluster, rounds: int) -> None:
        super().__init__("ppo", cluster)
        self.rounds = rounds
        policy = self.config.policy
        self.columns = ppo_columns(np.random.default_rng(1), policy.collect.n_sample)
        minibatches = -(-policy.collect.n_sample // policy.learn.batch_size)
        self.per_round = policy.learn.epoch_per_collect * minibatches
        self.collectors = Collectors(cluster, "ppo", self.job_id)

    def train(self, learner: Any, iters: int) -> None:
        done = learner.train_iter + iters
        while learner.train_iter < done:
            learner.train_round(self.columns)

    def warmup_iters(self) -> int:
        return self.per_round  # the first round (its progress comes at its end)

    def window_iters(self) -> int:
        return self.rounds * self.per_round

    def close(self) -> None:
        self.collectors.close()


# --- profile ----------------------------------------------------------------------------


def record_profile(seconds: float, out: Path) -> Callable[[], None]:
    """A call that starts py-spy on this process for `seconds` (it runs on alone)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))

    def start() -> None:
        command = [spy, "record", "--format", "raw", "-r", "100", "-d", str(int(seconds))]
        command += ["--threads", "--idle", "--nonblocking", "--pid", str(os.getpid())]
        command += ["-o", str(out)]
        subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return start


#: Innermost frames that are waits, not work.
WAITS = ("wait", "_wait_for_tstate_lock", "select", "poll", "sleep", "acquire", "get", "accept")


def summarize(raw: str, console: Console, top: int = 15) -> None:
    """The learn task's thread by innermost project frame, and the top frames by own
    time (waits left out) over every thread, from a py-spy raw profile."""
    training: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        stack = stack_text.split(";")
        thread = stack[0] if stack[0].startswith("thread") else "?"
        frames = [f for f in stack if not f.startswith(("thread", "process"))]
        if not frames:
            continue
        if "task-bench-learn" in thread:
            project = [f for f in frames if "/work/main/" in f and ".venv" not in f]
            training[short(project[-1] if project else frames[-1])] += count
        function = frames[-1].split(" (")[0]
        if not function.endswith(WAITS):
            own[short(frames[-1])] += count
    for title, counter in (
        ("the learn task's thread, wall time", training),
        ("own time, all threads, waits left out", own),
    ):
        total = sum(counter.values())
        if not total:
            continue
        table = Table(title=f"py-spy, fed DQN learner: {title} ({total:,} samples)")
        table.add_column("frame")
        table.add_column("share", justify="right")
        for frame, count in counter.most_common(top):
            table.add_row(frame, f"{count / total:.1%}")
        console.print(table)


def short(frame: str) -> str:
    return frame.replace(str(ROOT) + "/", "").split("site-packages/")[-1]


# --- the report -------------------------------------------------------------------------


@dataclass
class Row:
    algo: str
    what: str
    in_memory: list[float]
    fed: list[float]
    #: Medians over the fed windows of CPU seconds per 1,000 train iterations.
    coordinator_cpu_s: float
    learner_cpu_s: float
    feeder_cpu_s: float
    collectors_cpu_s: float
    #: Medians over the fed windows of the training thread's shares of the window: on a
    #: CPU, and runnable but waiting for one.
    trainer_on_cpu: float
    trainer_waiting: float
    #: Medians of the training thread's CPU ms per train iteration: in memory, fed.
    in_memory_cpu_ms: float
    trainer_cpu_ms: float
    #: Held to the target (the job's own feed), not a comparison row.
    judged: bool = True

    @property
    def cpu_bound_per_s(self) -> float:
        """The fed iterations/s this machine's usable CPUs allow at the CPU seconds an
        iteration costs in the four processes together, however well they overlap."""
        kilo_s = self.coordinator_cpu_s + self.learner_cpu_s + self.feeder_cpu_s
        per_iter_s = (kilo_s + self.collectors_cpu_s) / 1000
        return usable_cpus() / per_iter_s


def pin_apart(trainer: int, others: list[int]) -> None:
    """The training thread (`trainer`, a thread id of this process) onto the first CPU
    this process may use; this process's other threads and the processes `others`
    (every thread of each) onto the rest."""
    cpus = sorted(ALLOWED_CPUS)
    own, rest = {cpus[0]}, set(cpus[1:])
    for tid in threads_of(os.getpid()):
        os.sched_setaffinity(tid, own if tid == trainer else rest)
    for pid in others:
        for tid in threads_of(pid):
            os.sched_setaffinity(tid, rest)


def unpin(pids: list[int]) -> None:
    """Every thread of `pids` back onto every CPU this process could use at its start."""
    for pid in pids:
        for tid in threads_of(pid):
            os.sched_setaffinity(tid, ALLOWED_CPUS)


def measure(bench: Bench, repeats: int, pin: bool) -> dict[str, list[float]]:
    """Iterations/s of each window: in memory, fed (the job's feeder process) and, for
    batch training, fed by a thread of the learner's process, and with `pin` fed with
    the training thread on a CPU of its own; in rotating order."""
    windows: dict[str, Callable[[], float]] = {
        "in memory": bench.in_memory,
        "process": bench.fed,
    }
    if bench.mode == "batches":
        windows["thread"] = lambda: bench.fed(feed="thread")
        if pin:
            windows["pinned"] = lambda: bench.fed(pin=True)
    rates: dict[str, list[float]] = {name: [] for name in windows}
    names = list(windows)
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(windows[name]())
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", default="dqn,ppo")
    parser.add_argument("--iters", type=int, default=2000, help="DQN iterations a window")
    parser.add_argument("--rounds", type=int, default=4, help="PPO rounds a window")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-s", type=float, default=0.0, help="py-spy the fed DQN task")
    parser.add_argument("--profile-out", type=Path, default=None)
    parser.add_argument(
        "--gil-probe", action="store_true", help="DQN in memory beside a busy Python thread"
    )
    parser.add_argument(
        "--pin-trainer",
        action="store_true",
        help="a DQN fed window more, the training thread on a CPU of its own",
    )
    parser.add_argument("--collectors", choices=sorted(COLUMNS), help=argparse.SUPPRESS)
    parser.add_argument("--frame-peer", choices=("send", "receive"), help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="also write each row's ratio here")
    args = parser.parse_args()
    if args.collectors:
        collect(args.collectors)
        return
    if args.frame_peer:
        frame_peer(args.frame_peer, args.fd)
        return
    if args.pin_trainer and len(ALLOWED_CPUS) < 2:
        parser.error("--pin-trainer needs two CPUs or more")
    # Killed (`timeout`), the bench ends as on an error: its cluster stops. The
    # coordinator runs in a session of its own, and would outlive it otherwise.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    console = Console(width=140)
    algos = [a for a in args.algos.split(",") if a]
    rows: list[Row] = []
    raw = None
    print_load_before(console)
    meter = CpuMeter()
    with tempfile.TemporaryDirectory(prefix="learner-feed-") as tmp:
        cluster = LocalCluster(Path(tmp), num_collectors=0, num_learners=0)
        with cluster:
            for algo in algos:
                started = time.monotonic()
                if algo == "dqn":
                    bench: Bench = DQNBench(cluster, args.iters)
                    what = f"{args.iters} iterations a window"
                else:
                    bench = PPOBench(cluster, args.rounds)
                    what = f"{args.rounds} rounds ({bench.window_iters()} iterations) a window"
                measured = measure(bench, args.repeats, args.pin_trainer)
                in_memory = measured["in memory"]
                for label, feed_kind in (
                    (algo, "process"),
                    (f"{algo}, thread feed", "thread"),
                    (f"{algo}, training thread on a CPU of its own", "pinned"),
                ):
                    rates = measured.get(feed_kind, [])
                    if not rates:
                        continue
                    cpu = bench.cpu_per_kilo_iter[feed_kind]
                    coordinator_cpu, learner_cpu, feeder_cpu, collectors_cpu = zip(
                        *cpu, strict=True
                    )
                    on_cpu, waiting = zip(*bench.trainer_shares[feed_kind], strict=True)
                    rows.append(
                        Row(
                            label,
                            what,
                            in_memory,
                            rates,
                            statistics.median(coordinator_cpu),
                            statistics.median(learner_cpu),
                            statistics.median(feeder_cpu),
                            statistics.median(collectors_cpu),
                            statistics.median(on_cpu),
                            statistics.median(waiting),
                            statistics.median(bench.in_memory_cpu_ms),
                            statistics.median(bench.trainer_cpu_ms[feed_kind]),
                            # the job's own feed is held to the target; the thread is
                            # the comparison
                            judged=feed_kind == "process",
                        )
                    )
                if algo == "dqn" and args.profile_s > 0:
                    out = args.profile_out or Path(tmp) / "learner-feed.txt"
                    bench.fed(profile=record_profile(args.profile_s, out))
                    deadline = time.monotonic() + args.profile_s + 30
                    while time.monotonic() < deadline and not out.exists():
                        time.sleep(0.5)
                    time.sleep(1.0)
                    raw = out.read_text() if out.exists() else None
                bench.close()
                console.print(
                    f"{algo}: {args.repeats} repeats in {time.monotonic() - started:.0f} s"
                )

    table = Table(
        title=f"Learner feed, CartPole-v1: fed through a coordinator vs in memory; {cpu_line()}; "
        f"torch {torch.__version__}"
    )
    for column in (
        "algo",
        "in memory iters/s",
        "fed iters/s",
        "fed / in memory (repeats)",
        "CPU s / 1k fed iters: coordinator, learner, feeder, collectors",
        "CPU bound / in memory",
        "training thread: on a CPU, waiting for one, blocked",
        "training thread CPU ms / iter: in memory, fed",
    ):
        table.add_column(column, justify="right")
    table.add_column("window")
    verdicts = []
    for row in rows:
        ratios = [f / m for f, m in zip(row.fed, row.in_memory, strict=True)]
        ratio = max(row.fed) / max(row.in_memory)
        table.add_row(
            row.algo,
            f"{max(row.in_memory):,.0f}",
            f"{max(row.fed):,.0f}",
            f"{ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
            f"{row.coordinator_cpu_s:.2f}, {row.learner_cpu_s:.2f}, {row.feeder_cpu_s:.2f}, "
            f"{row.collectors_cpu_s:.2f}",
            f"{row.cpu_bound_per_s / max(row.in_memory):.2f}",
            shares_text(row.trainer_on_cpu, row.trainer_waiting),
            f"{row.in_memory_cpu_ms:.2f}, {row.trainer_cpu_ms:.2f}",
            row.what,
        )
        if row.judged:
            verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
            verdicts.append(f"{row.algo} {ratio:.2f} {verdict}")
    lost = meter.shares()  # the coordinator and the feeders have ended: counted as ours
    console.print(table)
    write_figures(
        args.json,
        "learner_feed",
        {
            row.algo: {
                "in_memory_iters_per_s": max(row.in_memory),
                "fed_iters_per_s": max(row.fed),
                "ratio": max(row.fed) / max(row.in_memory),
            }
            for row in rows
        },
    )
    console.print(
        f"The fastest of {args.repeats} repeats of each; a repeat is one window of each, "
        f"in alternating order. Target: fed >= {TARGET_RATIO} x in memory: " + "; ".join(verdicts)
    )
    console.print(
        f"CPU bound: the fed iterations/s that {usable_cpus()} CPUs allow at "
        "the CPU seconds an iteration costs in the four processes together, however well "
        "they overlap: a ratio the fed row cannot pass on this machine."
    )
    console.print(
        "Training thread: its shares of a fed window (medians), from the scheduler's "
        "count (/proc/PID/task/TID/schedstat): on a CPU; runnable but waiting for a CPU "
        "(other processes' work had both); blocked (on the interpreter lock, or waiting "
        "for a batch). In memory it is on a CPU all the time. Its CPU per iteration (the "
        "same count; in memory: the thread's own clock) is what an iteration costs it "
        "apart from waiting."
    )
    if lost is not None:
        console.print(f"While the bench ran, {lost}.")
        if lost.others + lost.steal > BUSY_SHARE:
            console.print("[yellow]the CPUs were not all free: timings are noisier than usual")
    if "dqn" in algos:
        reply_costs(console)
    if raw:
        summarize(raw, console)
    if args.gil_probe:
        gil_probe(console, args.iters)


if __name__ == "__main__":
    main()
