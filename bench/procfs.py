"""What Linux's /proc says about another process, for the benches that count the CPU
their services spend."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far."""
    # The command name in parentheses may hold spaces: the fields follow the last ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_sched_s(pid: int, tid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) thread `tid` of process
    `pid` has had so far: the scheduler's own count (/proc/.../schedstat), which tells a
    thread kept off the CPUs by other work from one that blocked (on a lock, a queue,
    a socket)."""
    on_cpu_ns, waiting_ns, _slices = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
    return int(on_cpu_ns) / 1e9, int(waiting_ns) / 1e9


def threads_of(pid: int) -> list[int]:
    """The thread ids of process `pid` now."""
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def window_shares(
    before: tuple[float, float], after: tuple[float, float], seconds: float
) -> tuple[float, float]:
    """A thread's shares of a window of `seconds` between two `thread_sched_s` counts:
    on a CPU, and runnable but waiting for one (the rest it was blocked)."""
    return (after[0] - before[0]) / seconds, (after[1] - before[1]) / seconds


def shares_text(on_cpu: float, waiting: float) -> str:
    """A thread's shares as "on a CPU, waiting for one, blocked" percentages."""
    return f"{on_cpu:.0%}, {waiting:.0%}, {max(0.0, 1 - on_cpu - waiting):.0%}"
