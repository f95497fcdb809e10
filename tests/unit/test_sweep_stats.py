"""The statistics of a sweep against values computed by hand (reasonrl/experiments/stats.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from reasonrl.experiments import stats


def test_t_two_sided_closed_forms():
    # df 1 (Cauchy): P(|T| <= t) = 2 atan(t) / pi; df 2: t / sqrt(2 + t^2).
    assert stats.t_two_sided(1.0, 1) == pytest.approx(0.5, abs=1e-15)
    assert stats.t_two_sided(2.0, 2) == pytest.approx(2 / math.sqrt(6), abs=1e-15)
    # df 3: (2/pi)(theta + sin theta cos theta), theta = atan(t / sqrt 3); t = sqrt 3 -> theta = pi/4
    assert stats.t_two_sided(math.sqrt(3), 3) == pytest.approx((2 / math.pi) * (math.pi / 4 + 0.5), abs=1e-15)
    # df 4: sin theta (1 + cos^2 theta / 2); t = 2 -> theta = pi/4
    assert stats.t_two_sided(2.0, 4) == pytest.approx(math.sqrt(0.5) * 1.25, abs=1e-15)
    assert stats.t_two_sided(0.0, 5) == 0.0 and stats.t_two_sided(math.inf, 5) == 1.0


def test_t_critical_matches_the_printed_table():
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 30: 2.0423}
    for df, value in table.items():
        assert stats.t_critical(0.95, df) == pytest.approx(value, abs=5e-5)
    assert stats.t_critical(0.99, 4) == pytest.approx(4.6041, abs=5e-5)
    with pytest.raises(ValueError, match="integer >= 1"):
        stats.t_critical(0.95, 0)


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, s = 1, half width 4.3027 / sqrt 3 = 2.4841
    m, lo, hi = stats.t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and lo == pytest.approx(2 - 2.48414, abs=1e-5) and hi == pytest.approx(2 + 2.48414, abs=1e-5)
    assert stats.t_interval([0.4]) == (0.4, None, None)
    m, lo, hi = stats.t_interval([0.5, 0.5, 0.5])
    assert m == lo == hi == 0.5


def test_the_exact_bootstrap_distribution_by_hand():
    # [0, 1]: the resamples (0,0) (0,1) (1,0) (1,1) have means 0, 1/2, 1/2, 1
    assert stats.bootstrap_distribution([0.0, 1.0]) == [(0.0, Fraction(1, 4)), (0.5, Fraction(1, 2)), (1.0, Fraction(1, 4))]
    # [0.1, 0.3, 0.1]: k draws of 0.3 ~ Binomial(3, 1/3): P = 8/27, 12/27, 6/27, 1/27 at means 0.1 + 0.2k/3
    dist = stats.bootstrap_distribution([0.1, 0.3, 0.1])
    assert [p for _, p in dist] == [Fraction(8, 27), Fraction(12, 27), Fraction(6, 27), Fraction(1, 27)]
    assert [v for v, _ in dist] == pytest.approx([0.1, 0.1 + 0.2 / 3, 0.1 + 0.4 / 3, 0.3])


def test_the_bootstrap_interval_by_hand():
    # cumulative 8/27 >= 0.025 at 0.1; 26/27 = 0.963 < 0.975, so the upper end is 0.3
    assert stats.bootstrap_interval([0.1, 0.3, 0.1]) == pytest.approx((0.1, 0.3))
    # at 50%: the 25% percentile is 0.1 (8/27 = 0.296 >= 0.25), the 75% one 0.1 + 0.2/3 (20/27 = 0.741 < 0.75)
    assert stats.bootstrap_interval([0.1, 0.3, 0.1], level=0.5) == pytest.approx((0.1, 0.1 + 0.4 / 3))
    # a percentile hit exactly: [0, 1] at 50% -> F(0) = 1/4 reaches the 25% percentile, F(1/2) = 3/4 the 75% one
    assert stats.bootstrap_interval([0.0, 1.0], level=0.5) == (0.0, 0.5)


def test_the_monte_carlo_bootstrap_is_seeded_and_near_the_exact_one():
    xs = [0.31, 0.42, 0.38, 0.29, 0.45, 0.40, 0.36, 0.33, 0.47]  # 9 values: beyond EXACT_MAX_N
    assert len(xs) > stats.EXACT_MAX_N
    lo, hi = stats.bootstrap_interval(xs)
    assert (lo, hi) == stats.bootstrap_interval(xs)
    exact = stats.bootstrap_distribution(xs)
    assert lo == pytest.approx(stats.percentile(exact, Fraction(1, 40)), abs=0.003)
    assert hi == pytest.approx(stats.percentile(exact, Fraction(39, 40)), abs=0.003)


def test_paired_bootstrap_and_verdicts():
    # differences of equal seeds: [0.5-0.4, 0.7-0.4, 0.6-0.5] = [0.1, 0.3, 0.1]
    d, lo, hi = stats.paired_bootstrap([0.5, 0.7, 0.6], [0.4, 0.4, 0.5])
    assert d == pytest.approx(0.5 / 3) and (lo, hi) == pytest.approx((0.1, 0.3))
    assert stats.verdict(lo, hi) == "better"
    d, lo, hi = stats.paired_bootstrap([0.4, 0.4, 0.5], [0.5, 0.7, 0.6])
    assert (lo, hi) == pytest.approx((-0.3, -0.1)) and stats.verdict(lo, hi) == "worse"
    d, lo, hi = stats.paired_bootstrap([0.5, 0.3], [0.4, 0.4])  # differences +0.1 and -0.1
    assert (lo, hi) == pytest.approx((-0.1, 0.1)) and stats.verdict(lo, hi) == "no difference"
    d, lo, hi = stats.paired_bootstrap([0.6], [0.4])  # one pair: no interval
    assert d == pytest.approx(0.2) and (lo, hi) == (None, None)
    assert stats.verdict(None, None) == "no difference" and stats.verdict(0.1, 0.2, is_baseline=True) == "baseline"
    assert stats.verdict(0.0, 0.2) == "no difference"
    with pytest.raises(ValueError, match="one pair per seed"):
        stats.paired_bootstrap([0.1, 0.2], [0.1])


def test_a_finding_is_reproduced_when_the_verdict_has_the_expected_direction():
    assert stats.finding("better", "better") == "reproduced" and stats.finding("worse", "worse") == "reproduced"
    assert stats.finding("worse", "better") == "not reproduced" and stats.finding("better", "worse") == "not reproduced"
    assert stats.finding("no difference", "better") == "inconclusive"
    assert stats.finding("baseline", "better") is None and stats.finding("better", None) is None


def test_no_difference_is_reproduced_only_by_an_interval_inside_the_margin():
    # An equivalence test: the interval must rule out a difference of the margin's size.
    assert stats.finding("no difference", "no difference", -0.02, 0.025, margin=0.03) == "reproduced"
    assert stats.finding("better", "no difference", 0.005, 0.02, margin=0.03) == "reproduced"  # real, but too small to matter
    assert stats.finding("no difference", "no difference", -0.02, 0.04, margin=0.03) == "inconclusive"
    assert stats.finding("worse", "no difference", -0.08, -0.04, margin=0.03) == "not reproduced"
    assert stats.finding("no difference", "no difference", None, None, margin=0.03) == "inconclusive"  # too few seeds
    with pytest.raises(ValueError, match="margin"):
        stats.finding("no difference", "no difference", -0.01, 0.01)


def test_first_reaching():
    points = [(0.2, 0, 0.0, 1.0), (0.5, 10, 1280.0, 30.0), (0.7, 20, 2560.0, 61.0)]
    assert stats.first_reaching(points, 0.5) == (10, 1280.0, 30.0)
    assert stats.first_reaching(points, 0.1) == (0, 0.0, 1.0)
    assert stats.first_reaching(points, 0.8) is None
