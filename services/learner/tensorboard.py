"""The learner's TensorBoard scalars: `TrainBoard`, which a learn task's session feeds
with each update's (or round's) scalars and which writes a point every so many train
iterations (common/tensorboard.py writes the event files)."""

from __future__ import annotations

import math
import time

from common.storage import SharedStore
from common.tensorboard import ScalarLog, job_tb_dir


class TrainBoard:
    """The learner's TensorBoard scalars, in `<job_id>/tb/learner/`, against train_iter:
    the algorithm's own tags (`BatchReport.scalars`: each loss term, value estimates,
    entropy, KL, gradient norm, learning rate), each the mean over the updates since
    the last point; `train/updates_per_s` (since the last point),
    `train/samples_per_s` (items trained per second, all ranks), and
    `train/sample_wait_fraction` (of the time since the last point, the part spent
    waiting for samples rather than training), and `train/busy_fraction` (of the wall
    time since the last point, the part spent training: below 1, the learner waited
    on its feed, a publish or a checkpoint)."""

    def __init__(self, store: SharedStore, job_id: str, train_iter: int) -> None:
        self.log = ScalarLog(store, job_tb_dir(job_id, "learner"))
        self._since, self._iter = time.monotonic(), train_iter
        #: Seconds spent waiting for samples, and training, since the last point.
        self.wait_s = self.train_s = 0.0
        #: Per tag, the sum and count of its finite values since the last point.
        self._sums: dict[str, list[float]] = {}

    def add(
        self,
        train_iter: int,
        scalars: dict[str, float],
        rank_samples_per_s: list[float],
        *,
        every_iters: int,
    ) -> None:
        """Take one update's (or round's) `scalars`; write a point when `every_iters`
        train iterations passed since the last one."""
        for tag, value in scalars.items():
            if math.isfinite(value):
                total = self._sums.setdefault(tag, [0.0, 0])
                total[0] += value
                total[1] += 1
        if train_iter - self._iter < every_iters:
            return
        now = time.monotonic()
        busy = self.wait_s + self.train_s
        values: dict[str, float | None] = {tag: s / n for tag, (s, n) in self._sums.items()}
        values["train/updates_per_s"] = (train_iter - self._iter) / max(now - self._since, 1e-9)
        values["train/samples_per_s"] = sum(rank_samples_per_s)
        values["train/sample_wait_fraction"] = self.wait_s / busy if busy > 0 else None
        values["train/busy_fraction"] = min(1.0, self.train_s / max(now - self._since, 1e-9))
        self.log.scalars(train_iter, values)
        self._since, self._iter = now, train_iter
        self.wait_s = self.train_s = 0.0
        self._sums.clear()
