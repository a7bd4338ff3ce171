"""Aggregates over runs as "Deep RL at the Edge of the Statistical Precipice" (Agarwal
et al., 2021) asks for them: the median and the interquartile mean (IQM: the mean of
the middle 50% of runs), each with a 95% bootstrap confidence interval over the runs,
and performance profiles (the fraction of runs scoring above each threshold).

A report here compares configs of one task (one env), so the stratified bootstrap of
the paper, which resamples runs within each task, is a bootstrap over the runs:
`scipy.stats.bootstrap`'s percentile interval. Resampling is seeded: a report is the
same each time it is made from the same runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: Bootstrap resamples per interval, and the interval's level.
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A statistic over runs and its confidence interval (equal to it with one run)."""

    value: float
    low: float
    high: float

    def text(self, digits: int = 1) -> str:
        return f"{self.value:,.{digits}f} [{self.low:,.{digits}f}, {self.high:,.{digits}f}]"


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """The interquartile mean: the mean of the runs left once the lowest and the
    highest quarter are cut (scipy's `trim_mean`, as rliable computes it)."""
    from scipy import stats  # drover report's extra (`report`): not in every image

    return stats.trim_mean(values, 0.25, axis=axis)


def median(values: np.ndarray, axis: int = -1) -> np.ndarray | float:
    return np.median(values, axis=axis)


def estimate(values: list[float] | np.ndarray, statistic: Callable = iqm) -> Estimate:
    """`statistic` of the runs' `values`, with its 95% bootstrap interval."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no runs to aggregate")
    value = float(statistic(data))
    if data.size == 1 or np.all(data == data[0]):
        return Estimate(value, value, value)  # nothing varies: no interval to draw
    from scipy import stats

    result = stats.bootstrap(
        (data,),
        statistic,
        n_resamples=RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(SEED),
    )
    interval = result.confidence_interval
    return Estimate(value, float(interval.low), float(interval.high))


def profile(
    values: list[float] | np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The performance profile of the runs' `values`: at each threshold, the fraction
    of runs above it, with the 95% bootstrap band of that fraction."""
    data = np.asarray(values, dtype=float)
    above = (data[:, None] > thresholds[None, :]).astype(float)  # runs x thresholds
    fraction = above.mean(axis=0)
    if data.size < 2:
        return fraction, fraction, fraction
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, data.size, size=(RESAMPLES, data.size))
    resampled = above[picks].mean(axis=1)  # resamples x thresholds
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail], axis=0)
    return fraction, low, high


def mean_band(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean of runs' curves (runs x points) and the 95% bootstrap band of it."""
    mean = curves.mean(axis=0)
    if curves.shape[0] < 2:
        return mean, mean, mean
    rng = np.random.default_rng(SEED)
    picks = rng.integers(0, curves.shape[0], size=(RESAMPLES, curves.shape[0]))
    means = curves[picks].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail], axis=0)
    return mean, low, high
