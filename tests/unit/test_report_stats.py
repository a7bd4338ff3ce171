"""The report's statistics (drover/stats.py) against cases worked out by hand: the
interquartile mean, percentile bootstrap intervals, performance profiles."""

import numpy as np
import pytest

from drover import stats


def test_the_iqm_is_the_mean_of_the_middle_half_of_the_runs():
    assert stats.iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == pytest.approx(3.0)  # 2, 3, 4
    assert stats.median(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == 3.0


def test_the_interval_of_two_runs_is_what_the_resamples_can_give():
    # Resamples of {0, 1} (with replacement): means 0, 0.5, 1 with chances 1/4, 1/2,
    # 1/4; the 2.5th and 97.5th percentiles of those are 0 and 1.
    est = stats.estimate([0.0, 1.0], stats.iqm)
    assert (est.value, est.low, est.high) == (0.5, 0.0, 1.0)


def test_no_spread_no_interval_and_one_run_is_its_own_interval():
    assert stats.estimate([7.0, 7.0, 7.0]) == stats.Estimate(7.0, 7.0, 7.0)
    assert stats.estimate([3.0]) == stats.Estimate(3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        stats.estimate([])


def test_an_interval_holds_its_statistic_is_seeded_and_covers_as_it_says():
    runs = np.array([120.0, 180.0, 200.0, 210.0, 500.0])
    est = stats.estimate(runs, stats.iqm)
    assert runs.min() <= est.low <= est.value <= est.high <= runs.max()
    assert stats.estimate(runs, stats.iqm) == est  # the same resamples each time
    # Coverage: of 200 samples of 30 runs from N(10, 2), the 95% interval of the
    # median holds the true median 10 about 95% of the time.
    rng = np.random.default_rng(1)
    held = sum(
        (e := stats.estimate(rng.normal(10.0, 2.0, 30), stats.median)).low <= 10.0 <= e.high
        for _ in range(200)
    )
    assert 0.88 <= held / 200 <= 0.99


def test_a_performance_profile_counts_the_runs_above_each_threshold():
    fraction, low, high = stats.profile([1.0, 2.0, 3.0, 4.0], np.array([0.0, 2.5, 5.0]))
    np.testing.assert_allclose(fraction, [1.0, 0.5, 0.0])
    assert np.all(low <= fraction) and np.all(fraction <= high)
    assert (low[0], high[0], low[2], high[2]) == (1.0, 1.0, 0.0, 0.0)  # no run varies there


def test_the_mean_band_of_identical_curves_is_the_curve():
    curves = np.tile(np.linspace(0.0, 1.0, 5), (4, 1))
    mean, low, high = stats.mean_band(curves)
    np.testing.assert_allclose(mean, low)
    np.testing.assert_allclose(mean, high)
