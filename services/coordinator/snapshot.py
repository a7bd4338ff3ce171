"""The coordinator's records: each job's in its own folder of the shared root.

    <job_id>/coordinator/record.json     the job's record, written at once on submission
                                         and on every phase change, and every few
                                         seconds while it runs when it changed

`record.json` makes what the coordinator answers durable before it answers: a job
answered `201` exists after any crash, and a job that ended stays ended (its segments
are deleted only after its terminal record is on disk). The job's buffer is its buffer
processes' to snapshot (services/buffer/chain.py, in `<job_id>/buffer-<shard>/`).

An older coordinator that hosted buffers itself left `state.json` (the job's record and
the buffer's) and the chain of its cut and deltas in `<job_id>/coordinator/`: a restart
reads that record where it is the newer one, a buffer process restores that chain, and
an ended job's is removed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from common.messages import EvalSummary, PolicyRef, dump, parse
from common.process import yield_to_requests
from common.storage import SharedStore
from common.storage_full import WriteFailures
from services.buffer import chain

log = logging.getLogger(__name__)

STATE = "coordinator/state.json"
RECORD = "coordinator/record.json"
FORMAT_VERSION = 1


def state_path(job_id: str) -> str:
    return f"{job_id}/{STATE}"


def record_path(job_id: str) -> str:
    """The job's record alone (no buffer): small, so it is written synchronously
    whenever the job's existence or phase changes, before that change is answered."""
    return f"{job_id}/{RECORD}"


def write_job_record(store: SharedStore, job_id: str, record: dict[str, Any]) -> None:
    store.write_json(record_path(job_id), {"format": FORMAT_VERSION, "job": record})


def read_job_record(store: SharedStore, job_id: str) -> dict[str, Any] | None:
    """The job's durable record, or None when it has none."""
    if not store.exists(record_path(job_id)):
        return None
    state = store.read_json(record_path(job_id))
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{job_id}: record format {state.get('format')} is not supported")
    return state["job"]


def snapshot_folder(job_id: str) -> str:
    """Where the coordinator keeps the snapshot of a buffer it hosts (services/buffer/
    chain.py's layout, its `state.json` holding the job's record)."""
    return f"{job_id}/coordinator"


def remove_job_snapshot(store: SharedStore, job_id: str) -> None:
    """Remove a job's snapshot (an ended job's record is all that is kept of it)."""
    chain.remove(store, snapshot_folder(job_id))


def read_job_snapshot(store: SharedStore, job_id: str) -> chain.SavedChain:
    """A job's newest snapshot: its record, its buffer's cut and the deltas after it."""
    return chain.read_chain(store, snapshot_folder(job_id))


def eval_from(data: dict | None) -> EvalSummary | None:
    return parse(EvalSummary, data) if data is not None else None


def policy_from(data: dict | None) -> PolicyRef | None:
    return parse(PolicyRef, data) if data is not None else None


def as_record(value: Any) -> Any:
    return dump(value) if value is not None else None


class Snapshotter:
    """Snapshots every job every `period_s` seconds and once more at shutdown."""

    def __init__(self, core: Any, period_s: float) -> None:
        self.core = core
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="snapshot", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.core.snapshot_jobs()  # the final one, after the loop stopped

    def _loop(self) -> None:
        yield_to_requests()
        failures = WriteFailures(log, "snapshot failed; the previous one stays in place")
        while not self._stop.wait(self.period_s):
            try:
                self.core.snapshot_jobs()
            except Exception as exc:
                failures.report(exc)
