"""The item table: a fixed number of slots with per-item columns, free slots, and the
order in which items arrived.

An item's key encodes its slot (``key = counter << SLOT_BITS | slot``), so a key sent
back by a learner (a priority update) is found in O(1) and recognised as stale
once its slot holds another item.
"""

from __future__ import annotations

import numpy as np

SLOT_BITS = 26  # up to 67M slots; keys stay below 2^63 for 2^37 inserted items
SLOT_MASK = (1 << SLOT_BITS) - 1

COLUMNS = ("key", "segment", "row", "length", "version", "uses", "priority")


class ItemTable:
    def __init__(self, capacity: int) -> None:
        if capacity > SLOT_MASK:
            raise ValueError(f"capacity {capacity} exceeds {SLOT_MASK}")
        self.capacity = capacity
        self.key = np.full(capacity, -1, dtype=np.int64)  # -1: free slot
        self.segment = np.zeros(capacity, dtype=np.int64)
        self.row = np.zeros(capacity, dtype=np.int32)
        self.length = np.ones(capacity, dtype=np.int32)
        self.version = np.zeros(capacity, dtype=np.int32)
        self.uses = np.zeros(capacity, dtype=np.int32)
        self.priority = np.ones(capacity, dtype=np.float64)
        self.size = 0
        self.counter = 0
        # Free slots as a stack; popping from the end hands out 0, 1, 2, ... first.
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int64)
        self._free_count = capacity
        # Arrival order: a ring of (slot, key); an entry whose slot now holds another key
        # (or none) is dead and skipped. Positions are absolute; index = pos % capacity.
        self._ring_slot = np.zeros(capacity, dtype=np.int64)
        self._ring_key = np.full(capacity, -1, dtype=np.int64)
        self._head = 0
        self._tail = 0

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
        keys = ((self.counter + np.arange(n, dtype=np.int64)) << SLOT_BITS) | slots
        self.counter += n
        self.key[slots] = keys
        self.uses[slots] = 0
        self.size += n
        self._push_order(slots, keys)
        return slots, keys

    def remove(self, slots: np.ndarray) -> None:
        """Free live slots (their ring entries die with their keys)."""
        self.key[slots] = -1
        self._free[self._free_count : self._free_count + len(slots)] = slots
        self._free_count += len(slots)
        self.size -= len(slots)

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

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {name: getattr(self, name) for name in COLUMNS}
        arrays["free"] = self._free[: self._free_count]
        pos = np.arange(self._head, self._tail) % self.capacity
        arrays["order_slot"] = self._ring_slot[pos]
        arrays["order_key"] = self._ring_key[pos]
        return arrays

    def counters(self) -> dict[str, int]:
        return {"size": self.size, "counter": self.counter}

    def restore(self, arrays: dict[str, np.ndarray], counters: dict[str, int]) -> None:
        for name in COLUMNS:
            getattr(self, name)[:] = arrays[name]
        free = arrays["free"]
        self._free[: len(free)] = free
        self._free_count = len(free)
        order_slot, order_key = arrays["order_slot"], arrays["order_key"]
        self._ring_slot[: len(order_slot)] = order_slot
        self._ring_key[: len(order_key)] = order_key
        self._head, self._tail = 0, len(order_slot)
        self.size, self.counter = int(counters["size"]), int(counters["counter"])
