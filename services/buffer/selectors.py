"""Samplers and removers as values, in the manner of Reverb's item selectors.

A sampler decides which live items a sample request gets (and their importance
weights); a remover decides which items leave when the table is full. Both work on
the `ItemTable`'s slots with vectorized numpy, never a per-item Python loop.

    sampler = make_sampler(config)         # uniform | prioritized | fifo
    remover = make_remover(config)         # fifo | lifo | uniform
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from common.config import ReplayBufferConfig
from services.buffer.sumtree import SumTree
from services.buffer.table import ItemTable


class Sampler(Protocol):
    #: Items leave the table once sampled (an on-policy queue).
    consumes: bool

    def inserted(self, slots: np.ndarray) -> None: ...

    def removed(self, slots: np.ndarray) -> None: ...

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None: ...

    #: Sampled batches so far (prioritized replay anneals beta over them).
    batches_drawn: int

    def sample(
        self, n: int, table: ItemTable, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """`n` slots and their importance weights (the caller counts batches)."""
        ...

    def available(self, table: ItemTable) -> int:
        """How many items one request may take (a queue cannot repeat items)."""
        ...

    def mass(self, table: ItemTable) -> float:
        """What a draw over a job's shards weighs this one by (sharding.py): the sum
        of its items' sampling weights."""
        ...

    def weight_scale(self) -> tuple[float, float]:
        """(w, beta): the importance weights drawn now are (weight / w)^-beta, for a
        draw over shards to renormalize by the smallest w of all."""
        ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any], table: ItemTable) -> None: ...


class PrioritizedSampler:
    """Proportional prioritized replay (Schaul et al.): P(i) ~ p_i^alpha.

    Importance weights are ``(N * P(i))^-beta`` normalized by their maximum, so they are
    at most 1; beta rises linearly to 1 over `beta_anneal_steps` sampled batches. New
    items get the highest priority seen so far, so each is likely to be seen once.
    With ``alpha = 0`` and ``beta = 0`` this is uniform sampling.
    """

    consumes = False

    def __init__(self, capacity: int, alpha: float, beta: float, beta_anneal_steps: int) -> None:
        self.tree = SumTree(capacity)
        self.alpha = alpha
        self.beta0 = beta
        self.beta_anneal_steps = beta_anneal_steps
        self.max_priority = 1.0
        self.batches_drawn = 0

    @property
    def beta(self) -> float:
        if self.beta_anneal_steps <= 0:
            return self.beta0
        progress = min(1.0, self.batches_drawn / self.beta_anneal_steps)
        return self.beta0 + (1.0 - self.beta0) * progress

    def _weight(self, priorities: Any) -> np.ndarray:
        """A leaf's weight, p^alpha, always by numpy's power: Python's ``**`` may differ
        from it in the last bit, and `restore` rebuilds every leaf with numpy."""
        return np.power(np.asarray(priorities, dtype=np.float64), self.alpha)

    def inserted(self, slots: np.ndarray) -> None:
        self.tree.update(slots, self._weight(self.max_priority))

    def removed(self, slots: np.ndarray) -> None:
        self.tree.update(slots, 0.0)

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        if len(priorities):
            self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(slots, self._weight(priorities))

    def sample(
        self, n: int, table: ItemTable, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        slots = self.tree.sample(n, rng)
        beta = self.beta
        if beta == 0.0 or self.alpha == 0.0:
            return slots, np.ones(n, dtype=np.float32)
        # w_i / max_j w_j = (p_i / p_min)^-beta: the size and the total cancel out.
        weights = np.power(self.tree.leaves(slots) / self.tree.min, -beta)
        return slots, weights.astype(np.float32)

    def available(self, table: ItemTable) -> int:
        return table.size if table.size else 0

    def mass(self, table: ItemTable) -> float:
        return self.tree.total

    def weight_scale(self) -> tuple[float, float]:
        if self.beta == 0.0 or self.alpha == 0.0:
            return 1.0, 0.0  # weights of 1
        return self.tree.min, self.beta

    def state(self) -> dict[str, Any]:
        return {"max_priority": self.max_priority, "batches_drawn": self.batches_drawn}

    def restore(self, state: dict[str, Any], table: ItemTable) -> None:
        self.max_priority = float(state["max_priority"])
        self.batches_drawn = int(state["batches_drawn"])
        live = table.key >= 0
        self.tree.rebuild(np.where(live, self._weight(table.priority), 0.0))


class UniformSampler:
    """Every live item equally likely; weights are 1. No per-item memory.

    The table reuses freed slots before it hands out new ones, lowest first, so the
    live items sit in ``[0, high)``, ``high`` being one past the highest live slot,
    with holes only where items left. A draw takes uniform slot numbers in that range
    and keeps the live ones (each kept one is uniform over the live items), drawing
    again for those it threw away. When holes make that wasteful (after `max_use` or
    staleness evictions), it draws from the live slots that one scan of the range
    lists instead, so a draw never loops for long and costs at most O(high).

    It also keeps the highest priority sent so far, as the prioritized sampler does:
    new items get it in the priority column, and snapshots save it.
    """

    consumes = False

    #: Rejection rounds before the rest of a draw comes from the scan.
    MAX_ROUNDS = 4
    #: Rejection while its expected candidates stay below this share of the range: a
    #: candidate (drawn, its key read at random) costs 10 to 30 times what scanning a
    #: slot does (about 30 ns and 1 ns at 10M slots on a 2-core Xeon), so a round of
    #: rejection costs at most about what one scan does.
    REJECTION_SHARE = 1 / 32

    def __init__(self) -> None:
        self.max_priority = 1.0
        self.batches_drawn = 0
        # One past the highest slot that may be live: raised by inserts, lowered to
        # one past the highest live slot at each draw, so a draw depends on the table
        # alone (a restored buffer draws what the original would have).
        self._high = 0

    def inserted(self, slots: np.ndarray) -> None:
        if len(slots):
            self._high = max(self._high, int(slots.max()) + 1)

    def removed(self, slots: np.ndarray) -> None:
        pass  # `sample` skips free slots; `_top` lowers the range when it finds them

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        if len(priorities):
            self.max_priority = max(self.max_priority, float(priorities.max()))

    def sample(
        self, n: int, table: ItemTable, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        live = table.size
        if live == 0:
            raise ValueError("cannot sample from an empty table")
        key = table.key
        high = self._top(key)
        weights = np.ones(n, dtype=np.float32)
        if live == high:  # no holes
            return rng.integers(0, high, n), weights
        parts: list[np.ndarray] = []
        need = n
        for _ in range(self.MAX_ROUNDS):
            # A quarter more than expected (and a few): one round almost always does.
            candidates = int(need * high / live * 1.25) + 16
            if candidates > high * self.REJECTION_SHARE:
                break
            drawn = rng.integers(0, high, candidates)
            kept = drawn[key[drawn] >= 0][:need]
            parts.append(kept)
            need -= len(kept)
            if need == 0:
                return np.concatenate(parts), weights
        slots = np.flatnonzero(key[:high] >= 0)
        parts.append(slots[rng.integers(0, len(slots), need)])
        return np.concatenate(parts), weights

    def _top(self, key: np.ndarray) -> int:
        """One past the highest live slot, scanning down from the last bound in
        windows that double (the bound falls only as far as inserts raised it)."""
        high, window = self._high, 1024
        while high > 0 and key[high - 1] < 0:
            low = max(0, high - window)
            found = np.flatnonzero(key[low:high] >= 0)
            high = low + int(found[-1]) + 1 if len(found) else low
            window *= 2
        self._high = high
        return high

    def available(self, table: ItemTable) -> int:
        return table.size

    def mass(self, table: ItemTable) -> float:
        return float(table.size)

    def weight_scale(self) -> tuple[float, float]:
        return 1.0, 0.0

    def state(self) -> dict[str, Any]:
        return {"max_priority": self.max_priority, "batches_drawn": self.batches_drawn}

    def restore(self, state: dict[str, Any], table: ItemTable) -> None:
        self.max_priority = float(state["max_priority"])
        self.batches_drawn = int(state["batches_drawn"])
        self._high = table.capacity
        self._top(table.key)


class FifoSampler:
    """An on-policy queue: the oldest items, each sampled exactly once."""

    consumes = True
    batches_drawn = 0

    def inserted(self, slots: np.ndarray) -> None:
        pass

    def removed(self, slots: np.ndarray) -> None:
        pass

    def update(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        pass

    def sample(
        self, n: int, table: ItemTable, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        return table.oldest(n), np.ones(n, dtype=np.float32)

    def available(self, table: ItemTable) -> int:
        return table.size

    def mass(self, table: ItemTable) -> float:
        return float(table.size)

    def weight_scale(self) -> tuple[float, float]:
        return 1.0, 0.0

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any], table: ItemTable) -> None:
        pass


class Remover(Protocol):
    def select(self, n: int, table: ItemTable, rng: np.random.Generator) -> np.ndarray:
        """`n` live slots to evict from a full table."""
        ...


class FifoRemover:
    def select(self, n: int, table: ItemTable, rng: np.random.Generator) -> np.ndarray:
        return table.oldest(n)


class LifoRemover:
    def select(self, n: int, table: ItemTable, rng: np.random.Generator) -> np.ndarray:
        return table.newest(n)


class UniformRemover:
    def select(self, n: int, table: ItemTable, rng: np.random.Generator) -> np.ndarray:
        # A full table rarely has holes: draw slots directly and check they are live.
        slots = rng.choice(table.capacity, size=n, replace=False)
        if (table.key[slots] >= 0).all():
            return slots
        return rng.choice(np.flatnonzero(table.key >= 0), size=n, replace=False)


def make_sampler(config: ReplayBufferConfig) -> Sampler:
    capacity = config.replay_buffer_size
    if config.type == "prioritized":
        return PrioritizedSampler(capacity, config.alpha, config.beta, config.beta_anneal_steps)
    if config.type == "fifo":
        return FifoSampler()
    return UniformSampler()


def make_remover(config: ReplayBufferConfig) -> Remover:
    return {"fifo": FifoRemover, "lifo": LifoRemover, "uniform": UniformRemover}[config.eviction]()
