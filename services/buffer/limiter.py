"""Reverb-style rate limiter: keeps samples per insert near a target, counted in items.

With `spi = samples_per_insert`, the target is
``sampled == spi * (inserted - min_size_to_sample)``. Sampling may run ahead of it by
at most `error_buffer` items, and inserting ahead by at most `error_buffer` items'
worth of samples. Whichever side is ahead waits; nothing is dropped. Without a ratio,
only `min_size_to_sample` holds sampling back.
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
        self.inserted = 0
        self.sampled = 0

    def _diff(self, inserted: int, sampled: int) -> float:
        spi = self.samples_per_insert or 0.0
        return spi * (inserted - self.min_size_to_sample) - sampled

    def can_sample(self, num_items: int) -> bool:
        if self.inserted < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None:
            return True
        return self._diff(self.inserted, self.sampled + num_items) >= -self.error_buffer

    def can_insert(self, num_items: int) -> bool:
        if self.samples_per_insert is None:
            return True
        if self.inserted + num_items <= self.min_size_to_sample:
            return True
        return self._diff(self.inserted + num_items, self.sampled) <= self.error_buffer

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
