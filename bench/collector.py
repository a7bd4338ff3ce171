"""Collector efficiency on CartPole-v1: one real collect task against the same envs and
the same policy's inference with nothing written.

    python bench/collector.py [--pairs 15] [--window-s 1] [--seconds 10] [--warmup-steps 20000]
        [--algos dqn,ppo] [--profile-s 10] [--profile-out /tmp/collector-dqn.txt]

For DQN (examples/cartpole_dqn.yaml) and PPO (examples/cartpole_ppo.yaml), with the
example's `collector_env_num` envs:

- reference, in this process: the vector env `make_env` makes from the job's env
  config, stepped with the actor's inference at every step, nothing recorded or
  written. DQN: in `--pairs` windows of `--window-s`, each just before one of the
  collector's (below); PPO: for `--seconds` before the measured row and once after,
  averaged. DQN:
  `actor.act` with a loaded policy, epsilon at its end value (as a collector's is
  after the warm-up). PPO: `actor.sample`, whose state values
  are the ones GAE needs (the rounds loop passes the critic again only on the final
  observations of episodes that ended, and on the observations after a round). Torch
  runs the job's `system.torch_num_threads` threads, as a collector sets it.
- measured: a real coordinator, one collector and one learner as local processes
  (`drover.local.LocalCluster`, what `drover run` starts) on a job that never trains.
  - DQN (async workflow, `transitions` loop): no rate limit (`samples_per_insert`
    null) and `min_size_to_sample` above anything the run can insert, so the learner
    publishes its first version (the collector acts with the network) and then only
    waits; nothing waits on the collector and it waits on nothing. After
    `--warmup-steps`, the reference and the collect task take turns: the collector's
    process is stopped (SIGSTOP) while a reference window runs, then resumed for a
    window of its own, `--pairs` times. Its window is the env steps its Prometheus
    counter (`drover_env_steps_total`, read from its `/metrics`) gained, every step's
    transitions written as segments and inserted. The ratio is the median of the
    pairs' ratios: the two windows of a pair follow each other, so a change in the
    machine's speed reaches both (one 2-vCPU machine's reference alone varied from
    12,700 to 28,000 steps/s between 2-second windows).
  - PPO (sync workflow, `rounds` loop): a round waits for the learner's next version,
    so a collect task's time is rounds and waits. The row is the collect task's time
    per round: from the learner's policy file for version v being written to the
    collector's segment of the round collected with v being written (mtimes on the
    shared store), i.e. announcing v, the long-poll answering, loading v, stepping
    `n_sample` env steps with `sample` and the critic, GAE, and writing the segment;
    the insert (after the write) and the learner's training are not in it. Env steps
    per round / that time, over the rounds that finish within `--seconds` after the
    warm-up. `system.collector_num` is 1: this collector collects the whole round.

The ratio is measured / reference (DQN: the pairs' median). Both run on this
machine's CPUs (the collector's process and this one have the same affinity); with a
coordinator and a learner beside it, the collector does not have the machine to
itself, as in a real run.

DQN's row also gives the CPU time per env step of the collector's stepping thread (its
busiest thread; the scheduler's count, /proc/PID/task/TID/schedstat) and of the
reference's, and the stepping thread's shares of its windows: on a CPU, runnable but
waiting for one, and blocked (on the interpreter lock, or on the uploader's queue).

With DQN, a last table gives the transitions loop's step-data work on the stepping
thread, measured in this process on the reference's steps (`step_data_cost`): the
n-step builder's `add` at each vector step and, at each take, the episodes and env
steps counted, the rows made and the segment's columns chosen, in CPU us per env step
and as a share of the act and env step they follow. It is the loop's own cost without
the services beside it, a steadier figure than the throughput row.

`--profile-s` (DQN only; 0: none) then records the DQN collector process with py-spy
(`record --format raw --idle --threads`, 100 Hz) for that long after the timed
window, and prints the stepping and uploader threads' wall time by kind of work
(the innermost project frame of each sample) and the top frames by own time.

Timings vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.registry import ALGORITHMS  # noqa: E402
from bench.learner_scaling import cpu_line  # noqa: E402
from bench.procfs import shares_text, thread_sched_s, threads_of, window_shares  # noqa: E402
from bench.results import write_figures  # noqa: E402
from common.config import JobConfig, deep_merge  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.http_client import ServiceClient  # noqa: E402
from common.models import state_to_numpy  # noqa: E402
from common.storage import SharedStore  # noqa: E402
from drover.local import LocalCluster  # noqa: E402
from jobconfig import fit_to_env, load_config_file, resolve_job_config  # noqa: E402
from services.collector.core import TAKE_EVERY_S, declared_only  # noqa: E402
from services.collector.metrics import CollectorMetrics  # noqa: E402
from services.collector.step_data import VERSION, EpisodeTracker, NStepBuilder  # noqa: E402

EXAMPLES = {
    "dqn": ROOT / "examples" / "cartpole_dqn.yaml",
    "ppo": ROOT / "examples" / "cartpole_ppo.yaml",
}
#: More than any run of this bench inserts: the DQN learner never samples, so never trains.
NEVER = 1_000_000_000
BUFFER_ROWS = 2_000_000
#: Vector steps before the reference's timed window (torch's first calls).
REFERENCE_WARMUP_STEPS = 200
#: What the bench reads the collector's `/metrics` with.
METRICS_TOKEN = secrets.token_urlsafe(16)


@dataclass
class Row:
    algo: str
    num_envs: int
    reference: float
    measured: float
    what: str
    cpus: str
    pid: int | None = None
    #: The median of the pairs' ratios, where the rows were measured in pairs.
    ratio: float | None = None


def overrides(algo: str) -> dict[str, Any]:
    """A job that collects and never ends, never evaluates, and (DQN) never trains."""
    common: dict[str, Any] = {
        "env": {"stop_value": None},
        "policy": {"eval": {"evaluator": {"eval_freq": NEVER}}},
        "system": {"max_env_step": NEVER},
    }
    if algo == "dqn":
        return deep_merge(
            common,
            {
                "policy": {
                    "other": {
                        "replay_buffer": {
                            "samples_per_insert": None,
                            "replay_buffer_size": BUFFER_ROWS,
                            "min_size_to_sample": BUFFER_ROWS,
                        }
                    }
                }
            },
        )
    return deep_merge(common, {"system": {"collector_num": 1}})


def raw_config(algo: str) -> dict[str, Any]:
    return deep_merge(load_config_file(EXAMPLES[algo]), overrides(algo))


def job_config(algo: str) -> JobConfig:
    """The config a collector gets: resolved and fitted to the env."""
    config, _ = resolve_job_config(raw_config(algo))
    return fit_to_env(config)


# --- reference ------------------------------------------------------------------------


class Reference:
    """The vector env stepped with the actor's inference, nothing else; `window` times
    it for a while and can be called again (the env and actor are made once)."""

    def __init__(self, config: JobConfig) -> None:
        torch.set_num_threads(config.system.torch_num_threads)
        self.num_envs = config.env.collector_env_num
        actor = self.actor = ALGORITHMS[config.policy.type].make_actor(config.policy)
        actor.load(1, state_to_numpy(actor.network))
        env = self.env = make_env(config.env, self.num_envs)
        rng = self.rng = np.random.default_rng(0)
        if config.policy.type == "dqn":

            def step(obs: np.ndarray) -> np.ndarray:
                # Epsilon at its end value, as after the measured row's warm-up.
                actions = actor.act(obs, rng, NEVER)
                return env.step(actor.env_action(actions)).obs

        else:

            def step(obs: np.ndarray) -> np.ndarray:
                # The state values GAE needs come with `sample` (the rounds loop passes
                # the critic again only where an episode ended, and once a round).
                action, _logp, _value = actor.sample(obs)
                return env.step(actor.env_action(action)).obs

        self.step = step
        self.obs = env.reset(seed=0)
        for _ in range(REFERENCE_WARMUP_STEPS):
            self.obs = step(self.obs)

    def window(self, seconds: float) -> float:
        """Env steps/s over `seconds` (and `cpu_us_per_step`: this thread's CPU time
        per env step over them)."""
        steps = 0
        started, cpu_started = time.perf_counter(), time.thread_time()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            self.obs = self.step(self.obs)
            steps += 1
        self.cpu_us_per_step = (time.thread_time() - cpu_started) * 1e6 / (steps * self.num_envs)
        return steps * self.num_envs / (time.perf_counter() - started)

    def close(self) -> None:
        self.env.close()


def reference(config: JobConfig, seconds: float) -> float:
    """Env steps/s of the vector env stepped with the actor's inference, nothing else."""
    ref = Reference(config)
    try:
        return ref.window(seconds)
    finally:
        ref.close()


# --- measured -------------------------------------------------------------------------


def collect_progress(cluster: LocalCluster) -> dict[str, Any] | None:
    for worker in cluster.client.workers():
        for task_id, progress in worker.progress.items():
            if task_id.startswith("collect-") and progress.get("env_steps"):
                return progress
    return None


def affinity(pid: int) -> str:
    try:
        return str(len(os.sched_getaffinity(pid)))
    except OSError:
        return "?"


def wait_for(cluster: LocalCluster, job_id: str, ready: Any, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = cluster.client.job(job_id)
        if status.phase != "running":
            raise RuntimeError(f"job {job_id} is {status.phase}: {status}")
        value = ready()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id}: not ready within {timeout_s}s")


def measure_dqn(
    work: Path,
    pairs: int,
    window_s: float,
    warmup_steps: int,
    profile_s: float,
    profile_out: Path | None,
) -> tuple[Row, str | None]:
    """`pairs` windows of the reference and of the collector, in turn. While the
    reference steps, the collector's process is stopped (SIGSTOP, for far less than
    the coordinator's lease), so neither takes CPU from the other, and both have the
    same coordinator and learner beside them; the two windows of a pair follow each
    other, so a change in the machine's speed reaches both."""
    config = job_config("dqn")
    num_envs = config.env.collector_env_num
    ref = Reference(config)
    refs: list[float] = []
    rates: list[float] = []
    #: The stepping thread's CPU per env step, and the reference's, in µs; its shares
    #: of each window: on a CPU, and runnable but waiting for one.
    cpu_us: list[float] = []
    ref_cpu_us: list[float] = []
    shares: list[tuple[float, float]] = []
    try:
        extra_env = {"DROVER_METRICS_TOKEN": METRICS_TOKEN}
        with LocalCluster(work / "dqn", num_collectors=1, extra_env=extra_env) as cluster:
            job_id = cluster.client.submit_job(raw_config("dqn")).job_id

            def warmed() -> dict[str, Any] | None:
                p = collect_progress(cluster)
                ok = p and p.get("policy_version", 0) >= 1 and p["env_steps"] >= warmup_steps
                return p if ok else None

            first = wait_for(cluster, job_id, warmed)
            collector = cluster.collectors[0]
            pid = collector.process.pid  # type: ignore[union-attr]
            counter = ServiceClient(collector.url, METRICS_TOKEN, timeout_s=10.0)
            stepping = busiest_thread(pid)
            for _ in range(pairs):
                os.kill(pid, signal.SIGSTOP)
                try:
                    refs.append(ref.window(window_s))
                    ref_cpu_us.append(ref.cpu_us_per_step)
                finally:
                    os.kill(pid, signal.SIGCONT)
                steps, at = env_steps(counter), time.perf_counter()
                before = sched_or_none(pid, stepping)
                time.sleep(window_s)
                gained, took = env_steps(counter) - steps, time.perf_counter() - at
                after = sched_or_none(pid, stepping)
                rates.append(gained / took)
                if before is None or after is None:  # its task ended: the next one's
                    stepping = busiest_thread(pid)
                    continue
                shares.append(window_shares(before, after, took))
                cpu_us.append((after[0] - before[0]) * 1e6 / max(gained, 1.0))
            cpus = affinity(pid)
            raw = record_profile(pid, profile_s, profile_out) if profile_s > 0 else None
            cluster.client.stop_job(job_id)
    finally:
        ref.close()
    ratios = [rate / r for rate, r in zip(rates, refs, strict=True)]
    on_cpu = statistics.median(share[0] for share in shares) if shares else float("nan")
    waiting = statistics.median(share[1] for share in shares) if shares else float("nan")
    what = (
        f"transitions loop, {pairs} pairs of {window_s:g}s windows after "
        f"{int(first['env_steps']):,} steps; eps {first.get('epsilon', '?')}; pair ratios "
        f"{min(ratios):.2f}-{max(ratios):.2f}; reference {min(refs):,.0f}-{max(refs):,.0f}/s. "
        f"CPU per env step: stepping thread "
        f"{statistics.median(cpu_us) if cpu_us else float('nan'):.1f} us, reference "
        f"{statistics.median(ref_cpu_us):.1f} us; stepping thread on a CPU, waiting for one, "
        f"blocked: {shares_text(on_cpu, waiting)} (medians)"
    )
    row = Row(
        "DQN",
        num_envs,
        statistics.median(refs),
        statistics.median(rates),
        what,
        cpus,
        pid,
        ratio=statistics.median(ratios),
    )
    return row, raw


def busiest_thread(pid: int, over_s: float = 0.5) -> int:
    """The thread of process `pid` that took the most CPU over the next `over_s`: a
    collecting collector's stepping thread, by far (a thread that took more before,
    such as an ended task's, is not it)."""
    before = {tid: sched_or_none(pid, tid) for tid in threads_of(pid)}
    time.sleep(over_s)
    gained = {}
    for tid, was in before.items():
        now = sched_or_none(pid, tid)
        if was is not None and now is not None:
            gained[tid] = now[0] - was[0]
    return max(gained, key=gained.__getitem__)


def sched_or_none(pid: int, tid: int) -> tuple[float, float] | None:
    """`thread_sched_s`, or None once the thread has ended."""
    try:
        return thread_sched_s(pid, tid)
    except FileNotFoundError:
        return None


def env_steps(collector: ServiceClient) -> float:
    """The collector's count of env steps taken (its Prometheus counter, which the
    loop adds to at every vector step)."""
    text = collector.raw("GET", "/metrics").data.decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "drover_env_steps_total":
                return sample.value
    raise RuntimeError("the collector's /metrics has no drover_env_steps_total")


def measure_ppo(work: Path, seconds: float) -> Row:
    config = job_config("ppo")
    num_envs = config.env.collector_env_num
    with LocalCluster(work / "ppo", num_collectors=1) as cluster:
        store = SharedStore(cluster.shared_dir)
        job_id = cluster.client.submit_job(raw_config("ppo")).job_id
        # Warm-up: two rounds.
        wait_for(
            cluster, job_id, lambda: (collect_progress(cluster) or {}).get("policy_version", 0) >= 2
        )
        policy_mtime: dict[int, float] = {}
        segment_mtime: dict[str, float] = {}
        seg_root = cluster.shared_dir / job_id / "segments"
        pol_root = cluster.shared_dir / job_id / "policies"
        deadline = time.monotonic() + seconds
        # The files may be pruned once used: note each one's mtime when it appears.
        while time.monotonic() < deadline:
            for entry in os.scandir(pol_root) if pol_root.is_dir() else ():
                m = re.fullmatch(r"(\d+)\.safetensors", entry.name)
                if m and int(m.group(1)) not in policy_mtime:
                    policy_mtime[int(m.group(1))] = entry.stat().st_mtime
            for folder in os.scandir(seg_root) if seg_root.is_dir() else ():
                for entry in os.scandir(folder.path):
                    rel = f"{job_id}/segments/{folder.name}/{entry.name}"
                    if entry.name.endswith(".safetensors") and rel not in segment_mtime:
                        segment_mtime[rel] = entry.stat().st_mtime
            time.sleep(0.02)
        rounds = []
        for rel, mtime in segment_mtime.items():
            try:
                header = store.read_segment_header(rel)
            except OSError:
                continue
            version = header["policy_version"] if header else None
            if version in policy_mtime and header:
                rounds.append((header["env_steps"], mtime - policy_mtime[version]))
        pid = cluster.collectors[0].process.pid  # type: ignore[union-attr]
        cpus = affinity(pid)
        cluster.client.stop_job(job_id)
    if not rounds:
        raise RuntimeError("no round started and finished within the window")
    steps = sum(r[0] for r in rounds)
    round_s = sum(r[1] for r in rounds)
    what = (
        f"rounds loop, per round: policy v written -> round-v segment written; "
        f"{len(rounds)} rounds of {steps // len(rounds):,} steps, "
        f"median {sorted(r[1] for r in rounds)[len(rounds) // 2] * 1000:.0f} ms"
    )
    return Row("PPO", num_envs, 0.0, steps / round_s, what, cpus, pid)


# --- profile --------------------------------------------------------------------------

#: Kinds of work, by the innermost project frame of a sample's stack (first match wins).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waiting: uploader queue full", ("uploader.py:SegmentUploader.put",)),
    ("segment writing", ("common/storage.py", "common/frames.py", "safetensors")),
    (
        "HTTP insert",
        ("uploader.py:SegmentUploader._insert", "http_client.py", "coordinator/client.py"),
    ),
    ("policy refresh", ("follower.py",)),
    ("policy inference", ("algorithms/",)),
    ("env stepping", ("common/envs.py", "gymnasium/")),
    ("n-step builder/per-env loops", ("step_data.py",)),
    ("collect loop (core.py, stepping.py)", ("collector/core.py", "collector/stepping.py")),
)
#: Leaf functions that wait (no CPU): left out of the own-time ranking.
WAITS = ("Condition.wait", "Event.wait", "Lock.acquire", "select", "poll", "accept", "_wait")


def fsync_line() -> int:
    """The line of `SharedStore.write_bytes` that fsyncs (a sample there is fsync)."""
    lines, first = inspect.getsourcelines(SharedStore.write_bytes)
    return first + next(i for i, text in enumerate(lines) if "os.fsync(" in text)


def frame_parts(frame: str) -> tuple[str, str, int]:
    """(function, file, line) of a py-spy raw frame `function (file:line)`."""
    m = re.fullmatch(r"(.*) \((.*?)(?::(\d+))?\)", frame)
    if not m:
        return frame, "", 0
    return m.group(1), m.group(2), int(m.group(3) or 0)


def kind_of(frames: list[str], fsync_at: int) -> str:
    function, path, line = frame_parts(frames[-1])
    if path.endswith("common/storage.py") and function.endswith("write_bytes") and line == fsync_at:
        return "segment fsync"
    for frame in reversed(frames):  # innermost first
        function, path, _ = frame_parts(frame)
        key = f"{path}:{function}"
        for kind, needles in KINDS:
            if any(n in key for n in needles):
                return kind
    if frame_parts(frames[-1])[0].endswith(WAITS):
        return "idle (waiting for work)"
    return "other (Flask, heartbeat, threads)"


def record_profile(pid: int, seconds: float, out: Path | None) -> str | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    path = out or Path(tempfile.mkdtemp()) / "collector-dqn.txt"
    proc = subprocess.run(
        [
            spy,
            "record",
            "--format",
            "raw",
            "-r",
            "100",
            "-d",
            str(int(seconds)),
            "--threads",
            "--idle",
        ]
        + ["--pid", str(pid), "-o", str(path)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if proc.returncode != 0 or not path.exists():
        print(f"py-spy failed ({proc.returncode}): {proc.stderr[-500:]}", file=sys.stderr)
        return None
    return path.read_text()


def summarize(raw: str, console: Console) -> None:
    """Tables of a py-spy raw profile recorded with `--idle --threads`: each thread's wall
    time by kind of work, and the top frames by own time among samples that ran."""
    fsync_at = fsync_line()
    own: collections.Counter[str] = collections.Counter()
    by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    running = 0
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        stack = stack_text.split(";")
        thread = stack[0].split(": ", 1)[-1] if stack[0].startswith("thread") else "?"
        thread = re.sub(r"^task-collect-.*", "task-collect (stepping)", thread)
        thread = re.sub(r"^waitress-\d+", "waitress-*", thread)
        frames = [f for f in stack if not f.startswith(("thread", "process"))]
        if not frames:
            continue
        by_thread[thread][kind_of(frames, fsync_at)] += count
        function, path, _ = frame_parts(frames[-1])
        if not function.endswith(WAITS) and not function.endswith(("readinto", "recv_into")):
            own[f"{function} ({path.split('site-packages/')[-1].split('/work/main/')[-1]})"] += (
                count
            )
            running += count
    for thread in ("task-collect (stepping)", "uploader"):
        kinds = by_thread.get(thread)
        if not kinds:
            continue
        total = sum(kinds.values())
        table = Table(
            title=f"DQN collector, py-spy: the {thread} thread's wall time ({total:,} samples)"
        )
        table.add_column("kind of work (innermost project frame)")
        table.add_column("share", justify="right")
        for kind, count in kinds.most_common():
            table.add_row(kind, f"{count / total:.1%}")
        console.print(table)
    if running:
        table = Table(
            title=f"top frames by own time, every thread, waits left out ({running:,} samples)"
        )
        table.add_column("frame")
        table.add_column("share", justify="right")
        for frame, count in own.most_common(10):
            table.add_row(frame, f"{count / running:.1%}")
        console.print(table)


def step_data_cost(windows: int, window_s: float) -> tuple[float, float, int]:
    """The transitions loop's step-data work, in this process on the reference's steps:
    each vector step into the n-step builder, and at each take (every `TAKE_EVERY_S`, as
    the loop takes) its episodes and env steps counted, its rows made and the segment's
    columns chosen. Returns the medians over `windows` windows of `window_s` of the CPU per env
    step of that work and of the step itself (the policy's act and the envs' step), in
    µs, and the vector steps a take held on average.

    What is measured is the loop's own calls on the stepping thread, without the
    services beside it: a steady figure where a throughput row's noise hides a few
    percent."""
    config = job_config("dqn")
    ref = Reference(config)  # its envs and actor, warmed up
    actor, env, rng, num_envs, obs = ref.actor, ref.env, ref.rng, ref.num_envs, ref.obs
    builder = NStepBuilder(num_envs, config.policy.collect_nstep, config.policy.discount_factor)
    episodes = EpisodeTracker(num_envs)
    counter = CollectorMetrics(CollectorRegistry()).env_steps
    n_sample = config.policy.collect.n_sample
    work_us, step_us, steps_per_take = [], [], []
    try:
        for window in range(windows + 1):  # the first warms up
            steps = takes = counted = 0
            work_s = step_s = 0.0
            next_take_at = time.monotonic()
            deadline = time.perf_counter() + window_s
            while time.perf_counter() < deadline:
                at = time.thread_time()
                actions = actor.act(obs, rng, NEVER)
                versions = np.full(num_envs, actor.version, np.int64)
                step = env.step(actor.env_action(actions))
                stepped = time.thread_time()
                builder.add(
                    obs,
                    actions,
                    step.reward,
                    step.final_obs,
                    step.terminated,
                    step.truncated,
                    {VERSION: versions},
                )
                if (
                    builder.begun >= n_sample
                    and time.monotonic() >= next_take_at
                    and len(builder) >= n_sample
                ):
                    next_take_at = time.monotonic() + TAKE_EVERY_S
                    episodes.steps(*builder.fresh_steps())
                    counter.inc((steps + 1 - counted) * num_envs)
                    counted = steps + 1
                    declared_only(config, builder.take())
                    episodes.take()
                    takes += 1
                obs = step.obs
                work_s += time.thread_time() - stepped
                step_s += stepped - at
                steps += 1
            if window:
                work_us.append(work_s * 1e6 / (steps * num_envs))
                step_us.append(step_s * 1e6 / (steps * num_envs))
                steps_per_take.append(steps / max(takes, 1))
    finally:
        ref.close()
    return (
        statistics.median(work_us),
        statistics.median(step_us),
        round(statistics.mean(steps_per_take)),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0, help="PPO's windows")
    parser.add_argument("--pairs", type=int, default=15, help="DQN's pairs of windows")
    parser.add_argument("--window-s", type=float, default=1.0, help="DQN's windows")
    parser.add_argument("--warmup-steps", type=int, default=20_000)
    parser.add_argument("--algos", default="dqn,ppo")
    parser.add_argument("--profile-s", type=float, default=0.0)
    parser.add_argument("--profile-out", type=Path, default=None)
    parser.add_argument("--json", type=Path, help="also write each algo's ratio here")
    args = parser.parse_args()
    console = Console(width=160)
    rows: list[Row] = []
    raw = None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for algo in args.algos.split(","):
            if algo == "dqn":
                row, raw = measure_dqn(
                    work,
                    args.pairs,
                    args.window_s,
                    args.warmup_steps,
                    args.profile_s,
                    args.profile_out,
                )
            else:
                # The reference before and after the measured row, averaged: the
                # machine's load may drift over the minute between them.
                config = job_config(algo)
                before = reference(config, args.seconds)
                row = measure_ppo(work, args.seconds)
                after = reference(config, args.seconds)
                row.reference = (before + after) / 2
                row.what += f"; reference before/after {before:,.0f}/{after:,.0f}"
            rows.append(row)

    table = Table(
        title=f"Collector efficiency, CartPole-v1; {cpu_line()}; "
        f"torch {torch.__version__}, 1 torch thread"
    )
    for col in ("algo", "envs", "reference steps/s", "measured steps/s", "ratio", "CPUs"):
        table.add_column(col, justify="right")
    table.add_column("measured row")
    for r in rows:
        table.add_row(
            r.algo,
            str(r.num_envs),
            f"{r.reference:,.0f}",
            f"{r.measured:,.0f}",
            f"{r.ratio if r.ratio is not None else r.measured / r.reference:.2f}",
            f"{r.cpus} (this {len(os.sched_getaffinity(0))})",
            r.what,
        )
    console.print(table)
    write_figures(
        args.json,
        "collector",
        {
            r.algo: {
                "reference_steps_per_s": r.reference,
                "measured_steps_per_s": r.measured,
                "ratio": r.ratio if r.ratio is not None else r.measured / r.reference,
            }
            for r in rows
        },
    )
    if "dqn" in args.algos.split(","):
        work_us, step_us, per_take = step_data_cost(windows=10, window_s=0.5)
        table = Table(
            title="DQN's step data on the stepping thread, in this process (medians of 10 x 0.5 s)"
        )
        for col in ("step data, CPU us per env step", "act + env step, CPU us", "share"):
            table.add_column(col, justify="right")
        table.add_column("what")
        table.add_row(
            f"{work_us:.2f}",
            f"{step_us:.1f}",
            f"{work_us / step_us:.1%}",
            f"the n-step builder's add at each step; a take every {per_take} vector steps "
            "(its episodes and env steps counted, its rows, the segment's columns)",
        )
        console.print(table)
    if raw:
        summarize(raw, console)


if __name__ == "__main__":
    main()
