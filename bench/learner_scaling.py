"""Learner-group scaling: how much faster N ranks train one DQN learner than one rank.

    python bench/learner_scaling.py [--ranks 1,2] [--models cartpole,heavy]
        [--updates N] [--repeats 5] [--device cpu|cuda] [--timeout 300]

A learner group (services/learner/group.py) splits every global batch over its ranks;
each rank trains the real DQN learner (`DQN.learn_batch`) on its share, and
`finite_step` averages the gradients across the ranks with `AllReduceSync` (bucketed
all-reduces started during backward, as DistributedDataParallel does) before the
optimizer steps. Each rank does 1/N of the forward and backward passes, but all of
the optimizer step, and waits for whatever communication backward did not hide, so a
group is worth its cores only when the compute it splits outweighs what it adds.

For each model and rank count this starts the ranks as subprocesses of this script,
with RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/MASTER_PORT set as torchrun sets
them; `RankGroup.join` connects them (gloo on CPU; with `--device cuda`, NCCL and
one GPU per local rank). Every rank builds its learner with `new_learner` (whose
`sync` is `AllReduceSync(None, world_size)` for N > 1), starts from rank 0's weights
(`broadcast_state`), runs warm-up updates, then times `--repeats` windows of
`--updates` updates each, all ranks starting each window together. Each rank writes
what it measured to a JSON file in a temporary folder; the launcher merges them.

Reported, per (model, ranks), from the fastest window (so that a burst of other load
on the machine costs a window, not the result):

- global samples/s and updates/s: global batch x updates / the slowest rank's time;
- efficiency: rate(N) / (N x rate(1)); 1.0 when N ranks are N times as fast;
- all-reduce share: the part of each rank's time spent waiting for the all-reduces
  after backward (`AllReduceSync.wait_s`: the communication backward did not hide,
  and waiting for the slower rank), mean over the ranks.
  The rest of the efficiency lost is work a share does not shrink: every rank steps
  the optimizer over all the weights and clips the whole gradient, the per-update
  Python overhead stays, and smaller matrix products run less efficiently.

Torch runs one thread per rank (`torch.set_num_threads(1)`), so the 1-rank reference
uses one core and N ranks use N cores: the comparison is of cores, not of threads.

Two models:

- `cartpole`: DQN's default model for CartPole (obs 4, 2 actions, the default
  `encoder_hidden_size_list` [128, 128, 64], dueling head), global batch 64 (the
  default `batch_size`): little compute per update, so the all-reduce weighs heavily;
- `heavy`: DQN with `encoder_hidden_size_list` [512, 512, 512], obs 64, 6 actions
  (dueling head), global batch 256: 562k weights, and about 13 ms an update on one
  core, so its all-reduce (2.2 MB) weighs as much as the compute it splits;
- `cnn`: the DQN learner with the Nature-DQN CNN on 4x84x84 frames, 6 actions,
  global batch 256: 1.7M weights and about 0.3 s an update on one core, the
  compute-heavy case a learner group is for. Target: >= 0.8 efficiency at 2 ranks
  on CPU.

Not measured: reading data. Each global batch is made in memory before timing (a few
fixed random batches, the same on every rank, trained on in turn) and each rank
slices its share of it (`share_bounds`). A real group reads its share from the shared
file system, and its `Trainer` adds two small collectives per batch (the agreement
that every rank has rows, and the gathered report), which this leaves out.

Timings vary with machine load; compare within one run, and give each rank a core:
with other processes busy, N-rank rows suffer most, since every update waits for the
slowest rank. So the bench says how much of the CPUs' time, before it starts and
during each run, other processes used and the hypervisor stole (a virtual machine's
steal time), and warns when that is over 10%.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import resource
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
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms.step import adam  # noqa: E402
from algorithms.sync import AllReduceSync  # noqa: E402
from common.config import JobConfig  # noqa: E402
from drover.local import free_port  # noqa: E402
from jobconfig import resolve_job_config, with_spaces  # noqa: E402
from jobconfig.ranks import split_error  # noqa: E402
from services.learner.group import RankEnv, RankGroup, share_bounds  # noqa: E402
from services.learner.training import new_learner  # noqa: E402

#: The efficiency a 2-rank group should reach on the compute-heavy model on CPU.
TARGET_MODEL, TARGET_RANKS, TARGET_EFFICIENCY = "cnn", 2, 0.8
#: Distinct global batches, trained on in turn.
BATCHES = 4
#: A share of the CPUs' time lost to other processes and steal, before the bench or
#: during a run, above which it warns (the N-rank rows suffer most).
BUSY_SHARE = 0.1


@dataclass(frozen=True)
class ModelSpec:
    """One benchmarked model: its DQN network, global batch, and default run length."""

    obs: int
    actions: int
    #: `encoder_hidden_size_list` (None: the config's default).
    hidden: tuple[int, ...] | None
    batch: int
    #: Timed updates a window, and untimed ones before the first.
    updates: int
    warmup: int
    #: Image observations (channels, height, width): the DQN learner trains the
    #: Nature-DQN CNN on them instead of its MLP.
    frames: tuple[int, int, int] | None = None

    def obs_shape(self) -> tuple[int, ...]:
        return self.frames or (self.obs,)

    def config(self, device: str) -> JobConfig:
        model: dict[str, Any] = {}
        if self.hidden is not None:
            model["encoder_hidden_size_list"] = list(self.hidden)
        raw = {
            "policy": {
                "type": "dqn",
                "device": device,
                "model": model,
                "learn": {"batch_size": self.batch},
            }
        }
        config, _ = resolve_job_config(raw)
        return with_spaces(config, self.obs, self.actions)


MODELS = {
    "cartpole": ModelSpec(obs=4, actions=2, hidden=None, batch=64, updates=500, warmup=100),
    "heavy": ModelSpec(obs=64, actions=6, hidden=(512, 512, 512), batch=256, updates=60, warmup=10),
    "cnn": ModelSpec(
        obs=4, actions=6, hidden=None, batch=256, updates=4, warmup=1, frames=(4, 84, 84)
    ),
}


def nature_cnn(channels: int, actions: int) -> torch.nn.Module:
    """The Nature-DQN network (Mnih et al., 2015) for stacks of 84x84 frames."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, 4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, 2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, 1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3136, 512),
        nn.ReLU(),
        nn.Linear(512, actions),
    )


@dataclass(frozen=True)
class Plan:
    """How long one run trains: `warmup` updates, then `repeats` timed windows of
    `updates` updates each."""

    updates: int
    warmup: int
    repeats: int

    def flags(self) -> list[str]:
        return [
            *("--updates", str(self.updates)),
            *("--warmup", str(self.warmup)),
            *("--repeats", str(self.repeats)),
        ]


# --- one rank (a subprocess: --worker) ------------------------------------------------


def global_batches(spec: ModelSpec) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """`BATCHES` random n-step transition batches of the global batch size (the columns
    a segment holds, and importance weights), the same on every rank."""
    rng = np.random.default_rng(0)
    n = spec.batch
    batches = []
    for _ in range(BATCHES):
        columns = {
            "obs": rng.standard_normal((n, *spec.obs_shape()), dtype=np.float32),
            "action": rng.integers(0, spec.actions, n, dtype=np.int64),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": rng.standard_normal((n, *spec.obs_shape()), dtype=np.float32),
            "done": (rng.random(n) < 0.05).astype(np.float32),
            "discount": np.full(n, 0.99, dtype=np.float32),
        }
        batches.append((columns, rng.uniform(0.5, 1.0, n).astype(np.float32)))
    return batches


def worker(model: str, device_kind: str, plan: Plan, out: Path, timeout_s: float) -> None:
    """One rank (or the 1-rank reference, outside any group): train on this rank's share
    of each global batch as `plan` says, and write what it measured to
    `out`/rank<R>.json."""
    torch.set_num_threads(1)
    spec = MODELS[model]
    config = spec.config(device_kind)
    ranks = RankEnv.from_env()  # None for WORLD_SIZE=1
    group = RankGroup.join(ranks, collective_timeout_s=timeout_s) if ranks else None
    rank, world = (ranks.rank, ranks.world_size) if ranks else (0, 1)
    device = ranks.device(device_kind) if ranks else torch.device(device_kind)
    learner = new_learner(config, config.system.seed, group)
    if spec.frames is not None:
        # Image encoders come with image observations; until then the CNN is put in
        # the DQN learner by hand (its update, loss and sync stay the learner's own).
        learner.online = nature_cnn(spec.frames[0], spec.actions).to(device)
        learner.target = copy.deepcopy(learner.online).requires_grad_(False)
        learner.optimizer = adam(learner.online.parameters(), config.policy.learn.learning_rate)
    sync: AllReduceSync | None = None
    if group is not None:
        group.broadcast_state(learner.state_dict())
        assert isinstance(learner.sync, AllReduceSync)
        sync = learner.sync

    start, stop = share_bounds(spec.batch, rank, world)
    shares = [
        ({name: column[start:stop] for name, column in columns.items()}, weights[start:stop])
        for columns, weights in global_batches(spec)
    ]
    done = 0

    def train(count: int) -> None:
        nonlocal done
        for _ in range(count):
            learner.learn_batch(*shares[done % len(shares)])
            done += 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    train(plan.warmup)
    windows = []
    for _ in range(plan.repeats):
        if group is not None and sync is not None:
            group.all_min(0)  # a barrier: the ranks start each window together
            sync.wait_s = 0.0
        started = time.perf_counter()
        train(plan.updates)
        elapsed = time.perf_counter() - started
        windows.append({"elapsed_s": elapsed, "sync_s": sync.wait_s if sync else 0.0})
    result = {
        "rank": rank,
        "world_size": world,
        "rows": stop - start,
        "device": str(device),
        "params": sum(p.numel() for p in learner.online.parameters()),
        "skipped_updates": learner.skipped_updates,
        "windows": windows,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    if group is not None:
        group.close()


# --- the launcher ---------------------------------------------------------------------


@dataclass(frozen=True)
class CpuShares:
    """Shares of all CPUs' time over some span that the ranks lost to others."""

    #: Used by processes other than this one and the children it has waited for.
    others: float
    #: Taken by the hypervisor for other machines (a virtual machine's steal time).
    steal: float

    def __str__(self) -> str:
        return f"other processes used {self.others:.0%} of the CPUs, steal {self.steal:.0%}"


class CpuMeter:
    """How much of the machine's CPU time, since the meter was made, the ranks could not
    have: what other processes used, and what the hypervisor stole (Linux's
    /proc/stat; elsewhere nothing is known)."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float] | None:
        """(all CPU time, busy CPU time but steal, steal, ours), in seconds."""
        try:
            ticks = os.sysconf("SC_CLK_TCK")
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
            ours = sum(
                usage.ru_utime + usage.ru_stime
                for usage in (
                    resource.getrusage(resource.RUSAGE_SELF),
                    resource.getrusage(resource.RUSAGE_CHILDREN),
                )
            )
        except (OSError, ValueError, IndexError):
            return None
        # user nice system idle iowait irq softirq steal (guest time is in user)
        user, nice, system, idle, iowait, irq, softirq, steal = (f / ticks for f in fields[:8])
        busy = user + nice + system + irq + softirq
        return busy + idle + iowait + steal, busy, steal, ours

    def shares(self) -> CpuShares | None:
        end = self._read()
        if self.start is None or end is None:
            return None
        total, busy, steal, ours = (b - a for a, b in zip(self.start, end, strict=True))
        if total <= 0:
            return None
        return CpuShares(others=max(busy - ours, 0.0) / total, steal=steal / total)


@dataclass(frozen=True)
class Measured:
    """One (model, ranks) run's fastest window, merged over its ranks."""

    params: int
    samples_per_s: float
    updates_per_s: float
    sync_share: float
    skipped_updates: int
    #: The CPU time others had during the run (None: unknown).
    lost: CpuShares | None


class RunFailed(RuntimeError):
    pass


def run_ranks(
    model: str, world: int, device: str, plan: Plan, timeout_s: float, tmp: Path
) -> Measured:
    """Start `world` ranks of this script, wait for all of them (at most `timeout_s`,
    then they are killed), and merge what they wrote."""
    out = tmp / f"{model}-{world}"
    out.mkdir()
    port = free_port()
    meter = CpuMeter()
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--models", model]
    command += ["--device", device, "--timeout", str(timeout_s), "--out", str(out)]
    command += plan.flags()
    procs: list[tuple[subprocess.Popen, Path]] = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        log = out / f"rank{rank}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        procs.append((proc, log))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [proc.poll() for proc, _ in procs]
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                rank = failed[0]
                raise RunFailed(f"rank {rank} exited with {codes[rank]}:\n{_tail(procs[rank][1])}")
            if all(code == 0 for code in codes):
                break
            if time.monotonic() > deadline:
                raise RunFailed(f"still running after {timeout_s:.0f} s:\n{_tail(procs[0][1])}")
            time.sleep(0.05)
    finally:
        for proc, _ in procs:  # only after a failure: the ranks still running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lost = meter.shares()
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]
    # A window lasts as long as its slowest rank; the fastest such window counts.
    slowest = [max(r["windows"][w]["elapsed_s"] for r in results) for w in range(plan.repeats)]
    best = min(range(plan.repeats), key=slowest.__getitem__)
    shares = [r["windows"][best]["sync_s"] / r["windows"][best]["elapsed_s"] for r in results]
    return Measured(
        params=results[0]["params"],
        samples_per_s=MODELS[model].batch * plan.updates / slowest[best],
        updates_per_s=plan.updates / slowest[best],
        sync_share=statistics.mean(shares),
        skipped_updates=sum(r["skipped_updates"] for r in results),
        lost=lost,
    )


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def print_load_before(console: Console) -> None:
    """What other processes took of the CPUs in the second before a bench starts, with
    a warning when that is enough to slow its rows down."""
    meter = CpuMeter()
    time.sleep(1.0)
    before = meter.shares()
    if before is None:
        return
    console.print(f"in the second before the start, {before}")
    if before.others + before.steal > BUSY_SHARE:
        console.print("[yellow]the CPUs are not all free: the timings will be slower")


def cpu_line() -> str:
    """The machine's CPUs, as every bench prints them: count, usable here, model."""
    cpu_model = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPUs: {os.cpu_count()} ({usable} usable here), {cpu_model}"


def machine_facts(device: str, max_ranks: int) -> list[str]:
    facts = [
        cpu_line(),
        f"python {platform.python_version()}, torch {torch.__version__}, 1 torch thread a rank",
    ]
    if device == "cuda":
        names = sorted({torch.cuda.get_device_name(i) for i in range(max_ranks)})
        facts.append(f"device: cuda, one GPU a rank ({', '.join(names)}), NCCL")
    else:
        facts.append("device: cpu, gloo")
    return facts


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    parser.add_argument("--updates", type=int, help="timed updates a window (default: per model)")
    parser.add_argument("--warmup", type=int, help="untimed updates first (default: per model)")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows; the fastest counts")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.models or any(m not in MODELS for m in args.models):
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    try:
        args.ranks = sorted({int(r) for r in args.ranks.split(",") if r.strip()})
    except ValueError:
        parser.error("--ranks: comma-separated integers")
    if not args.ranks or args.ranks[0] < 1:
        parser.error("--ranks: one or more counts of at least 1")
    for name in ("updates", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name}: at least 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup: at least 0")
    if args.device == "cuda" and not args.worker:
        if not torch.cuda.is_available():
            parser.error("--device cuda: CUDA is not available here")
        if args.ranks[-1] > torch.cuda.device_count():
            gpus = torch.cuda.device_count()
            parser.error(f"--device cuda: {args.ranks[-1]} ranks need a GPU each, {gpus} here")
    for model in args.models:
        for world in args.ranks:
            error = split_error(MODELS[model].config(args.device).policy, world)
            if error is not None:
                parser.error(f"{model}: {error[1]}")
    return args


def plan_for(model: str, args: argparse.Namespace) -> Plan:
    spec = MODELS[model]
    return Plan(
        updates=spec.updates if args.updates is None else args.updates,
        warmup=spec.warmup if args.warmup is None else args.warmup,
        repeats=args.repeats,
    )


def main() -> None:
    args = parse_args()
    if args.worker:
        model = args.models[0]
        worker(model, args.device, plan_for(model, args), args.out, args.timeout)
        return

    console = Console(width=120)
    for fact in machine_facts(args.device, args.ranks[-1]):
        console.print(fact)
    print_load_before(console)
    cpus = os.cpu_count() or 1
    if args.device == "cpu" and args.ranks[-1] > cpus:
        console.print(f"[yellow]{args.ranks[-1]} ranks on {cpus} CPUs: ranks share cores")
    table = Table(title=f"Learner-group scaling: DQN learn_batch on {args.device}")
    for column in (
        "model",
        "params",
        "global batch",
        "ranks",
        "samples/s",
        "updates/s",
        "efficiency",
        "all-reduce share",
    ):
        table.add_column(column, justify="left" if column == "model" else "right")
    efficiency: dict[tuple[str, int], float] = {}
    lengths: list[str] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="learner-scaling-") as folder:
        for model in args.models:
            spec, plan = MODELS[model], plan_for(model, args)
            lengths.append(f"{model} {plan.updates} (after {plan.warmup} warm-up)")
            reference: float | None = None
            for world in args.ranks:
                name = f"{model}, {world} rank{'s' if world > 1 else ''}"
                try:
                    run = run_ranks(model, world, args.device, plan, args.timeout, Path(folder))
                except RunFailed as exc:
                    if table.row_count:
                        console.print(table)
                    sys.exit(f"{name}: {exc}")
                if world == 1:
                    reference = run.samples_per_s
                if reference is not None:
                    efficiency[model, world] = run.samples_per_s / (world * reference)
                if run.lost is not None and run.lost.others + run.lost.steal > BUSY_SHARE:
                    warnings.append(f"{name}: during the run, {run.lost}")
                if run.skipped_updates:
                    warnings.append(
                        f"{name}: {run.skipped_updates} updates skipped (non-finite loss)"
                    )
                first = world == args.ranks[0]
                table.add_row(
                    model if first else "",
                    f"{run.params:,}" if first else "",
                    f"{spec.batch}",
                    f"{world}",
                    f"{run.samples_per_s:,.0f}",
                    f"{run.updates_per_s:,.1f}",
                    f"{efficiency[model, world]:.2f}" if (model, world) in efficiency else "-",
                    f"{run.sync_share:.0%}" if world > 1 else "-",
                )
            table.add_section()
    console.print(table)
    for warning in warnings:
        console.print(f"[yellow]{warning}")
    console.print(
        f"The fastest of {args.repeats} timed window{'s' if args.repeats > 1 else ''} a run, "
        f"of {'; '.join(lengths)} updates. Efficiency: samples/s of N ranks / "
        "(N x samples/s of 1 rank). All-reduce share: time in "
        "waiting for the all-reduces after backward (AllReduceSync.wait_s) / time, mean "
        "over the ranks (waiting for the slower rank included)."
    )
    target = (
        f"Target: >= {TARGET_EFFICIENCY} efficiency at {TARGET_RANKS} ranks for the "
        f"compute-heavy model ({TARGET_MODEL}) on CPU"
    )
    reached = efficiency.get((TARGET_MODEL, TARGET_RANKS))
    if args.device != "cpu" or reached is None:
        console.print(f"{target}: not measured in this run.")
    else:
        verdict = "met" if reached >= TARGET_EFFICIENCY else "NOT met"
        console.print(f"{target}: {reached:.2f}, {verdict}.")


if __name__ == "__main__":
    main()
