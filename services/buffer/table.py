"""The item table: a fixed number of slots with per-item columns, free slots, and the
order in which items arrived.

An item's key encodes its slot (``key = counter << SLOT_BITS | slot``), so a key sent
back by a learner (a priority update) is found in O(1) and recognised as stale
once its slot holds another item. A table that is shard `k` of `n` (one of a job's
buffer processes) numbers its items ``counter * n + k``: every key of a job is then
unique, and `shard_of` tells which shard holds it. A free slot's key is negative and
says when it was freed (-1: never used; ``-1 - k``: the k-th slot freed), so the key
column alone determines the free list and the arrival order (`restore` derives both
from it).

Every change to a column goes through `write`, which first appends the values it
overwrites to each open journal: a snapshot opens one at its cut, copies the columns
without the lock, and undoes the journal on the copy (see `ReplayBuffer.cut`). Once
`record_changes` is called, `write` also keeps what it writes, until `take_changes`:
what a snapshot of only the changes since the last one saves (`ReplayBuffer.delta`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

SLOT_BITS = 26  # up to 67M slots; keys stay below 2^63 for 2^37 inserted items
SLOT_MASK = (1 << SLOT_BITS) - 1

COLUMNS = ("key", "segment", "row", "length", "version", "uses", "priority")

#: One column write, as `write` made it: (column, index, the values it overwrote).
JournalEntry = tuple[str, "np.ndarray | slice", np.ndarray]


def undo(journal: list[JournalEntry], columns: dict[str, np.ndarray]) -> None:
    """Undo a journal's writes on copies of the columns, last to first."""
    for column, index, overwritten in reversed(journal):
        columns[column][index] = overwritten


def squash(changes: list[JournalEntry], capacity: int) -> dict[str, np.ndarray]:
    """A change log as arrays: per column, the slots written and each one's last value
    (`<column>.slots`, `<column>.values`), so a slot written many times costs once."""
    by_column: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for column, index, values in changes:
        # A slice's slots, without building every slot number of the table first.
        slots = np.arange(*index.indices(capacity)) if isinstance(index, slice) else index
        indexes, written = by_column.setdefault(column, ([], []))
        # An entry's values are what its index read (`ItemTable.write`): already one per
        # slot, in the same shape. Only a scalar index needs a shape (a log of thousands
        # of small writes pays per call made here).
        if slots.ndim != 1:
            slots, values = slots.reshape(-1), np.reshape(values, -1)
        indexes.append(slots)
        written.append(values)
    arrays = {}
    for column, (indexes, written) in by_column.items():
        slots, values = np.concatenate(indexes), np.concatenate(written)
        # The last write of each slot wins: unique over the reversed log.
        last, first_in_reversed = np.unique(slots[::-1], return_index=True)
        arrays[f"{column}.slots"] = last
        arrays[f"{column}.values"] = values[::-1][first_in_reversed]
    return arrays


def apply_changes(columns: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
    """Write `squash`ed changes into `columns` (arrays by column name)."""
    for name, slots in arrays.items():
        column, _, part = name.rpartition(".")
        if part == "slots" and column in columns:
            columns[column][slots] = arrays[f"{column}.values"]


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """The shard that holds each key, of a job's `shards`."""
    return (np.asarray(keys, dtype=np.int64) >> SLOT_BITS) % shards


class ItemTable:
    def __init__(self, capacity: int, *, shard: int = 0, shards: int = 1) -> None:
        if capacity > SLOT_MASK:
            raise ValueError(f"capacity {capacity} exceeds {SLOT_MASK}")
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} of {shards}")
        self.capacity = capacity
        self.shard, self.shards = shard, shards
        self._columns = {
            "key": np.full(capacity, -1, dtype=np.int64),  # < 0: a free slot
            "segment": np.zeros(capacity, dtype=np.int64),
            "row": np.zeros(capacity, dtype=np.int32),
            "length": np.ones(capacity, dtype=np.int32),
            "version": np.zeros(capacity, dtype=np.int32),
            "uses": np.zeros(capacity, dtype=np.int32),
            "priority": np.ones(capacity, dtype=np.float64),
        }
        # What readers see: read-only views, so a write anywhere but `write` raises.
        self.key = _read_only(self._columns["key"])
        self.segment = _read_only(self._columns["segment"])
        self.row = _read_only(self._columns["row"])
        self.length = _read_only(self._columns["length"])
        self.version = _read_only(self._columns["version"])
        self.uses = _read_only(self._columns["uses"])
        self.priority = _read_only(self._columns["priority"])
        self._journals: list[list[JournalEntry]] = []
        #: What `write` wrote since `record_changes` or the last `take_changes` (None:
        #: not recorded), and about how many bytes that is.
        self._changes: list[JournalEntry] | None = None
        self._changes_bytes = 0
        #: The change log outgrew `max_changes_bytes` and was dropped.
        self.changes_lost = False
        self.max_changes_bytes = max(32 << 20, 8 * capacity)
        self.size = 0
        self.counter = 0
        self._freed = 0  # slots freed so far: the next one freed gets key -2 - _freed
        # Free slots as a stack; popping from the end hands out 0, 1, 2, ... first.
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self._free_count = capacity
        # Arrival order: a ring of (slot, key); an entry whose slot now holds another key
        # (or none) is dead and skipped. Positions are absolute; index = pos % capacity.
        self._ring_slot = np.zeros(capacity, dtype=np.int64)
        self._ring_key = np.full(capacity, -1, dtype=np.int64)
        self._head = 0
        self._tail = 0

    # --- columns -------------------------------------------------------------------

    def write(self, column: str, index: np.ndarray | slice, values: Any) -> None:
        """Set `column[index] = values`: the only way a column changes (a repeated index
        keeps its last value, as numpy assigns)."""
        array = self._columns[column]
        if self._journals:
            if isinstance(index, slice):
                entry = (column, index, array[index].copy())
            else:
                entry = (column, np.array(index, dtype=np.int64), array[index])
            for journal in self._journals:
                journal.append(entry)
        array[index] = values
        if self._changes is not None:
            if isinstance(index, slice):
                change = (column, index, array[index].copy())
            else:
                change = (column, np.array(index, dtype=np.int64), array[index])
            self._changes.append(change)
            self._changes_bytes += change[2].nbytes * 2
            if self._changes_bytes > self.max_changes_bytes:
                # Too much to keep: the next snapshot saves the whole table instead.
                self._changes, self._changes_bytes, self.changes_lost = None, 0, True

    def record_changes(self) -> None:
        """Keep what `write` writes from now on (dropping what was kept so far)."""
        self._changes, self._changes_bytes, self.changes_lost = [], 0, False

    def take_changes(self) -> list[JournalEntry] | None:
        """What was written since `record_changes` or the last call, and start anew
        (None: nothing was recorded, or too much, so it was dropped)."""
        changes = self._changes
        if changes is not None:
            self._changes, self._changes_bytes = [], 0
        return changes

    def open_journal(self) -> list[JournalEntry]:
        """From now on, each column write first appends what it overwrites to the
        returned list: undoing the list's entries last to first on a copy of the columns
        made meanwhile gives the columns as they were when it was opened."""
        journal: list[JournalEntry] = []
        self._journals.append(journal)
        return journal

    def close_journal(self, journal: list[JournalEntry]) -> None:
        self._journals = [j for j in self._journals if j is not journal]

    # --- slots ---------------------------------------------------------------------

    @property
    def free_count(self) -> int:
        return self._free_count

    def add(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Allocate `n` free slots for new items; returns (slots, keys)."""
        if n > self._free_count:
            raise ValueError(f"{n} slots wanted, {self._free_count} free")
        slots = self._free[self._free_count - n : self._free_count][::-1].copy()
        self._free_count -= n
        numbers = (self.counter + np.arange(n, dtype=np.int64)) * self.shards + self.shard
        keys = (numbers << SLOT_BITS) | slots
        self.counter += n
        self.write("key", slots, keys)
        self.write("uses", slots, 0)
        self.size += n
        self._push_order(slots, keys)
        return slots, keys

    def remove(self, slots: np.ndarray) -> None:
        """Free live slots (their ring entries die with their keys)."""
        n = len(slots)
        # Pushed in this order: their keys record it, for `restore` to find again.
        self.write("key", slots, -2 - (self._freed + np.arange(n, dtype=np.int64)))
        self._freed += n
        self._free[self._free_count : self._free_count + n] = slots
        self._free_count += n
        self.size -= n

    def slots_of(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots of the keys still live, and a mask of which keys those are."""
        keys = np.asarray(keys, dtype=np.int64)
        slots = keys & SLOT_MASK
        live = (keys >= 0) & (slots < self.capacity)
        live[live] = self.key[slots[live]] == keys[live]
        return slots[live], live

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.key >= 0)

    # --- arrival order ---------------------------------------------------------------

    def _push_order(self, slots: np.ndarray, keys: np.ndarray) -> None:
        if self._tail - self._head + len(slots) > self.capacity:
            self._skip_dead_head()
        if self._tail - self._head + len(slots) > self.capacity:
            self._compact()  # dead entries in the middle (max_use, staleness, lifo)
        pos = (self._tail + np.arange(len(slots))) % self.capacity
        self._ring_slot[pos] = slots
        self._ring_key[pos] = keys
        self._tail += len(slots)

    def _skip_dead_head(self) -> None:
        """Drop dead entries at the old end (what FIFO eviction leaves behind)."""
        window = 1024
        while self._head < self._tail:
            pos = np.arange(self._head, min(self._tail, self._head + window))
            alive = self._alive(pos)
            if alive.any():
                self._head += int(np.argmax(alive))
                return
            self._head += len(pos)
            window *= 2

    def _compact(self) -> None:
        pos = np.arange(self._head, self._tail) % self.capacity
        alive = self.key[self._ring_slot[pos]] == self._ring_key[pos]
        slots, keys = self._ring_slot[pos][alive], self._ring_key[pos][alive]
        self._ring_slot[: len(slots)] = slots
        self._ring_key[: len(keys)] = keys
        self._head, self._tail = 0, len(slots)

    def _alive(self, pos: np.ndarray) -> np.ndarray:
        idx = pos % self.capacity
        return self.key[self._ring_slot[idx]] == self._ring_key[idx]

    def _scan(self, n: int, *, newest: bool) -> np.ndarray:
        """Up to `n` live slots from one end of the arrival order, in windows that
        double; dead entries at that end are dropped for good on the way."""
        found: list[np.ndarray] = []
        got, window = 0, max(64, 2 * n)
        pos = self._tail if newest else self._head
        while got < n and self._head < self._tail:
            if newest:
                if pos <= self._head:
                    break
                window_pos = np.arange(max(self._head, pos - window), pos)[::-1]
            else:
                if pos >= self._tail:
                    break
                window_pos = np.arange(pos, min(self._tail, pos + window))
            alive = self._alive(window_pos)
            if got == 0:
                lead = int(np.argmax(alive)) if alive.any() else len(window_pos)
                if newest:
                    self._tail = pos - lead
                else:
                    self._head = pos + lead
            take = window_pos[alive][: n - got]
            found.append(self._ring_slot[take % self.capacity])
            got += len(take)
            pos = int(window_pos[-1]) if newest else int(window_pos[-1]) + 1
            window *= 2
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def oldest(self, n: int) -> np.ndarray:
        """Up to `n` live slots, oldest first."""
        return self._scan(n, newest=False)

    def newest(self, n: int) -> np.ndarray:
        """Up to `n` live slots, newest first."""
        return self._scan(n, newest=True)

    # --- persistence -----------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        return {"size": self.size, "counter": self.counter, "freed": self._freed}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, int]) -> None:
        """Load the columns and counters; the free list and the arrival order are
        derived from the keys. Arrays of the first format (which saved the free list
        as "free") are read too.

        Raises:
            ValueError: the keys do not agree with the saved size.
        """
        for name in COLUMNS:
            self.write(name, slice(None), arrays[name])
        if "free" in arrays:
            # The saved stack, bottom first: its order goes into the keys, as `remove`
            # would have written it.
            free = np.asarray(arrays["free"], dtype=np.int64)
            self.write("key", free, -2 - np.arange(len(free), dtype=np.int64))
            freed = len(free)
        else:
            freed = int(counters["freed"])
        key = self.key
        free = np.flatnonzero(key < 0)
        # A stack holds its slots in the order they were pushed: never-used slots first
        # (the highest at the bottom), then freed ones in the order they were freed.
        free = free[np.lexsort((-free, -key[free]))]
        live = np.flatnonzero(key >= 0)
        live = live[np.argsort(key[live], kind="stable")]  # keys grow with arrival
        if len(live) != int(counters["size"]):
            raise ValueError(f"{len(live)} live keys, but a size of {counters['size']}")
        self._free[: len(free)] = free
        self._free_count = len(free)
        self._ring_slot[: len(live)] = live
        self._ring_key[: len(live)] = key[live]
        self._head, self._tail = 0, len(live)
        self.size, self.counter, self._freed = len(live), int(counters["counter"]), freed
