"""Peak memory of a whole `drover run examples/cartpole_dqn.yaml`: PSS of every process
it starts (the launcher, the coordinator, the collectors, the learner, and whatever
those start), sampled together.

    python bench/memory.py [--runs 1] [--interval-s 0.1] [--config examples/cartpole_dqn.yaml]

PSS (proportional set size, /proc/<pid>/smaps_rollup) counts a page shared by n
processes as 1/n in each, so the sum over processes is what the run takes from the
machine: libraries mapped by all of them and pages a fork shares count once. The
process tree of the `drover run` command is walked every `--interval-s`; each sample
sums PSS by role (a service is known by its log file, which is its stdout) and in
total. The table shows each role's peak and the peak of the total (the roles' peaks
need not fall in the same sample, so the total's peak is at most their sum).

Timings and sizes vary with machine load; compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "examples" / "cartpole_dqn.yaml"

#: A service's stdout is its log file, `<run dir>/logs/<service name>.log`.
_LOG_RE = re.compile(r"/logs/([\w.-]+)\.log$")


def children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from /proc/<pid>/stat (ppid is its 4th field)."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces and parentheses: split after it.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(root_pid: int) -> list[int]:
    """`root_pid` and every process below it."""
    tree = children_by_parent()
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += tree.get(pid, [])
    return found


def pss_kb(pid: int) -> int | None:
    """The process's PSS in kB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


#: Processes a service starts that write to its log, shown as roles of their own.
HELPERS = ("services.buffer", "services.learner.feeder")


def role_of(pid: int, root_pid: int) -> str:
    """The service a process belongs to (its log file), else what its command says; a
    service's helper processes (`HELPERS`) by their module."""
    if pid == root_pid:
        return "launcher"
    module = None
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        command = " ".join(a.decode(errors="replace") for a in argv if a)
        match = re.search(r"-m (\S+)", command)
        module = match.group(1) if match else Path(argv[0].decode(errors="replace")).name
    if module in HELPERS:
        return module
    with contextlib.suppress(OSError):
        match = _LOG_RE.search(os.readlink(f"/proc/{pid}/fd/1"))
        if match:
            return match.group(1)
    return module or "?"


@dataclass
class PssSampler:
    """Samples the PSS of a process tree in a thread until `stop()`.

    Also notes when each process was last seen (`last_seen_s`, on the clock of
    `time.monotonic()`), for timelines."""

    root_pid: int
    interval_s: float = 0.1
    #: False: only note which processes are there (a cheap, fine-grained timeline).
    read_pss: bool = True
    peak_kb: dict[str, int] = field(default_factory=dict)
    peak_total_kb: int = 0
    #: Each role's PSS in the sample whose total was the peak, and when (monotonic).
    at_peak_kb: dict[str, int] = field(default_factory=dict)
    at_peak_s: float = 0.0
    samples: int = 0
    last_seen_s: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> PssSampler:
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        by_role: dict[str, int] = {}
        now = time.monotonic()
        for pid in descendants(self.root_pid):
            kb = pss_kb(pid) if self.read_pss else 0
            if kb is None:
                continue
            # Asked at every sample: a process may be seen between its fork and its
            # exec (with its parent's command), or between a fork server's fork and
            # the redirection of its stdout to its log.
            role = role_of(pid, self.root_pid)
            if not role:
                continue  # exited, not yet waited for: it holds no memory
            by_role[role] = by_role.get(role, 0) + kb
            self.last_seen_s[role] = now
        for role, kb in by_role.items():
            self.peak_kb[role] = max(self.peak_kb.get(role, 0), kb)
        if sum(by_role.values()) > self.peak_total_kb:
            self.peak_total_kb = sum(by_role.values())
            self.at_peak_kb, self.at_peak_s = by_role, now
        self.samples += 1


def measure(config: Path, work: Path, interval_s: float) -> tuple[PssSampler, int, float, float]:
    """One `drover run config`, its process tree sampled; returns the sampler, the
    command's exit code, its wall time and when it started (monotonic)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "drover", "run", str(config), "--runs-dir", str(work)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sampler = PssSampler(proc.pid, interval_s).start()
    try:
        code = proc.wait(timeout=600)
    finally:
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
    return sampler, code, time.monotonic() - started, started


def role_order(role: str) -> tuple[int, str]:
    first = ("launcher", "drover.forkserver", "coordinator")
    return (first.index(role) if role in first else len(first), role)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--config", type=Path, default=EXAMPLE)
    parser.add_argument("--json", type=Path, help="also write the peak total PSS here")
    args = parser.parse_args()
    console = Console(width=150)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            runs.append(measure(args.config, Path(tmp) / f"run{i}", args.interval_s))
    roles = sorted({r for sampler, *_ in runs for r in sampler.peak_kb}, key=role_order)
    table = Table(title=f"peak PSS (MB) of `drover run {args.config.name}`, every process")
    table.add_column("run", justify="right")
    for role in roles:
        table.add_column(role, justify="right")
    table.add_column("total (peak of sums)", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("samples", justify="right")
    for i, (sampler, code, wall_s, started) in enumerate(runs):
        run = str(i) + ("" if code == 0 else f" (exit {code})")
        table.add_row(
            f"{run} peak each",
            *(f"{sampler.peak_kb.get(r, 0) / 1024:.0f}" for r in roles),
            f"[bold]{sampler.peak_total_kb / 1024:.0f}[/]",
            f"{wall_s:.1f}",
            str(sampler.samples),
        )
        table.add_row(
            f"{run} at {sampler.at_peak_s - started:.1f} s",
            *(f"{sampler.at_peak_kb.get(r, 0) / 1024:.0f}" for r in roles),
            f"{sampler.peak_total_kb / 1024:.0f}",
            "",
            "",
        )
    console.print(table)
    console.print(
        "each run: its roles' own peaks, then the sample whose total was the peak "
        "(seconds after the command started)"
    )
    from bench.results import write_figures

    write_figures(
        args.json,
        "memory",
        {"peak_pss_mb": [sampler.peak_total_kb / 1024 for sampler, *_ in runs]},
    )


if __name__ == "__main__":
    main()
