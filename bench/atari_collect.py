"""Atari collection throughput: one collector end to end, per env manager, against the
same machine's pure-simulation ceiling.

    python bench/atari_collect.py [--managers sync,async,envpool] [--num-envs 8]
        [--seconds 20] [--window 5] [--torch-threads N] [--config pong_dqn.yaml]

Frames are Atari frames: agent steps x `env.frame_skip` (4), the unit Atari results
are reported in.

- ceiling: envpool alone with random actions, no policy and no step data, on every
  CPU (`num_threads` = CPUs) in its asynchronous mode (twice as many envs as each
  `recv` returns, so threads never wait for Python), with the job's preprocessing
  (`envpool_task`): as fast as this machine can simulate Pong.
- one collector per manager (`sync`, `async`, `envpool`): what the collector's
  `transitions` loop (services/collector/core.py, `collect`) does each step, in one
  process: the DQN actor's Nature CNN picks every env's action (`actor.act`, its
  weights loaded so that it runs the network, not random actions), the manager made
  by `make_env` steps the envs, `NStepBuilder` turns the steps into n-step rows, and
  every `n_sample` rows a writer thread (the collector's uploader, less the insert)
  packs their frames (`pack_frames`) and writes the segment with
  `SharedStore.write_segment` into a temporary folder. Written segments are deleted
  (a long run must not fill the disk), so nothing is read back.

The job is a DQN Pong config (`--config`, else examples/pong_dqn.yaml) through
`fit_to_env`, as a collector gets it. Torch runs `--torch-threads` threads (default: the config's
`system.torch_num_threads`, 1, as a collector sets it).

Reported per row, from the fastest of the timed windows (so a burst of other load on
the machine costs a window, not the result): frames/s, its ratio to the ceiling, and
where a collector's time goes: the actor (`act`), the envs (`env`) and step data
(`data`: n-step rows, and waiting for the writer when it falls behind).

Timings vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import platform
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import envpool
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.registry import ALGORITHMS  # noqa: E402
from bench.learner_scaling import cpu_line, print_load_before  # noqa: E402
from common.config import ConfigError, JobConfig  # noqa: E402
from common.env_guard import setup_env_registry  # noqa: E402
from common.envpool_vector import envpool_task  # noqa: E402
from common.envs import usable_cpus  # noqa: E402
from common.frames import pack_frames  # noqa: E402
from common.messages import SegmentRef, dump  # noqa: E402
from common.models import state_to_numpy  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from jobconfig import fit_to_env, load_config_file, resolve_job_config  # noqa: E402
from services.collector.step_data import EpisodeTracker, NStepBuilder  # noqa: E402
from services.collector.stepping import OVERLAPPING_MANAGERS, make_stepper  # noqa: E402

MANAGERS = ("sync", "async", "envpool")

#: The DQN Pong job the bench runs unless `--config` names another.
EXAMPLE = ROOT / "examples" / "pong_dqn.yaml"
#: What the bench runs when the example is missing: the example's collecting side
#: (DI-engine's `pong_dqn_config`): 8 envs a collector, 3-step targets, 96 rows a
#: segment, a Nature CNN with its 512-unit layer.
PONG_DQN: dict[str, Any] = {
    "env": {"env_id": "PongNoFrameskip-v4", "collector_env_num": 8},
    "policy": {
        "type": "dqn",
        "nstep": 3,
        "discount_factor": 0.99,
        "model": {"encoder_hidden_size_list": [512]},
        "collect": {"n_sample": 96},
    },
}

#: The longest the stepping loop waits for room in the writer's queue.
WRITER_WAIT_S = 60.0
#: Vector steps before the first timed window: torch's first calls, worker start-up.
WARMUP_STEPS = 30


@dataclass(frozen=True)
class Measured:
    """One row: the fastest window's frames/s, and where the time went in it."""

    label: str
    num_envs: int
    parallelism: str
    frames_per_s: float
    #: Shares of the window's time in the actor, the envs and step data (None: the
    #: ceiling, which has no actor or step data).
    shares: tuple[float, float, float] | None = None


class Windows:
    """Counts frames in consecutive windows of `window_s` and keeps the fastest."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.best_frames_per_s = 0.0
        self.best_phases_s: dict[str, float] = {}
        self._start = time.perf_counter()
        self._frames = 0
        self._phases_s: dict[str, float] = {}

    def add(self, frames: int, phases_s: dict[str, float] | None = None) -> None:
        self._frames += frames
        for name, seconds in (phases_s or {}).items():
            self._phases_s[name] = self._phases_s.get(name, 0.0) + seconds
        elapsed = time.perf_counter() - self._start
        if elapsed >= self.window_s:
            rate = self._frames / elapsed
            if rate > self.best_frames_per_s:
                self.best_frames_per_s = rate
                self.best_phases_s = {k: v / elapsed for k, v in self._phases_s.items()}
            self._start, self._frames, self._phases_s = time.perf_counter(), 0, {}


def run_timed(seconds: float, window_s: float, step: Callable[[Windows], None]) -> Windows:
    """Calls `step` until `seconds` have passed; it reports its frames to the windows."""
    windows = Windows(window_s)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        step(windows)
    return windows


def ceiling(config: JobConfig, seconds: float, window_s: float, num_envs: int) -> Measured:
    """envpool stepping Pong with random actions on every CPU, nothing else."""
    task = envpool_task(config.env, training=True)
    threads = usable_cpus()
    batch = max(1, num_envs // 2)
    pool = envpool.make(
        task.task_id,
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=batch,
        num_threads=threads,
        seed=0,
        **task.options,
    )
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 6, size=(1024, batch)).astype(np.int32)
    frame_skip = config.env.frame_skip
    count = 0
    try:
        pool.async_reset()
        for _ in range(WARMUP_STEPS):
            *_, info = pool.recv()
            pool.send(actions[0], info["env_id"])

        def step(windows: Windows) -> None:
            nonlocal count
            *_, info = pool.recv()
            pool.send(actions[count % len(actions)], info["env_id"])
            count += 1
            windows.add(batch * frame_skip)

        windows = run_timed(seconds, window_s, step)
    finally:
        pool.close()
    return Measured(
        "ceiling: envpool, random actions",
        num_envs,
        f"{threads} threads, batch {batch}",
        windows.best_frames_per_s,
    )


class SegmentWriter:
    """Packs and writes segments in its own thread, as the collector's uploader does
    (without inserting them anywhere), then deletes each file."""

    def __init__(self, store: SharedStore, max_pending: int = 2) -> None:
        self.store = store
        self.error: str | None = None
        self._queue: queue.Queue[tuple[dict[str, np.ndarray], SegmentRef] | None] = queue.Queue(
            maxsize=max_pending
        )
        self._thread = threading.Thread(target=self._loop, name="segment-writer", daemon=True)
        self._thread.start()

    def put(self, columns: dict[str, np.ndarray], ref: SegmentRef) -> None:
        """Queue a segment; waits while the writer is behind (as the collector does).

        Raises:
            RuntimeError: the writer failed, or had no room for `WRITER_WAIT_S`.
        """
        if self.error is not None:
            raise RuntimeError(self.error)
        try:
            self._queue.put((columns, ref), timeout=WRITER_WAIT_S)
        except queue.Full:
            raise RuntimeError(f"the segment writer was {WRITER_WAIT_S:.0f} s behind") from None

    def close(self, timeout_s: float = 30.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout_s)
        if self.error is not None:
            raise RuntimeError(self.error)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            columns, ref = item
            if self.error is not None:
                continue
            try:
                self.store.write_segment(ref.path, pack_frames(columns), header=dump(ref))
                self.store.resolve(ref.path).unlink()
            except Exception as exc:  # a full disk: the run stops with it
                self.error = f"writing {ref.path} failed: {type(exc).__name__}: {exc}"


def ready_actor(config: JobConfig) -> Any:
    """The job's actor with weights loaded (its own initial ones): an actor with no
    version acts at random and never runs its network."""
    actor = ALGORITHMS[config.policy.type].make_actor(config.policy)
    actor.load(1, state_to_numpy(actor.network))
    return actor


def one_collector(
    config: JobConfig,
    manager: str,
    double_buffer: bool,
    seconds: float,
    window_s: float,
    store: SharedStore,
) -> Measured:
    """The collector's `transitions` loop with the envs of `manager`, stepped in turn or
    double-buffered (services/collector/stepping.py), timed."""
    num_envs = config.env.collector_env_num
    env_config = dataclasses.replace(config.env, manager=manager, double_buffer=double_buffer)
    stepper = make_stepper(env_config, num_envs)
    actor = ready_actor(config)
    policy = config.policy
    builder = NStepBuilder(num_envs, policy.nstep, policy.discount_factor)
    episodes = EpisodeTracker(num_envs)
    writer = SegmentWriter(store)
    rng = np.random.default_rng(0)
    # Far into the job: epsilon is at its end, so the network picks most actions.
    job_env_steps = 10**9
    frame_skip = config.env.frame_skip
    seq = segment_steps = 0
    envs = getattr(stepper, "halves", None) or (getattr(stepper, "env", None),)
    pids = sum(len(getattr(env, "pids", ())) for env in envs)
    threads = sum(getattr(env, "num_threads", 0) for env in envs)
    parallelism = f"{pids} workers" if pids else f"{threads} threads" if threads else "1 process"
    if double_buffer:
        parallelism += ", 2 halves"
    acting_s = [0.0]

    def act(obs: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        started = time.perf_counter()
        actions = actor.act(obs, rng, job_env_steps)
        acting_s[0] += time.perf_counter() - started
        return actor.env_action(actions), (actions,)

    try:
        stepper.reset(seed=0)

        def step(windows: Windows | None) -> None:
            nonlocal seq, segment_steps
            acting_s[0] = 0.0
            started = time.perf_counter()
            obs, (actions,), result = stepper.step_with(act)
            stepped = time.perf_counter()
            builder.add(
                obs, actions, result.reward, result.final_obs, result.terminated, result.truncated
            )
            episodes.step(result.reward, result.ended)
            segment_steps += num_envs
            if len(builder) >= policy.collect.n_sample:
                columns = builder.take()
                returns, lengths = episodes.take()
                ref = SegmentRef(
                    path=store.segment_path("bench", f"{manager}.collector", seq),
                    rows=len(columns["obs"]),
                    env_steps=segment_steps,
                    policy_version=actor.version,
                    episode_returns=returns,
                    episode_lengths=lengths,
                )
                writer.put(columns, ref)
                seq += 1
                segment_steps = 0
            done = time.perf_counter()
            if windows is not None:
                # env: the time the loop waited for envs beyond acting (with double
                # buffering, envs also step while the policy acts).
                waiting_s = stepped - started - acting_s[0]
                phases = {"act": acting_s[0], "env": waiting_s, "data": done - stepped}
                windows.add(num_envs * frame_skip, phases)

        for _ in range(WARMUP_STEPS):
            step(None)
        windows = run_timed(seconds, window_s, step)
    finally:
        stepper.close()
        writer.close()
    phases = windows.best_phases_s
    name = f"{manager}, double-buffered" if double_buffer else manager
    return Measured(
        name,
        num_envs,
        parallelism,
        windows.best_frames_per_s,
        (phases.get("act", 0.0), phases.get("env", 0.0), phases.get("data", 0.0)),
    )


def load_job(path: Path | None, num_envs: int | None) -> JobConfig:
    """The DQN Pong job (`path`, else `EXAMPLE`, else `PONG_DQN`), checked and fitted
    to its env as a collector gets it."""
    if path is None and EXAMPLE.is_file():
        path = EXAMPLE
    raw = load_config_file(path) if path is not None else PONG_DQN
    if num_envs is not None:
        raw = {**raw, "env": {**raw.get("env", {}), "collector_env_num": num_envs}}
    config, _ = resolve_job_config(raw)
    if config.policy.type != "dqn":
        raise ConfigError("policy.type", "this bench runs DQN's transitions loop")
    return fit_to_env(config)


def machine_facts(torch_threads: int) -> list[str]:
    return [
        f"{cpu_line()}; no GPU used",
        f"python {platform.python_version()}, torch {torch.__version__} "
        f"({torch_threads} thread{'s' if torch_threads > 1 else ''}), envpool "
        f"{envpool.__version__}",
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--managers", default=",".join(MANAGERS), help="comma-separated")
    parser.add_argument("--num-envs", type=int, help="envs a collector (default: the config's)")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds a row")
    parser.add_argument("--window", type=float, default=5.0, help="seconds a timed window")
    parser.add_argument("--ceiling-envs", type=int, help="envs in the ceiling's pool (4 a CPU)")
    parser.add_argument("--torch-threads", type=int, help="default: system.torch_num_threads")
    parser.add_argument(
        "--config", type=Path, help="a DQN Pong job (default: examples/pong_dqn.yaml)"
    )
    args = parser.parse_args()
    args.managers = [m.strip() for m in args.managers.split(",") if m.strip()]
    if not args.managers or any(m not in MANAGERS for m in args.managers):
        parser.error(f"--managers: choose from {', '.join(MANAGERS)}")
    if args.seconds <= 0 or args.window <= 0 or args.window > args.seconds:
        parser.error("--seconds and --window: positive, and a window at most --seconds")
    for name in ("num_envs", "ceiling_envs", "torch_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: at least 1")
    return args


def main() -> None:
    args = parse_args()
    console = Console(width=120)
    setup_env_registry()
    try:
        config = load_job(args.config, args.num_envs)
    except ConfigError as exc:
        sys.exit(f"config: {exc}")
    torch_threads = args.torch_threads or config.system.torch_num_threads
    torch.set_num_threads(torch_threads)
    for fact in machine_facts(torch_threads):
        console.print(fact)
    print_load_before(console)
    rows = [ceiling(config, args.seconds, args.window, args.ceiling_envs or 4 * usable_cpus())]
    console.print(f"ceiling: {rows[0].frames_per_s:,.0f} frames/s")
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="atari-collect-") as folder:
        store = SharedStore(folder)
        for manager in args.managers:
            for double_buffer in (False, True) if manager in OVERLAPPING_MANAGERS else (False,):
                try:
                    rows.append(
                        one_collector(
                            config, manager, double_buffer, args.seconds, args.window, store
                        )
                    )
                except ConfigError as exc:  # e.g. envpool not installed here
                    failed.append(f"{manager}: {exc}")
                    break
                console.print(f"{rows[-1].label}: {rows[-1].frames_per_s:,.0f} frames/s")
    table = Table(
        title=f"{config.env.env_id} frames/s (agent steps x frame_skip {config.env.frame_skip}), "
        f"one collector vs the simulation ceiling; torch threads {torch_threads}"
    )
    for column in (
        "manager",
        "num_envs",
        "workers/threads",
        "frames/s",
        "x ceiling",
        "act",
        "env",
        "data",
    ):
        table.add_column(column, justify="left" if column == "manager" else "right")
    top = rows[0].frames_per_s
    for row in rows:
        shares = [f"{s:.0%}" for s in row.shares] if row.shares else ["-"] * 3
        table.add_row(
            row.label,
            str(row.num_envs),
            row.parallelism,
            f"{row.frames_per_s:,.0f}",
            f"{row.frames_per_s / top:.2f}" if top else "-",
            *shares,
        )
    console.print(table)
    for line in failed:
        console.print(f"[yellow]not measured: {line}")
    console.print(
        f"The fastest {args.window:g} s window of {args.seconds:g} s a row, after "
        f"{WARMUP_STEPS} untimed steps. act/env/data: shares of that window's time in "
        "the actor, the envs, and n-step rows plus waiting for the segment writer."
    )


if __name__ == "__main__":
    main()
