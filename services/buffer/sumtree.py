"""A vectorized sum tree (with a min tree beside it) over a fixed number of leaves.

Leaves hold non-negative weights. `sample` draws leaves with probability
weight / total by descending the tree for a whole batch at once; `update` writes a
batch of leaves and refreshes their ancestors one level at a time. Both are
O(batch * log capacity) numpy operations, with no per-item Python loop.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 1 << max(1, int(np.ceil(np.log2(max(capacity, 2)))))
        # Node i has children 2i and 2i+1; leaves live at [size, 2 * size).
        self._sum = np.zeros(2 * self.size, dtype=np.float64)
        self._min = np.full(2 * self.size, np.inf, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """The smallest weight of a live leaf (inf when empty)."""
        return float(self._min[1])

    def leaves(self, index: np.ndarray | None = None) -> np.ndarray:
        if index is None:
            return self._sum[self.size : self.size + self.capacity].copy()
        return self._sum[self.size + index]

    def update(self, index: np.ndarray, weight: np.ndarray) -> None:
        """Set the leaves at `index` to `weight` (0 removes a leaf from sampling).

        A repeated index takes its last weight (numpy assigns repeated indices in order).
        """
        index = np.asarray(index, dtype=np.int64)
        if index.size == 0:
            return
        weight = np.broadcast_to(np.asarray(weight, dtype=np.float64), index.shape)
        first = int(index[0])
        if int(index[-1]) - first + 1 == index.size and (
            index.size == 1 or bool((np.diff(index) == 1).all())
        ):
            self._update_run(first, weight)
            return
        nodes = index + self.size
        self._sum[nodes] = weight
        self._min[nodes] = np.where(weight > 0, weight, np.inf)
        # Refresh every ancestor. A node reached twice is computed twice from the same
        # children, which is cheaper than removing the duplicates at every level.
        for _ in range(self.size.bit_length() - 1):
            nodes >>= 1
            left = nodes << 1
            right = left + 1
            self._sum[nodes] = self._sum[left] + self._sum[right]
            self._min[nodes] = np.minimum(self._min[left], self._min[right])

    def _update_run(self, first: int, weight: np.ndarray) -> None:
        """`update` of consecutive leaves (what an insert writes): each level's
        ancestors are then one run too, refreshed by slices instead of gathers, and
        the levels where the run is a single node by scalars. At 1M leaves this is
        several times cheaper than the general path for a 64-leaf segment."""
        lo = first + self.size
        hi = lo + len(weight) - 1
        self._sum[lo : hi + 1] = weight
        self._min[lo : hi + 1] = np.where(weight > 0, weight, np.inf)
        total, low = self._sum, self._min
        while lo > 1 and lo != hi:
            lo, hi = lo >> 1, hi >> 1
            left, right = slice(2 * lo, 2 * hi + 1, 2), slice(2 * lo + 1, 2 * hi + 2, 2)
            total[lo : hi + 1] = total[left] + total[right]
            low[lo : hi + 1] = np.minimum(low[left], low[right])
        if lo > 1:
            # One node a level from here up: each is its child on this chain plus that
            # child's sibling, which this update did not touch, so the whole chain is
            # one accumulation (in the same order of additions as level by level).
            children = lo >> np.arange(lo.bit_length() - 1)
            siblings = children ^ 1
            parents = children >> 1
            total[parents] = np.add.accumulate(np.r_[total[lo], total[siblings]])[1:]
            low[parents] = np.minimum.accumulate(np.r_[low[lo], low[siblings]])[1:]

    def rebuild(self, weight: np.ndarray) -> None:
        """Set every leaf at once (used when loading a saved buffer)."""
        self._sum[:] = 0.0
        self._min[:] = np.inf
        self._sum[self.size : self.size + len(weight)] = weight
        self._min[self.size : self.size + len(weight)] = np.where(weight > 0, weight, np.inf)
        level = self.size
        while level > 1:
            nodes = np.arange(level // 2, level)
            self._sum[nodes] = self._sum[2 * nodes] + self._sum[2 * nodes + 1]
            self._min[nodes] = np.minimum(self._min[2 * nodes], self._min[2 * nodes + 1])
            level //= 2

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` leaf indices drawn with replacement, with probability weight / total."""
        total = self._sum[1]
        if total <= 0:
            raise ValueError("cannot sample from an empty tree")
        value = rng.random(n) * total
        node = np.ones(n, dtype=np.int64)
        for _ in range(self.size.bit_length() - 1):
            left = node << 1
            left_sum = self._sum[left]
            go_right = value >= left_sum
            value -= left_sum * go_right
            node = left + go_right
        index = node - self.size
        # Float rounding can land on an empty leaf at the very end of the mass; move
        # such a draw to a live one.
        empty = self._sum[node] <= 0
        if empty.any():
            index[empty] = self._any_live(int(empty.sum()), rng)
        return index

    def _any_live(self, n: int, rng: np.random.Generator) -> np.ndarray:
        live = np.flatnonzero(self._sum[self.size : self.size + self.capacity] > 0)
        return rng.choice(live, size=n)
