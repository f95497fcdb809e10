"""Statistics of a sweep: intervals over seeds, the paired bootstrap, verdicts, time to a target.

    mean, lo, hi = t_interval([0.41, 0.45, 0.43])               # the mean over seeds, 95% t-interval
    diff, lo, hi = paired_bootstrap(cell, baseline)            # same seeds: the mean difference, 95%
    verdict(lo, hi)                                            # 'better' | 'worse' | 'no difference'
    finding(verdict, expect, lo, hi, margin)                   # 'reproduced' | 'not reproduced' | 'inconclusive'

Pure functions of lists of floats (the standard library only). Two intervals, for two jobs:

- **The mean of one cell over its n seeds: Student's t-interval**,
  ``x̄ ± t_{n-1, (1+level)/2} · s / √n`` with ``s² = Σ (x_i − x̄)² / (n − 1)``. With the 3 to 5
  seeds a sweep affords, the percentile bootstrap of a mean is too narrow: it never reaches
  past the range of the values, and for normal noise its 95% interval held the true mean in
  76% of 2000 simulated draws of 3 values, 83% of 5 and 88% of 8 (the t-interval: 94%, 95%,
  95%). The t-interval assumes roughly normal seed-to-seed noise instead.
- **The difference of a cell to the baseline: the paired percentile bootstrap.** Both ran the
  same seeds, so the differences ``d_i = x_i − b_i`` of equal seeds are what varies; the
  interval is the (α/2, 1 − α/2) percentiles, α = 1 − level, of the bootstrap distribution of
  their mean: resample the n differences with replacement, take the mean, over all resamples.
  For n ≤ :data:`EXACT_MAX_N` that distribution is computed exactly (the nⁿ equally likely
  resamples, counted by multiset), beyond it by :data:`RESAMPLES` seeded
  Monte Carlo resamples. Percentile q of a distribution with cumulative distribution F is the
  smallest value v with F(v) ≥ q (the "inverted CDF" quantile). The same caveat holds: with
  few seeds this interval is narrow, and it never reaches past the smallest and largest
  difference.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction
from itertools import combinations_with_replacement
from typing import Sequence

EXACT_MAX_N = 8
"""Up to this many values, the bootstrap distribution of the mean is enumerated exactly (the
8⁸ resamples of 8 values fall into C(15, 8) = 6435 multisets)."""

RESAMPLES = 20000
"""Monte Carlo resamples of the bootstrap beyond EXACT_MAX_N values."""


def mean(xs: Sequence[float]) -> float:
    """x̄ = Σ x_i / n; ValueError for no values."""
    if not xs:
        raise ValueError("mean of no values")
    return math.fsum(xs) / len(xs)


def sample_std(xs: Sequence[float]) -> float:
    """s = √(Σ (x_i − x̄)² / (n − 1)), the unbiased-variance standard deviation; needs n ≥ 2."""
    if len(xs) < 2:
        raise ValueError(f"the sample standard deviation needs at least 2 values, got {len(xs)}")
    m = mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def t_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with ``df`` (integer ≥ 1) degrees of freedom, t ≥ 0, in closed
    form (Abramowitz & Stegun 26.7.3-4), with θ = atan(t / √df):

        df odd:  (2/π) · [θ + sin θ · (cos θ + (2/3) cos³θ + ... + (2·4···(df−3))/(1·3···(df−2)) cos^(df−2) θ)]
                 (df = 1: 2θ/π)
        df even: sin θ · [1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ... + (1·3···(df−3))/(2·4···(df−2)) cos^(df−2) θ]
    """
    if type(df) is not int or df < 1:
        raise ValueError(f"degrees of freedom: got {df!r}, expected an integer >= 1")
    if t < 0:
        raise ValueError(f"t_two_sided: t = {t}, expected t >= 0")
    if math.isinf(t):
        return 1.0
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):  # terms cos θ, (2/3) cos³θ, ... up to cos^(df-2) θ
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # terms 1, (1/2) cos²θ, ... up to cos^(df-2) θ
        total += term
        term *= c * c * (2 * k - 1) / (2 * k)
    return s * total


def t_critical(level: float, df: int) -> float:
    """The c with P(|T_df| ≤ c) = ``level`` (c = t_{df, (1+level)/2}; 12.706 for df 1 at 0.95),
    by bisection on :func:`t_two_sided` to 1e-12."""
    if not 0 < level < 1:
        raise ValueError(f"confidence level: got {level!r}, expected a number in (0, 1)")
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < level:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(x̄, x̄ − c·s/√n, x̄ + c·s/√n) with c = :func:`t_critical` (level, n − 1): the interval
    of the mean over seeds. One value has no interval: (x, None, None)."""
    m = mean(xs)
    if len(xs) < 2:
        return m, None, None
    half = t_critical(level, len(xs) - 1) * sample_std(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def bootstrap_distribution(xs: Sequence[float]) -> list[tuple[float, Fraction]]:
    """The exact bootstrap distribution of the mean of ``xs``: [(mean of a resample, its
    probability)], sorted by value. A resample draws n of the n values with replacement, each
    of the nⁿ sequences equally likely; a multiset holding value i m_i times is reached by
    n! / ∏ m_i! of them, so each of the C(2n − 1, n) multisets enters with probability
    n! / (∏ m_i! · nⁿ) at its mean Σ m_i x_i / n."""
    n = len(xs)
    if n == 0:
        raise ValueError("the bootstrap of no values")
    probability: dict[float, Fraction] = {}
    for picks in combinations_with_replacement(range(n), n):
        ways = math.factorial(n)
        for m in Counter(picks).values():
            ways //= math.factorial(m)
        value = math.fsum(xs[i] for i in picks) / n
        probability[value] = probability.get(value, Fraction(0)) + Fraction(ways, n**n)
    return sorted(probability.items())


def percentile(distribution: Sequence[tuple[float, Fraction | float]], q: Fraction | float) -> float:
    """The smallest value v of a sorted discrete ``distribution`` [(value, probability)] whose
    cumulative probability F(v) reaches ``q`` (the inverted-CDF quantile)."""
    cumulative: Fraction | float = 0
    for value, p in distribution:
        cumulative += p
        if cumulative >= q:
            return value
    return distribution[-1][0]


def bootstrap_interval(xs: Sequence[float], level: float = 0.95, resamples: int = RESAMPLES,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval (α/2 and 1 − α/2 percentiles, α = 1 − ``level``) of
    the mean of ``xs``: exact for n ≤ EXACT_MAX_N (:func:`bootstrap_distribution`), else from
    ``resamples`` Monte Carlo resamples drawn by ``random.Random(seed)`` (each of weight
    1 / resamples). Percentiles are compared exactly (the level as the decimal it was written)."""
    if not 0 < level < 1:
        raise ValueError(f"confidence level: got {level!r}, expected a number in (0, 1)")
    alpha = 1 - Fraction(repr(level))
    if len(xs) <= EXACT_MAX_N:
        distribution = bootstrap_distribution(xs)
    else:
        rng, n = random.Random(seed), len(xs)
        means = sorted(math.fsum(rng.choices(xs, k=n)) / n for _ in range(resamples))
        distribution = [(m, Fraction(1, resamples)) for m in means]
    return percentile(distribution, alpha / 2), percentile(distribution, 1 - alpha / 2)


def paired_bootstrap(xs: Sequence[float], baseline: Sequence[float],
                     level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(d̄, lo, hi) of the paired differences d_i = x_i − baseline_i (equal seeds, in the same
    order): their mean and :func:`bootstrap_interval`. Fewer than 2 pairs have no interval:
    (d̄, None, None)."""
    if len(xs) != len(baseline):
        raise ValueError(f"paired_bootstrap: {len(xs)} values against {len(baseline)} of the baseline; "
                         "expected one pair per seed")
    diffs = [x - b for x, b in zip(xs, baseline)]
    d = mean(diffs)
    if len(diffs) < 2:
        return d, None, None
    lo, hi = bootstrap_interval(diffs, level)
    return d, lo, hi


VERDICTS = ("baseline", "better", "worse", "no difference")
"""A cell's verdict against the baseline (:func:`verdict`)."""


def verdict(lo: float | None, hi: float | None, is_baseline: bool = False) -> str:
    """``baseline`` for the baseline cell; ``better`` when the interval of the difference lies
    above 0 (lo > 0), ``worse`` when below (hi < 0), else ``no difference`` (also without an
    interval: fewer than 2 paired seeds)."""
    if is_baseline:
        return "baseline"
    if lo is None or hi is None:
        return "no difference"
    return "better" if lo > 0 else "worse" if hi < 0 else "no difference"


EXPECTATIONS = ("better", "worse", "no difference")
"""What a sweep file's ``expect`` may state: a direction, or no difference (within a margin)."""


def finding(cell_verdict: str, expect: str | None, lo: float | None = None, hi: float | None = None,
            margin: float | None = None) -> str | None:
    """Whether a cell reproduces what was expected of it; None for the baseline or without an
    expectation.

    - ``expect`` a direction (``better``, ``worse``): ``reproduced`` when the verdict is it,
      ``not reproduced`` when it is the opposite (the interval excludes 0 on the other side),
      ``inconclusive`` when it is ``no difference``.
    - ``expect`` ``no difference``, an equivalence test: ``reproduced`` when the whole interval
      ``[lo, hi]`` lies within ``[-margin, +margin]``, ``not reproduced`` when it excludes 0
      (verdict ``better`` or ``worse``) and reaches past the margin, ``inconclusive`` otherwise
      (it holds 0 but is too wide to rule out a difference of the margin's size).
    """
    if expect is None or cell_verdict == "baseline":
        return None
    if expect == "no difference":
        if margin is None:
            raise ValueError("finding: expect 'no difference' needs a margin")
        if lo is not None and hi is not None and -margin <= lo and hi <= margin:
            return "reproduced"
    elif cell_verdict == expect:
        return "reproduced"
    return "inconclusive" if cell_verdict == "no difference" else "not reproduced"


def first_reaching(points: Sequence[tuple[float, ...]], target: float) -> tuple[float, ...] | None:
    """The first of ``points`` (value, then what to report: step, samples, seconds) whose value
    is at least ``target``, without its value; None when none reaches it."""
    for value, *rest in points:
        if value >= target:
            return tuple(rest)
    return None
