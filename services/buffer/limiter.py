"""Reverb-style rate limiter: keeps samples per insert near a target, counted in items.

With `spi = samples_per_insert`, the target is
``sampled == spi * (inserted - min_size_to_sample)``. Sampling may run ahead of it by
at most `error_buffer` items, and inserting ahead by at most `error_buffer` items'
worth of samples. Whichever side is ahead waits; nothing is dropped. Without a ratio,
only `min_size_to_sample` holds sampling back.

A shard of a job's buffer (sharding.py) keeps the job's ratio, not its own: its
limiter counts, besides its own items, those of the job's other shards as the
coordinator last relayed them (`elsewhere`, a quarter of a second old at most), so
every shard decides alike whether the job's collectors or its learner must wait.
"""

from __future__ import annotations

from common.messages import RateLimiterState


class RateLimiter:
    def __init__(
        self, samples_per_insert: float | None, min_size_to_sample: int, error_buffer: float
    ) -> None:
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = error_buffer
        #: This buffer's own items inserted and sampled.
        self.inserted = 0
        self.sampled = 0
        #: The job's other shards' (0 for an unsharded buffer).
        self.elsewhere_inserted = 0
        self.elsewhere_sampled = 0

    def _diff(self, inserted: int, sampled: int) -> float:
        spi = self.samples_per_insert or 0.0
        return spi * (inserted - self.min_size_to_sample) - sampled

    def can_sample(self, num_items: int) -> bool:
        inserted = self.inserted + self.elsewhere_inserted
        if inserted < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        sampled = self.sampled + self.elsewhere_sampled + num_items
        return self._diff(inserted, sampled) >= -self.error_buffer

    def can_insert(self, num_items: int) -> bool:
        if self.samples_per_insert is None:
            return True
        inserted = self.inserted + self.elsewhere_inserted + num_items
        if inserted <= self.min_size_to_sample:
            return True
        return self._diff(inserted, self.sampled + self.elsewhere_sampled) <= self.error_buffer

    def state(self) -> RateLimiterState:
        return RateLimiterState(
            samples_per_insert=self.samples_per_insert,
            min_size_to_sample=self.min_size_to_sample,
            error_buffer=self.error_buffer,
            inserted=self.inserted,
            sampled=self.sampled,
        )

    def restore(self, inserted: int, sampled: int) -> None:
        self.inserted, self.sampled = inserted, sampled
