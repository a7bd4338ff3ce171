"""A buffer's snapshots on the shared store: a chain of a whole cut and the deltas
written after it, named by a `state.json` beside them with a record of its owner's.

    <folder>/state.json                          the owner's record + the chain
    <folder>/buffer-<generation>.safetensors     the buffer's arrays (a cut)
    <folder>/delta-<generation>-<n>.safetensors  what changed after it

The coordinator keeps the chain of a buffer it hosts in `<job>/coordinator/` with the
job's record; a buffer process, that of its shard in `<job>/buffer-<shard>/` with the
shard's. Most snapshots write only what changed since the last one: a delta file, then
`state.json` naming the cut and every delta after it (each with its digest). Once the
deltas add up to the cut's size, the next snapshot is a whole new cut, and the files
of the old chain are removed after `state.json` names the new one. Every write is
atomic, and a file is removed only once no `state.json` names it, so a crash at any
point leaves a `state.json` whose files all exist.

    chain = SnapshotChains(store)
    hold_s = chain.write(folder, buffer, at_cut=lambda: record)   # each period
    saved = read_chain(store, folder)                              # after a restart
    buffer.restore_snapshot(*saved.cut, deltas=saved.deltas)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.storage import SharedStore
from services.buffer.core import BufferSnapshot, ReplayBuffer

STATE = "state.json"
FORMAT_VERSION = 1
#: A new whole cut is written once the deltas after the last one add up to this many
#: times its size: snapshots then write about twice what changed, and a restore reads
#: at most about twice a cut.
COMPACT_AT = 1.0
#: ... or once this many deltas follow it (a buffer that barely changes).
MAX_DELTAS = 1000


def cut_path(folder: str, gen: int) -> str:
    return f"{folder}/buffer-{gen:010d}.safetensors"


def delta_path(folder: str, gen: int, n: int) -> str:
    return f"{folder}/delta-{gen:010d}-{n:06d}.safetensors"


@dataclass
class SnapshotChain:
    """A buffer's snapshot on disk: a cut and the deltas written after it."""

    generation: int
    cut_file: str
    cut_meta: dict[str, Any]
    cut_bytes: int
    #: Each delta's file and buffer record, oldest first.
    deltas: list[dict[str, Any]] = field(default_factory=list)
    delta_bytes: int = 0
    #: The owner's and the buffer's records last written (unchanged: none is written).
    last_written: tuple[dict[str, Any], dict[str, Any]] | None = None


@dataclass(frozen=True)
class SavedChain:
    """A buffer's newest snapshot, read back."""

    record: dict[str, Any]
    cut: tuple[bytes, dict[str, Any]]
    #: The deltas after the cut, oldest first: (arrays, buffer record) each.
    deltas: list[tuple[bytes, dict[str, Any]]]


def write_state(
    store: SharedStore, folder: str, record: dict[str, Any], chain: SnapshotChain
) -> None:
    """`state.json`: the owner's record and the chain it restores from."""
    store.write_json(
        f"{folder}/{STATE}",
        {
            "format": FORMAT_VERSION,
            "job": record,
            "buffer": chain.cut_meta,
            "buffer_file": chain.cut_file,
            "deltas": chain.deltas,
        },
    )


def read_chain(store: SharedStore, folder: str) -> SavedChain:
    """The newest snapshot in `folder`: its record, the cut and the deltas after it."""
    state = store.read_json(f"{folder}/{STATE}")
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{folder}: snapshot format {state.get('format')} is not supported")
    return SavedChain(
        record=state["job"],
        cut=(store.read_bytes(state["buffer_file"]), state["buffer"]),
        deltas=[(store.read_bytes(d["file"]), d["meta"]) for d in state.get("deltas", [])],
    )


def prune(store: SharedStore, folder: str, chain: SnapshotChain) -> None:
    """Remove the cut and delta files in `folder` that `chain` does not name."""
    keep = {chain.cut_file, *(d["file"] for d in chain.deltas)}
    for name in store.list_dir(folder):
        rel = f"{folder}/{name}"
        if name.startswith(("buffer-", "delta-")) and rel not in keep:
            store.delete(rel)


def remove(store: SharedStore, folder: str) -> None:
    """Remove a snapshot: `state.json` first, so no moment leaves it naming a removed
    arrays file."""
    store.delete(f"{folder}/{STATE}")
    for name in store.list_dir(folder):
        if name.startswith(("buffer-", "delta-")):
            store.delete(f"{folder}/{name}")


class SnapshotChains:
    """Writes each buffer's chain (one per folder), a delta at a time or a new cut."""

    def __init__(self, store: SharedStore, wall: Callable[[], float]) -> None:
        self.store = store
        self._wall = wall
        self._generation = 0
        self._chains: dict[str, SnapshotChain] = {}
        #: A new cut once the deltas after the last one add up to this many times its
        #: size (0: a whole cut every time).
        self.compact_at = COMPACT_AT
        self._lock = threading.Lock()

    def write(
        self,
        folder: str,
        buffer: ReplayBuffer,
        at_cut: Callable[[], dict[str, Any]],
        *,
        cut_lock: Any = None,
    ) -> float | None:
        """Write the buffer's delta, or a whole cut when the deltas since the last one
        add up to its size (or there is none to build on), with `at_cut()`'s record
        taken at the same instant. Returns the longest the locks were held, or None
        when nothing changed and nothing was written."""
        chain = self._chains.get(folder)
        try:
            if (
                chain is not None
                and len(chain.deltas) < MAX_DELTAS
                and chain.delta_bytes < chain.cut_bytes * self.compact_at
            ):
                change = buffer.delta(at_cut, cut_lock=cut_lock)
                if change is not None:
                    return self._write_delta(folder, chain, change)
            return self._write_cut(folder, buffer, at_cut, cut_lock)
        except BaseException:
            # What the failed snapshot took from the buffer's change log is not on disk:
            # the next one must be a whole cut.
            self._chains.pop(folder, None)
            raise

    def forget(self, keep: set[str]) -> None:
        """Let go of the chains of folders not in `keep` (their buffers are gone)."""
        for folder in [f for f in self._chains if f not in keep]:
            del self._chains[folder]

    def _write_cut(
        self, folder: str, buffer: ReplayBuffer, at_cut: Callable[[], Any], cut_lock: Any
    ) -> float:
        taken = buffer.cut(at_cut, cut_lock=cut_lock)
        record = taken.at_cut
        assert record is not None
        with self._lock:
            # Generations only grow, also across restarts: never reuse a file name.
            self._generation = max(self._generation + 1, int(self._wall() * 1000))
            generation = self._generation
        chain = SnapshotChain(
            generation=generation,
            cut_file=cut_path(folder, generation),
            cut_meta=taken.meta,
            cut_bytes=len(taken.data),
        )
        self.store.write_bytes(chain.cut_file, taken.data)
        hold_s = taken.longest_lock_hold_s
        del taken  # its bytes are reused by the next cut once let go
        write_state(self.store, folder, record, chain)
        prune(self.store, folder, chain)
        self._chains[folder] = chain
        return hold_s

    def _write_delta(
        self, folder: str, chain: SnapshotChain, change: BufferSnapshot[dict[str, Any]]
    ) -> float | None:
        record, meta = change.at_cut, change.meta
        assert record is not None
        unchanged = {k: v for k, v in meta.items() if k not in ("arrays_sha256", "changed")}
        if not meta["changed"] and chain.last_written == (record, unchanged):
            return None  # nothing happened since the last snapshot: nothing to write
        rel = delta_path(folder, chain.generation, len(chain.deltas))
        self.store.write_bytes(rel, change.data)
        chain.deltas.append({"file": rel, "meta": meta})
        chain.delta_bytes += len(change.data)
        write_state(self.store, folder, record, chain)
        chain.last_written = (record, unchanged)
        return change.longest_lock_hold_s
