"""Atari step data on the learner's side: bytes a transition takes on the shared file
system, and how fast a DQN learner trains when it reads its batches from there.

    python bench/atari_learner.py [--segments 200] [--batch-sizes 32,256] [--updates N]
        [--repeats 5] [--device cpu|cuda] [--torch-threads N] [--quick] [--profile]
        [--keep-page-cache]
        [--config examples/pong_dqn.yaml]

Step data is real Pong: the job (`--config`, else examples/pong_dqn.yaml, through
`fit_to_env` as a collector gets it) steps `env.collector_env_num` envs made by
`make_env` with random actions, and `NStepBuilder` turns the steps into 3-step rows
exactly as the collector's `collect` loop does; every `policy.collect.n_sample` rows
(96) make one segment (`take()`).

1. Bytes on disk a transition. A sample of the segments is written with
   `SharedStore.write_segment` three ways, and each file's size divided by its rows:
   - float32 (before): `obs` and `next_obs` cast to float32, as drover stored every
     observation before it supported images;
   - uint8: the frames as the env gives them, each stack whole;
   - uint8 packed: every distinct frame once (`common.frames.pack_frames`), what
     collectors write now.

2. Learner samples/s. All segments, packed, form a replay on disk
   (`<root>/<job>/segments/w/<seq>.safetensors`). For each batch size, one DQN learner
   (`ALGORITHMS["dqn"].make_learner`, the job's Nature CNN with its dueling head)
   trains three ways, its updates timed one by one:
   - in memory (the reference): `learn_batch` on a few batches of numpy columns
     gathered once before timing, trained on in turn;
   - read path, warm: the learner service's path, `SegmentCache.gather` of a
     `SampledBatch` (rows drawn uniformly over the whole replay, one entry a segment,
     as the buffer groups them), then `learn_batch`; every segment already in the
     cache, as in steady state (a replay of 100k transitions is about 1,000 segments,
     under the cache's 4,096);
   - read path, cold: the same with a fresh `SegmentCache` for every batch, so every
     segment a batch touches is read from its file, checked against the schema and
     its frames rebuilt; before each batch its files are dropped from the page cache
     (`posix_fadvise(DONTNEED)`, untimed), so they come from the disk. This is the
     worst case: a learner reads a segment once, when it first samples it.
   A round is one window of `--updates` updates of each, interleaved update by
   update (in a rotating order), so that load from elsewhere on the machine falls on
   all three alike; after untimed warm-up updates, `--repeats` rounds run, and the
   fastest (all three together) counts, as the one least disturbed. Reported:
   samples/s, the ratio to in memory (target >= 0.85; also its lowest and highest
   over the rounds), and where an update's time goes: `gather` (reading, checking,
   rebuilding frames, concatenating rows) and `learn` (`learn_batch`: tensors,
   forward, backward, optimizer step). Last, an estimate of the steady state, where a
   learner reads each segment once and samples it many times.

Torch runs the machine's default number of threads unless `--torch-threads` says
otherwise (the learner service sets `system.torch_num_threads`). Timings vary with
machine load; compare within one run: the bench says how much of the CPUs' time other
processes used while it ran, and warns above 10%. `--profile` adds where a batch's
gather spends its time (cProfile, warm and cold, at the largest batch size).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.registry import ALGORITHMS  # noqa: E402
from bench.learner_scaling import BUSY_SHARE, CpuMeter, cpu_line, print_load_before  # noqa: E402
from common.config import ConfigError, JobConfig  # noqa: E402
from common.env_guard import setup_env_registry  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.frames import pack_frames, packable  # noqa: E402
from common.messages import SampledBatch, SampledSegment  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from jobconfig import fit_to_env, load_config_file, resolve_job_config  # noqa: E402
from services.collector.step_data import NStepBuilder  # noqa: E402
from services.learner.segments import SegmentCache, SegmentSchema  # noqa: E402

#: The DQN Pong job the bench runs unless `--config` names another.
EXAMPLE = ROOT / "examples" / "pong_dqn.yaml"
#: Read-path samples/s over in-memory samples/s that the learner should reach.
TARGET_RATIO = 0.85
JOB_ID = "bench"
#: Distinct in-memory batches the reference trains on in turn.
REFERENCE_BATCHES = 4
#: Samples a timed window trains on, unless `--updates` says how many updates: about
#: equal time a window at every batch size.
WINDOW_SAMPLES = 2560
#: Storage variants, in the table's order: (name, what it is).
STORAGE = (
    ("float32 (before)", "obs/next_obs cast to float32"),
    ("uint8", "frames as the env gives them, each stack whole"),
    ("uint8 packed", "pack_frames: every distinct frame once (collectors now)"),
)
MODES = ("in memory", "read path, warm", "read path, cold")


# --- step data ------------------------------------------------------------------------


def load_job(path: Path | None) -> JobConfig:
    """The DQN job (`path`, else `EXAMPLE`), fitted to its env as a collector gets it."""
    config, _ = resolve_job_config(load_config_file(path or EXAMPLE))
    if config.policy.type != "dqn":
        raise ConfigError("policy.type", "this bench trains DQN's learner")
    return fit_to_env(config)


def pong_segments(config: JobConfig, count: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """`count` segments of n-step rows of the job's env under random actions, built as
    the collector's `collect` loop builds them."""
    num_envs = config.env.collector_env_num
    policy = config.policy
    env = make_env(config.env, num_envs)
    builder = NStepBuilder(num_envs, policy.nstep, policy.discount_factor)
    rng = np.random.default_rng(seed)
    actions_n = policy.model.action_shape
    assert actions_n is not None  # fit_to_env filled it in
    made = 0
    try:
        obs = env.reset(seed=seed)
        while made < count:
            actions = rng.integers(0, actions_n, num_envs)
            step = env.step(actions)
            builder.add(obs, actions, step.reward, step.final_obs, step.terminated, step.truncated)
            obs = step.obs
            if len(builder) >= policy.collect.n_sample:
                made += 1
                yield builder.take()
    finally:
        env.close()


def as_float32(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Image columns cast to float32, as observations were stored before images."""
    return {k: v.astype(np.float32) if packable(v) else v for k, v in columns.items()}


@dataclass
class Sizes:
    """Bytes and rows of the segment files written one way."""

    bytes: int = 0
    rows: int = 0
    files: int = 0

    def per_row(self) -> float:
        return self.bytes / self.rows


@dataclass(frozen=True)
class Replay:
    """The packed segments on disk: their paths and rows."""

    store: SharedStore
    paths: list[str]
    #: Where segment i's rows start in the replay's global item numbering.
    offsets: np.ndarray

    @property
    def items(self) -> int:
        return int(self.offsets[-1])

    def sample(self, rng: np.random.Generator, batch_size: int) -> SampledBatch:
        """A batch of items drawn uniformly over the replay, one entry a segment and
        keys and weights in the same order (as `ReplayBuffer._group` makes it)."""
        keys = rng.integers(0, self.items, batch_size)
        segment = np.searchsorted(self.offsets, keys, side="right") - 1
        order = np.argsort(segment, kind="stable")
        keys, segment = keys[order], segment[order]
        rows = (keys - self.offsets[segment]).tolist()
        starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]]).tolist()
        ends = [*starts[1:], batch_size]
        return SampledBatch(
            keys=keys.tolist(),
            segments=[
                SampledSegment(path=self.paths[segment[a]], rows=rows[a:b])
                for a, b in zip(starts, ends, strict=True)
            ],
            weights=[1.0] * batch_size,  # uniform replay
        )


def build_replay(
    config: JobConfig, store: SharedStore, count: int, size_every: int, seed: int
) -> tuple[Replay, dict[str, Sizes]]:
    """Write `count` packed segments of Pong into the store; every `size_every`-th one
    is also written float32 and uint8 unpacked (then deleted) to size the three."""
    sizes = {name: Sizes() for name, _ in STORAGE}
    paths, rows = [], []
    for seq, columns in enumerate(pong_segments(config, count, seed)):
        path = store.segment_path(JOB_ID, "w", seq)
        store.write_segment(path, pack_frames(columns))
        paths.append(path)
        rows.append(len(columns["obs"]))
        if seq % size_every:
            continue
        scratch = store.segment_path(f"{JOB_ID}-sizes", "w", seq)
        variants = ((as_float32(columns), scratch), (columns, scratch), (None, path))
        for (name, _), (written, rel) in zip(STORAGE, variants, strict=True):
            if written is not None:
                store.write_segment(rel, written)
            entry = sizes[name]
            entry.bytes += store.resolve(rel).stat().st_size
            entry.rows += rows[-1]
            entry.files += 1
            if written is not None:
                store.delete(rel)
    offsets = np.concatenate([[0], np.cumsum(rows)])
    return Replay(store, paths, offsets), sizes


# --- timing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One timed window: its updates' seconds in all, in gathering and in learning."""

    samples: int
    gather_s: float
    learn_s: float
    #: Segment entries of the window's batches (distinct segments a batch touches).
    segments: int = 0

    @property
    def seconds(self) -> float:
        return self.gather_s + self.learn_s

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def drop_page_cache(store: SharedStore, paths: list[str]) -> bool:
    """Ask the kernel to forget the files' cached pages (they were written with fsync,
    so they are clean), so the next read comes from the disk. False where unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(store.resolve(path), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


class Trainer:
    """One learner and what it trains on, at one batch size, timed update by update."""

    def __init__(
        self,
        config: JobConfig,
        device: torch.device,
        replay: Replay,
        schema: SegmentSchema,
        batch_size: int,
        rng: np.random.Generator,
        drop_pages: bool = True,
    ) -> None:
        self.learner = ALGORITHMS["dqn"].make_learner(config.policy, device)
        self.device = device
        self.replay = replay
        self.schema = schema
        self.batch_size = batch_size
        self.rng = rng
        self.drop_pages = drop_pages
        # The reference's batches: gathered once, the same data as the read path.
        loader = SegmentCache(replay.store, JOB_ID, schema)
        self.reference = []
        for _ in range(REFERENCE_BATCHES):
            columns, weights, _ = loader.gather(replay.sample(rng, batch_size))
            self.reference.append((columns, weights))
        # Warm: every segment cached before timing, as in steady state.
        self.warm = SegmentCache(
            replay.store, JOB_ID, schema, max_segments=max(4096, len(replay.paths))
        )
        for path in replay.paths:
            if self.warm.get(path) is None:
                raise RuntimeError(f"{path} is unusable: {sorted(self.warm.unusable)}")

    def round(self, updates: int) -> dict[str, Window]:
        """One window of `updates` updates of every mode (`MODES`), interleaved update
        by update in a rotating order, so that load from elsewhere falls on all alike."""
        batches = [self.replay.sample(self.rng, self.batch_size) for _ in range(updates)]
        spent = {mode: [0.0, 0.0] for mode in MODES}  # gather s, learn s
        for i, batch in enumerate(batches):
            turn = i % len(MODES)
            for mode in MODES[turn:] + MODES[:turn]:
                if mode == MODES[0]:
                    columns, weights = self.reference[i % len(self.reference)]
                else:
                    cache = self.cache_for(mode, batch)
                    started = time.perf_counter()
                    columns, weights, _ = cache.gather(batch)
                    spent[mode][0] += time.perf_counter() - started
                    if len(weights) != self.batch_size:
                        raise RuntimeError(f"gather kept {len(weights)} of {self.batch_size}")
                spent[mode][1] += self._learn(columns, weights)
        segments = sum(len(batch.segments) for batch in batches)
        return {
            mode: Window(
                updates * self.batch_size,
                gather_s,
                learn_s,
                0 if mode == MODES[0] else segments,
            )
            for mode, (gather_s, learn_s) in spent.items()
        }

    def cache_for(self, mode: str, batch: SampledBatch) -> SegmentCache:
        """Warm: the cache holding every segment. Cold: a fresh one, the batch's files
        first dropped from the page cache (unless told not to)."""
        if mode != "read path, cold":
            return self.warm
        if self.drop_pages:
            drop_page_cache(self.replay.store, [segment.path for segment in batch.segments])
        return SegmentCache(self.replay.store, JOB_ID, self.schema)

    def _learn(self, columns: dict[str, np.ndarray], weights: np.ndarray) -> float:
        synchronize(self.device)
        started = time.perf_counter()
        self.learner.learn_batch(columns, weights)
        synchronize(self.device)
        return time.perf_counter() - started


@dataclass(frozen=True)
class Measured:
    """One (batch size, mode) in the fastest round, and its ratios over all rounds."""

    samples_per_s: float
    gather_ms: float
    learn_ms: float
    #: Distinct segments a batch touched, mean.
    segments: float
    #: Its samples/s over in memory's: in the fastest round, and lowest and highest
    #: over the rounds.
    ratio: float
    ratio_range: tuple[float, float]


def measure(trainer: Trainer, updates: int, warmup: int, repeats: int) -> dict[str, Measured]:
    """`repeats` rounds of interleaved windows, after `warmup` untimed updates of each
    mode; the fastest round (all modes together) counts, as the one least disturbed
    from elsewhere."""
    if warmup:
        trainer.round(warmup)
    rounds = [trainer.round(updates) for _ in range(repeats)]
    best = min(rounds, key=lambda r: sum(w.seconds for w in r.values()))
    result = {}
    for mode in MODES:
        ratios = [r[mode].samples_per_s / r[MODES[0]].samples_per_s for r in rounds]
        w = best[mode]
        result[mode] = Measured(
            samples_per_s=w.samples_per_s,
            gather_ms=1e3 * w.gather_s / updates,
            learn_ms=1e3 * w.learn_s / updates,
            segments=w.segments / updates,
            ratio=w.samples_per_s / best[MODES[0]].samples_per_s,
            ratio_range=(min(ratios), max(ratios)),
        )
    return result


def read_ahead_ratio(trainer: Trainer, updates: int, repeats: int, num_batches: int) -> float:
    """The cold read path as the learner service runs it: batches come `num_batches` to
    a sample request, and while the first trains, a thread reads the segments of the
    others (`SegmentCache.read_ahead`). Each request gets a fresh cache, so every
    segment is read from the file (dropped from the page cache first, untimed). Windows
    of in memory and of this alternate; returns the best ratio over `repeats`."""
    best = 0.0
    for _ in range(repeats):
        batches = [trainer.replay.sample(trainer.rng, trainer.batch_size) for _ in range(updates)]
        if trainer.drop_pages:
            paths = {segment.path for batch in batches for segment in batch.segments}
            drop_page_cache(trainer.replay.store, sorted(paths))
        started = time.perf_counter()
        for i in range(updates):
            trainer._learn(*trainer.reference[i % len(trainer.reference)])
        in_memory_s = time.perf_counter() - started
        started = time.perf_counter()
        for start in range(0, updates, num_batches):
            request = batches[start : start + num_batches]
            cache = SegmentCache(trainer.replay.store, JOB_ID, trainer.schema)
            reader = threading.Thread(target=cache.read_ahead, args=(request[1:],))
            reader.start()
            for batch in request:
                columns, weights, _ = cache.gather(batch)
                trainer._learn(columns, weights)
            reader.join()
        best = max(best, in_memory_s / (time.perf_counter() - started))
    return best


def profile_gather(trainer: Trainer, batches: int, top: int = 12) -> dict[str, str]:
    """cProfile of `batches` gathers, warm and cold: the top functions by own time."""
    out = {}
    for mode in ("read path, warm", "read path, cold"):
        sampled = [trainer.replay.sample(trainer.rng, trainer.batch_size) for _ in range(batches)]
        profiler = cProfile.Profile()
        for batch in sampled:
            cache = trainer.cache_for(mode, batch)
            profiler.enable()
            cache.gather(batch)
            profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
        out[mode] = text.getvalue()
    return out


# --- the report -----------------------------------------------------------------------


def machine_facts(device: torch.device, threads: int) -> list[str]:
    where = f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"
    return [
        cpu_line(),
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{threads} torch thread{'s' if threads > 1 else ''}, device: {where}",
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, help="segments in the replay (default 200)")
    parser.add_argument(
        "--size-segments", type=int, default=25, help="segments sized three ways (spread out)"
    )
    parser.add_argument("--batch-sizes", default="32,256", help="comma-separated")
    parser.add_argument(
        "--updates",
        type=int,
        help=f"updates a mode a round (default: {WINDOW_SAMPLES} samples' worth)",
    )
    parser.add_argument("--warmup", type=int, help="untimed updates a mode first (default 2)")
    parser.add_argument("--repeats", type=int, help="rounds; the fastest counts (default 5)")
    parser.add_argument("--quick", action="store_true", help="a short run: fewer of everything")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--torch-threads", type=int, help="default: torch's, for this machine")
    parser.add_argument(
        "--keep-page-cache", action="store_true", help="cold reads from the page cache"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile of gather, too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, help="a DQN Atari job (default: pong_dqn.yaml)")
    args = parser.parse_args()
    quick = args.quick
    for name, normal, short in (("segments", 200, 48), ("warmup", 2, 1), ("repeats", 5, 2)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else normal)
    args.window_samples = WINDOW_SAMPLES // 4 if quick else WINDOW_SAMPLES
    try:
        args.batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
    except ValueError:
        parser.error("--batch-sizes: comma-separated integers")
    if not args.batch_sizes or args.batch_sizes[0] < 1:
        parser.error("--batch-sizes: one or more sizes of at least 1")
    for name in ("segments", "size_segments", "updates", "repeats", "torch_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: at least 1")
    if args.warmup < 0:
        parser.error("--warmup: at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    return args


def storage_table(config: JobConfig, sizes: dict[str, Sizes]) -> Table:
    table = Table(
        title=f"Bytes on disk a transition: {config.env.env_id}, segments of "
        f"{config.policy.collect.n_sample} rows from {config.env.collector_env_num} envs"
    )
    for column in ("storage", "what", "bytes/transition", "x before"):
        table.add_column(column, justify="left" if column in ("storage", "what") else "right")
    before = sizes[STORAGE[0][0]].per_row()
    for name, what in STORAGE:
        per_row = sizes[name].per_row()
        table.add_row(name, what, f"{per_row:,.0f}", f"{per_row / before:.3f}")
    return table


def learner_table(
    config: JobConfig, device: torch.device, results: dict[int, dict[str, Measured]]
) -> Table:
    shape = "x".join(map(str, config.policy.model.obs_shape or ()))
    table = Table(
        title=f"DQN learner on {config.env.env_id} batches ({shape} uint8), {device.type}: "
        "read path vs in memory"
    )
    columns = ("batch", "path", "samples/s", "x in memory (rounds)", "segments", "gather ms")
    for column in (*columns, "learn ms", "gather share"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for batch_size, measured in results.items():
        for mode in MODES:
            m = measured[mode]
            read = mode != MODES[0]
            low, high = m.ratio_range
            table.add_row(
                str(batch_size) if not read else "",
                mode,
                f"{m.samples_per_s:,.0f}",
                f"{m.ratio:.2f} ({low:.2f}-{high:.2f})" if read else "1.00",
                f"{m.segments:.0f}" if read else "-",
                f"{m.gather_ms:.1f}" if read else "-",
                f"{m.learn_ms:.1f}",
                f"{m.gather_ms / (m.gather_ms + m.learn_ms):.0%}" if read else "-",
            )
        table.add_section()
    return table


def steady_state(
    config: JobConfig, replay: Replay, results: dict[int, dict[str, Measured]]
) -> list[str]:
    """What cold reads cost a learner in steady state, estimated from the measures: a
    segment is read once (the cache holds the replay) and sampled `samples_per_insert`
    times a row, so a batch meets batch / (spi x rows) new segments."""
    spi = config.policy.other.replay_buffer.samples_per_insert
    if not spi:
        return []
    rows = replay.items / len(replay.paths)
    lines = [
        f"Steady state, estimated: with samples_per_insert {spi:g}, a segment of {rows:.0f} "
        f"rows is sampled about {spi * rows:.0f} times and read once, so a batch reads "
        "batch / that many segments from disk:"
    ]
    for batch_size, measured in results.items():
        warm, cold = measured["read path, warm"], measured["read path, cold"]
        per_segment_ms = max(cold.gather_ms - warm.gather_ms, 0.0) / cold.segments
        new = batch_size / (spi * rows)
        gather_ms = warm.gather_ms + new * per_segment_ms
        rate = 1e3 * batch_size / (warm.learn_ms + gather_ms)
        lines.append(
            f"  batch {batch_size}: a cold segment costs {per_segment_ms:.2f} ms more than a "
            f"warm one; {new:.2f} a batch add {new * per_segment_ms:.2f} ms to gather: about "
            f"{rate / measured[MODES[0]].samples_per_s:.2f} x in memory"
        )
    return lines


def main() -> None:
    args = parse_args()
    console = Console(width=120)
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    device = torch.device(args.device)
    setup_env_registry({})
    try:
        config = load_job(args.config)
    except ConfigError as exc:
        sys.exit(f"config: {exc}")
    for fact in machine_facts(device, torch.get_num_threads()):
        console.print(fact)
    print_load_before(console)
    schema = SegmentSchema.for_policy(
        config.policy, ALGORITHMS["dqn"].column_names_for(config.policy)
    )
    results: dict[int, dict[str, Measured]] = {}
    updates_of: dict[int, int] = {}
    read_ahead: dict[int, float] = {}
    profiles: dict[str, str] = {}
    meter = CpuMeter()
    with tempfile.TemporaryDirectory(prefix="atari-learner-") as folder:
        store = SharedStore(folder)
        started = time.perf_counter()
        replay, sizes = build_replay(
            config, store, args.segments, max(1, args.segments // args.size_segments), args.seed
        )
        console.print(
            f"{config.env.env_id}: {len(replay.paths)} segments, {replay.items:,} transitions "
            f"({config.env.collector_env_num} envs, random actions) in "
            f"{time.perf_counter() - started:.0f} s"
        )
        rng = np.random.default_rng(args.seed)
        for batch_size in args.batch_sizes:
            updates = args.updates or max(2, -(-args.window_samples // batch_size))
            updates_of[batch_size] = updates
            started = time.perf_counter()
            trainer = Trainer(
                config, device, replay, schema, batch_size, rng, not args.keep_page_cache
            )
            results[batch_size] = measure(trainer, updates, args.warmup, args.repeats)
            read_ahead[batch_size] = read_ahead_ratio(
                trainer, updates, args.repeats, config.policy.learn.num_batches
            )
            console.print(
                f"batch {batch_size}: {args.repeats} rounds of {updates} updates a mode in "
                f"{time.perf_counter() - started:.0f} s"
            )
            if args.profile and batch_size == args.batch_sizes[-1]:
                profiles = profile_gather(trainer, batches=max(4, updates))
            del trainer
    lost = meter.shares()

    console.print(storage_table(config, sizes))
    console.print(
        f"Over {sizes[STORAGE[0][0]].files} of the {len(replay.paths)} segments, spread evenly, "
        "each written all three ways with SharedStore.write_segment: file size / rows."
    )
    console.print(learner_table(config, device, results))
    windows = ", ".join(f"{updates_of[b]} at batch {b}" for b in args.batch_sizes)
    dropped = not args.keep_page_cache and hasattr(os, "posix_fadvise")
    console.print(
        f"Replay: {len(replay.paths)} packed segments ({replay.items:,} transitions) on disk. "
        f"The fastest of {args.repeats} rounds ({windows} updates a mode a round, the modes "
        f"interleaved, after {args.warmup} untimed). gather: SegmentCache.gather; learn: "
        "learn_batch (ms a batch); segments: distinct segments a batch reads; x in memory: "
        "in the fastest round (lowest-highest over all rounds). Cold: a fresh "
        "SegmentCache every batch"
        + (", its files dropped from the page cache first." if dropped else ".")
    )
    verdicts = []
    for batch_size, measured in results.items():
        for mode in MODES[1:]:
            ratio = measured[mode].ratio
            met = "met" if ratio >= TARGET_RATIO else "NOT met"
            verdicts.append(f"batch {batch_size} {mode.split(', ')[1]}: {ratio:.2f} {met}")
    for batch_size, ratio in read_ahead.items():
        met = "met" if ratio >= TARGET_RATIO else "NOT met"
        verdicts.append(f"batch {batch_size} cold with read-ahead: {ratio:.2f} {met}")
    console.print(f"Target: read path >= {TARGET_RATIO} x in memory: " + "; ".join(verdicts))
    console.print(
        "Cold with read-ahead: the learner service's path (while a sample request's first "
        f"batch trains, a thread reads the segments of its other "
        f"{config.policy.learn.num_batches - 1}), every segment read from its file."
    )
    for line in steady_state(config, replay, results):
        console.print(line)
    if lost is not None:
        console.print(f"While the bench ran, {lost}.")
        if lost.others + lost.steal > BUSY_SHARE:
            console.print("[yellow]the CPUs were not all free: timings are noisier than usual")
    for mode, text in profiles.items():
        console.print(f"\ncProfile of gather, {mode}, batch {args.batch_sizes[-1]}:")
        console.print(text, markup=False, highlight=False)


if __name__ == "__main__":
    main()
