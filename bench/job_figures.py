"""What a finished job's files say about how it ran, for the benches that run jobs
through the services: the learner's busy fraction (its TensorBoard scalars,
`services/learner/tensorboard.py`), and the CPU its processes used, by role (the
data plane's: `DATA_PLANE`).

Usage::

    busy = learner_busy_fraction(job_dir)     # time in updates over wall time, or None
    with CpuSampler(proc.pid) as cpu:         # a `drover run` process
        proc.wait()
    data_plane_s = cpu.seconds(DATA_PLANE)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from common.tensorboard import job_tb_dir

#: The learner's scalar: of each interval between two points, the part spent training.
BUSY_TAG = "train/busy_fraction"


def learner_busy_fraction(job_dir: Path, *, skip_first: int = 1) -> float | None:
    """The learner's busy fraction over the job, weighted by each point's wall time:
    the mean of `train/busy_fraction` over its points but the first `skip_first` (the
    first covers the wait for `min_size_to_sample`, which no feed can shorten); None
    when the learner wrote none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = job_dir.parent / job_tb_dir(job_dir.name, "learner")
    if not folder.is_dir():
        return None
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    if BUSY_TAG not in events.Tags()["scalars"]:
        return None
    points = events.Scalars(BUSY_TAG)[skip_first:]
    if len(points) < 2:
        return None
    # Points come every so many train iterations: weigh each by the wall time it covers.
    total = busy = 0.0
    for before, point in zip(points, points[1:], strict=False):
        span = point.wall_time - before.wall_time
        total += span
        busy += span * point.value
    return busy / total if total > 0 else None


#: Roles (bench/memory.py role_of) that move a job's data rather than act or train: the
#: coordinator, its buffer processes and each learner's feeder process.
DATA_PLANE = ("coordinator", "services.buffer", "services.learner.feeder")


class ProcessCpu:
    """CPU seconds of the processes below `root_pid`, by role (bench/memory.py
    `role_of`: a service by its log file, a helper process by its module), from each
    process's newest reading (`read`): a process that exits loses what it spent since.
    `baseline` makes the processes running then count from that moment on (a cluster
    started before the work measured)."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        #: The newest reading of each process: (role, CPU seconds).
        self.readings: dict[int, tuple[str, float]] = {}
        self._before: dict[int, float] = {}

    def baseline(self) -> None:
        self.read()
        self._before = {pid: used for pid, (_, used) in self.readings.items()}

    def read(self, skip: Callable[[int], bool] | None = None) -> None:
        """Read every process below the root now, but those `skip` names."""
        from bench.memory import descendants, role_of
        from bench.procfs import cpu_s

        for pid in descendants(self.root_pid):
            if pid == self.root_pid or (skip is not None and skip(pid)):
                continue
            try:
                used = cpu_s(pid)
                role = role_of(pid, self.root_pid)
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
            if role:
                self.readings[pid] = (role, used)

    def seconds(self, prefixes: tuple[str, ...]) -> float:
        """CPU seconds of the processes whose role starts with one of `prefixes`."""
        return sum(
            used - self._before.get(pid, 0.0)
            for pid, (role, used) in self.readings.items()
            if role.startswith(prefixes)
        )


class CpuSampler(ProcessCpu):
    """`ProcessCpu` read every `interval_s` on a thread of its own, while a `with`
    block runs (a second's work at most goes unseen).

    Usage::

        with CpuSampler(proc.pid) as cpu:
            proc.wait()
        cpu.seconds(DATA_PLANE)     # CPU seconds of the coordinator, buffers and feeders
    """

    def __init__(self, root_pid: int, interval_s: float = 1.0) -> None:
        super().__init__(root_pid)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read()
