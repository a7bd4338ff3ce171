"""TensorBoard scalars of a job, written to its folder in the shared store.

Each writer owns one folder, `<job_id>/tb/<source>/` (the coordinator's and the
learner's), and writes event files with the `tensorboard` package's own writer: no
torch, so the coordinator can use it too. Writing never breaks what it watches: a
failure (a full disk, a folder gone) is logged once and the writer goes quiet.

    log = ScalarLog(store, job_tb_dir(job_id, "learner"))
    log.scalars(train_iter, {"loss/td": 0.3, "train/updates_per_s": 41.0})
    log.close()  # flushes; later writes are ignored
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Mapping

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from common.storage import SharedStore, check_name

log = logging.getLogger(__name__)

#: Seconds between flushes of buffered events to disk (close flushes the rest).
FLUSH_S = 5.0


def job_tb_dir(job_id: str, source: str) -> str:
    """The root-relative folder of a job's event files from `source`."""
    return f"{check_name(job_id, 'job id')}/tb/{check_name(source, 'source')}"


class ScalarLog:
    """Scalar events in one folder under the shared root; thread-safe; its folder and
    event file are made at the first write."""

    def __init__(self, store: SharedStore, rel: str, *, flush_s: float = FLUSH_S) -> None:
        self._store = store
        self._rel = rel
        self._flush_s = flush_s
        self._lock = threading.Lock()
        self._writer: EventFileWriter | None = None
        #: Closed by `close`, or silenced by a failure: nothing more is written.
        self._done = False

    def scalars(
        self, step: int, values: Mapping[str, float | None], *, wall_time: float | None = None
    ) -> None:
        """Write `values` (tag to value) at `step`; a None or non-finite value is left out.

        Args:
            step: the x axis: env steps for the coordinator, train_iter for the learner.
            wall_time: seconds since the epoch (now when None).
        """
        kept = [
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in values.items()
            if value is not None and math.isfinite(value)
        ]
        if kept:
            self._add(step, kept, wall_time)

    def animation(self, step: int, tag: str, gif: bytes, *, width: int, height: int) -> None:
        """An animated GIF at `step`: TensorBoard's images tab plays it (what torch's
        `add_video` writes)."""
        image = summary_pb2.Summary.Image(
            height=height, width=width, colorspace=3, encoded_image_string=gif
        )
        self._add(step, [summary_pb2.Summary.Value(tag=tag, image=image)], None)

    def _add(
        self, step: int, values: list[summary_pb2.Summary.Value], wall_time: float | None
    ) -> None:
        event = event_pb2.Event(
            wall_time=time.time() if wall_time is None else wall_time,
            step=int(step),
            summary=summary_pb2.Summary(value=values),
        )
        with self._lock:
            if self._done:
                return
            try:
                if self._writer is None:
                    folder = self._store.resolve(self._rel)
                    folder.mkdir(parents=True, exist_ok=True)
                    self._writer = EventFileWriter(str(folder), flush_secs=self._flush_s)
                self._writer.add_event(event)
            except Exception as exc:  # OSError, or one the writer's thread kept
                self._fail(exc)

    def flush(self) -> None:
        with self._lock:
            if self._writer is not None and not self._done:
                try:
                    self._writer.flush()
                except Exception as exc:
                    self._fail(exc)

    def close(self) -> None:
        """Flush and close; later writes are ignored. Safe to call more than once."""
        with self._lock:
            writer, self._writer = self._writer, None
            self._done = True
            if writer is not None:
                try:
                    writer.close()
                except Exception as exc:
                    log.warning("tensorboard events in %s not all written: %s", self._rel, exc)

    def _fail(self, exc: Exception) -> None:
        log.warning("tensorboard events in %s stop: %s", self._rel, exc)
        self._done = True
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):  # already reported
                writer.close()
