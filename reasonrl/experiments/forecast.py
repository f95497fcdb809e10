"""Forecasts of held-out accuracy: ScaleRL's saturating curve of accuracy against samples.

    fc = forecast(steps, samples, acc, horizon=150, target=0.8)   # NotEnoughEvaluations below MIN_FITTED
    fc.plateau, fc.plateau_lo, fc.plateau_hi      # the asymptote A and its 95% interval
    fc.final, fc.final_lo, fc.final_hi            # val/acc at step ``horizon`` and its prediction interval
    fc.target_step, fc.target_step_lo, ...        # the step at which val/acc reaches ``target`` (inf: never)
    fc.metrics()                                  # {"forecast/plateau": ..., ...}: what a run logs

**The curve** (ScaleRL, arXiv 2510.13786), held-out accuracy R against samples generated C::

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B),        R(0) = R0

with R0 the first evaluation's accuracy (before any training), A the asymptote (the plateau),
B > 0 the exponent (how sharply it bends) and C_mid the samples at which half of the gain
A − R0 is made. The x-axis is samples generated (``batch/generated_samples`` summed over the
steps: kept and dropped ones, the rollout compute), as ScaleRL's is compute.

**The fit.** R0 is held at the first evaluation. As ScaleRL does, the earliest part of the
run is left out of the fit: the evaluations before ``exclude`` (EXCLUDE, a quarter) of the
samples generated so far, whose fast early gains say little about where the curve goes
(ScaleRL leaves out its first 1.5k GPU-hours). A, B and C_mid minimise the squared error over
the evaluations after that, within bounds: A in [0, 1] (an accuracy), B in [B_BOUNDS], C_mid in
[C_first / 100, 100 · C_last] (C_first, C_last: the samples at the first and last evaluation
fitted). For fixed (B, C_mid) the curve is linear in a = A − R0,
``R(C) − R0 = a · g(C)`` with ``g(C) = 1 / (1 + (C_mid / C)^B)``, so the best a is
``clip(Σ g_i d_i / Σ g_i², bounds)`` (d_i = R_i − R0; the squared error is a convex quadratic
in a, so clipping its free minimum gives the bounded one); the fit searches (log B, log C_mid)
only: a grid of GRID_B x GRID_C points, then PATTERN_ROUNDS rounds of a 5 x 5 pattern around
the best point, the spacing halved each round. Deterministic, no derivatives, no start value
to guess; on a curve without noise it recovers the parameters to about 1e-4 relative.
A flat series fits a = 0 (A = R0); fewer than MIN_FITTED evaluations to fit is
:class:`NotEnoughEvaluations`, an answer and not an error of the run.

**The intervals: a residual bootstrap.** From the fitted curve R̂ and the residuals
e_i = R_i − R̂(C_i) of the n evaluations fitted, centred and scaled by √(n / (n − 3))
(3 fitted parameters: the usual correction of their shrinkage), each of ``resamples``
replicates draws n + 1 residuals with replacement, ``R*_i = R̂(C_i) + e*_i`` (the first
evaluation too, so R0 varies with its noise), and refits. Over the replicates, at ``level``
(default 95%), the percentile intervals (α/2 and 1 − α/2 quantiles, α = 1 − level) are:

- the plateau: of A*;
- the accuracy at step ``horizon``: of ``R*(C_horizon) + e**`` with one more residual drawn,
  a prediction interval for the evaluation that will be measured there (its noise included);
- the step at which the curve reaches ``target``: of each replicate's crossing, inf when its
  curve never reaches it (A* ≤ target), so the upper end is inf when more than α/2 of the
  replicates never get there.

What it assumes: the evaluations scatter independently around one smooth curve. A run whose
accuracy wanders (the policy's own randomness, not only the evaluation's) has correlated
residuals, and the interval is then too narrow; docs/evaluation.md ("Forecasts of held-out
accuracy") and docs/benchmarks.md state how often the interval held on the DAPO demo.

**Steps and samples.** Samples per step change over a run (dynamic sampling draws more as
groups become all correct), so a sample count is turned into a step by the observed points
(linear interpolation between evaluations) and beyond the last one by the rate over the later
half of the observed steps (:class:`Clock`).

Pure numpy; no torch, no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

MIN_FITTED = 5
"""Evaluations a forecast fits, at least, besides the first (R0): 3 for the parameters and 2
left to estimate the noise from."""

EXCLUDE = 0.25
"""The evaluations before this fraction of the samples generated so far are left out of the
fit (the first one still anchors R0)."""

LEVEL = 0.95
"""The confidence level of the intervals."""

RESAMPLES = 1000
"""Bootstrap replicates of a forecast."""

A_BOUNDS = (0.0, 1.0)
"""The asymptote A: an accuracy."""

B_BOUNDS = (0.25, 8.0)
"""The exponent B."""

C_SPAN = 100.0
"""C_mid lies in [C_first / C_SPAN, C_SPAN · C_last]."""

GRID_B, GRID_C, PATTERN_ROUNDS = 21, 41, 16
"""The search: a log-spaced grid of GRID_B values of B by GRID_C of C_mid, then
PATTERN_ROUNDS halvings of a 5 x 5 pattern."""

METRICS = ("forecast/plateau", "forecast/plateau_lo", "forecast/plateau_hi", "forecast/final",
           "forecast/final_lo", "forecast/final_hi", "forecast/exponent", "forecast/midpoint",
           "forecast/evals", "forecast/target", "forecast/target_step", "forecast/target_step_lo",
           "forecast/target_step_hi")
"""The metric names of a run's forecast (:meth:`Forecast.metrics`, :meth:`RunForecast.observe`;
the target ones with a target)."""


class NotEnoughEvaluations(ValueError):
    """Fewer evaluations to fit than a forecast needs (MIN_FITTED)."""


@dataclass(frozen=True)
class Curve:
    """R(C) = r0 + (a − r0) / (1 + (c_mid / C)^b); R(0) = r0."""

    r0: float
    a: float
    b: float
    c_mid: float

    def __call__(self, samples: Any) -> np.ndarray:
        c = np.asarray(samples, dtype=float)
        return self.r0 + (self.a - self.r0) * _gain(c, self.b, self.c_mid)

    def reaching(self, target: float) -> float:
        """The samples C at which R(C) = ``target``: 0 when R0 already reaches it, inf when the
        curve never does (it rises to a, or falls), else
        ``C_mid · ((a − r0) / (target − r0) − 1)^(−1 / b)``."""
        if self.r0 >= target:
            return 0.0
        if self.a <= target:
            return math.inf
        return self.c_mid * ((self.a - self.r0) / (target - self.r0) - 1.0) ** (-1.0 / self.b)


def _gain(c: np.ndarray, b: Any, c_mid: Any) -> np.ndarray:
    """g(C) = 1 / (1 + (c_mid / C)^b) = 1 / (1 + exp(b (log c_mid − log C))), 0 at C = 0
    (broadcast over ``b`` and ``c_mid``)."""
    with np.errstate(divide="ignore", over="ignore"):
        z = np.asarray(b) * (np.log(c_mid) - np.log(np.maximum(c, 0.0)))
        return np.where(c > 0, 1.0 / (1.0 + np.exp(np.minimum(z, 700.0))), 0.0)


@dataclass(frozen=True)
class Clock:
    """Samples generated at each step: the observed (step, samples) points, interpolated
    between them, and past the last one the rate of the later half of the observed steps
    (from the first point at or after half the last step, to the last)."""

    steps: tuple[float, ...]
    samples: tuple[float, ...]

    @property
    def rate(self) -> float:
        """Samples per step beyond the last point (1 when nothing was generated yet)."""
        s, c = self.steps, self.samples
        last = s[-1]
        first = next((i for i, step in enumerate(s) if step >= last / 2 and step < last), None)
        if first is None:
            first = 0
        span = last - s[first]
        rate = (c[-1] - c[first]) / span if span > 0 else 0.0
        if rate <= 0:
            rate = c[-1] / last if last > 0 and c[-1] > 0 else 1.0
        return rate

    def samples_at(self, step: float) -> float:
        if step <= self.steps[-1]:
            return float(np.interp(step, self.steps, self.samples))
        return self.samples[-1] + (step - self.steps[-1]) * self.rate

    def step_at(self, samples: float) -> float:
        """The step at which ``samples`` have been generated (inf for inf)."""
        if math.isinf(samples):
            return math.inf
        if samples <= self.samples[-1]:
            i = int(np.searchsorted(self.samples, samples, side="left"))
            if i == 0:
                return float(self.steps[0])
            c0, c1, s0, s1 = self.samples[i - 1], self.samples[i], self.steps[i - 1], self.steps[i]
            return s0 + (s1 - s0) * (samples - c0) / (c1 - c0) if c1 > c0 else float(s1)
        return self.steps[-1] + (samples - self.samples[-1]) / self.rate


def fit(samples: Sequence[float], acc: Sequence[float], exclude: float = EXCLUDE) -> Curve:
    """The least-squares curve through (samples, acc), R0 = acc[0], the evaluations before
    ``exclude`` of the last sample count left out (see the module docstring).
    NotEnoughEvaluations below MIN_FITTED points to fit; ValueError when the samples decrease."""
    c, y = _check(samples, acc, exclude)
    [r0], [a], [b], [m] = _fit_many(c, y[None, :])
    return Curve(float(r0), float(a), float(b), float(math.exp(m)))


def _check(samples: Sequence[float], acc: Sequence[float], exclude: float) -> tuple[np.ndarray, np.ndarray]:
    """(samples, acc) of the first evaluation and of those fitted: at or after ``exclude`` of
    the last sample count."""
    c, y = np.asarray(samples, dtype=float), np.asarray(acc, dtype=float)
    if c.shape != y.shape or c.ndim != 1:
        raise ValueError(f"forecast: {c.size} sample counts against {y.size} accuracies; expected one of each per "
                         "evaluation")
    if not 0 <= exclude < 1:
        raise ValueError(f"forecast: exclude = {exclude!r}, expected a fraction in [0, 1)")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
        raise ValueError("forecast: a sample count or an accuracy is not finite")
    if np.any(np.diff(c) < 0) or (c.size and c[0] < 0):
        raise ValueError(f"forecast: the sample counts {c.tolist()} decrease; expected the samples generated up to "
                         "each evaluation, in order")
    if c.size > 1 and c[-1] <= 0:
        raise NotEnoughEvaluations("not enough evaluations: no samples generated (batch/generated_samples) before the "
                                   "last one, nothing to fit against")
    keep = np.flatnonzero((c > 0) & (c >= exclude * (c[-1] if c.size else 0.0)))
    keep = keep[keep > 0]
    if keep.size < MIN_FITTED:
        left_out = max(c.size - 1 - keep.size, 0)
        early = f" ({left_out} in the first {exclude:.0%} of the samples left out)" if left_out else ""
        raise NotEnoughEvaluations(
            f"not enough evaluations: {keep.size} to fit after the first{early}; a forecast fits {MIN_FITTED} "
            "(3 parameters, 2 left to estimate the noise)")
    return np.concatenate([c[:1], c[keep]]), np.concatenate([y[:1], y[keep]])


def _bounds(c: np.ndarray) -> tuple[float, float]:
    """(log C_mid low, high) from the samples of the points after the first."""
    positive = c[1:][c[1:] > 0]
    return math.log(positive[0] / C_SPAN), math.log(positive[-1] * C_SPAN)


def _profile(c: np.ndarray, y: np.ndarray, logb: np.ndarray, logm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(squared error, a) per candidate: ``y`` (R, n) of R series, ``logb``/``logm`` (R, G)
    candidates per series, or (G,) shared; R0 = y[:, 0], a = A − R0 clipped so A stays in
    A_BOUNDS."""
    r0 = y[:, :1]
    d = y[:, 1:] - r0  # (R, n-1)
    with np.errstate(divide="ignore"):
        logc = np.log(c[1:])  # -inf at C = 0: g = 0 there
    z = np.exp(logb)[..., None] * (logm[..., None] - logc)  # (G, n-1) or (R, G, n-1)
    g = 1.0 / (1.0 + np.exp(np.minimum(z, 700.0)))
    if g.ndim == 2:
        sgd, sgg = d @ g.T, (g * g).sum(-1)[None, :]
    else:
        sgd, sgg = np.einsum("rn,rgn->rg", d, g), (g * g).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        free = np.where(sgg > 0, sgd / sgg, 0.0)
    a = np.clip(free, A_BOUNDS[0] - r0, A_BOUNDS[1] - r0)
    sse = (d * d).sum(-1, keepdims=True) - 2 * a * sgd + a * a * sgg
    return sse, a


def _fit_many(c: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fit every row of ``y`` (R, n) against ``c``: (r0, A, B, log C_mid), each (R,)."""
    lo_b, hi_b = math.log(B_BOUNDS[0]), math.log(B_BOUNDS[1])
    lo_m, hi_m = _bounds(c)
    grid_b, grid_m = np.meshgrid(np.linspace(lo_b, hi_b, GRID_B), np.linspace(lo_m, hi_m, GRID_C), indexing="ij")
    grid_b, grid_m = grid_b.ravel(), grid_m.ravel()
    sse, _ = _profile(c, y, grid_b, grid_m)
    best = np.argmin(sse, axis=1)
    logb, logm = grid_b[best], grid_m[best]
    step_b, step_m = (hi_b - lo_b) / (GRID_B - 1), (hi_m - lo_m) / (GRID_C - 1)
    offsets = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])
    pattern_b, pattern_m = (x.ravel() for x in np.meshgrid(offsets, offsets, indexing="ij"))
    for _ in range(PATTERN_ROUNDS):
        cand_b = np.clip(logb[:, None] + step_b * pattern_b[None, :], lo_b, hi_b)
        cand_m = np.clip(logm[:, None] + step_m * pattern_m[None, :], lo_m, hi_m)
        sse, _ = _profile(c, y, cand_b, cand_m)
        best = np.argmin(sse, axis=1)
        rows = np.arange(len(best))
        logb, logm = cand_b[rows, best], cand_m[rows, best]
        step_b, step_m = step_b / 2, step_m / 2
    _, a = _profile(c, y, logb[:, None], logm[:, None])
    r0 = y[:, 0]
    return r0, r0 + a[:, 0], np.exp(logb), logm


@dataclass(frozen=True)
class Forecast:
    """A fitted curve with its bootstrap intervals (see the module docstring). The ``target_*``
    fields are None without a target; ``final*`` None without a horizon."""

    curve: Curve
    clock: Clock
    evals: int
    """The evaluations fitted: the first (R0) and those after the excluded early part."""
    last_step: int
    level: float
    plateau: float
    plateau_lo: float
    plateau_hi: float
    horizon: int | None = None
    final: float | None = None
    final_lo: float | None = None
    final_hi: float | None = None
    target: float | None = None
    target_step: float | None = None
    target_step_lo: float | None = None
    target_step_hi: float | None = None
    band: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] | None = None
    """(steps, lo, hi): the pointwise ``level`` interval of the replicates' curves (without the
    evaluation noise) at steps from 0 to the horizon (or the last step)."""

    def metrics(self) -> dict[str, float]:
        """The ``forecast/*`` metrics of a run's row (METRICS): the plateau, the accuracy at
        the horizon, B, C_mid, the evaluations fitted, the target and the step it is reached at."""
        out = {"forecast/plateau": self.plateau, "forecast/plateau_lo": self.plateau_lo,
               "forecast/plateau_hi": self.plateau_hi, "forecast/exponent": self.curve.b,
               "forecast/midpoint": self.curve.c_mid, "forecast/evals": float(self.evals)}
        if self.final is not None:
            out |= {"forecast/final": self.final, "forecast/final_lo": self.final_lo,
                    "forecast/final_hi": self.final_hi}
        if self.target is not None:
            out |= {"forecast/target": self.target, "forecast/target_step": self.target_step, "forecast/target_step_lo": self.target_step_lo,
                    "forecast/target_step_hi": self.target_step_hi}
        return out

    def describe(self) -> str:
        """A few lines: the curve, the plateau, the accuracy at the horizon, the target."""
        c = self.curve
        pct = f"{self.level:.0%}"
        seen = len(self.clock.steps)
        lines = [f"fit to {self.evals} of the {seen} evaluations up to step {self.last_step}"
                 + (f" (the first, R0, and those after {seen - self.evals} early ones)" if seen > self.evals else "")
                 + f": R(C) = {c.r0:.3f} + "
                 f"({c.a:.3f} - {c.r0:.3f}) / (1 + ({c.c_mid:.4g} / C)^{c.b:.3g}), C = samples generated "
                 f"({self.clock.rate:.1f} a step lately)",
                 f"plateau (A): {self.plateau:.3f} [{pct}: {self.plateau_lo:.3f}, {self.plateau_hi:.3f}]"]
        if self.final is not None:
            lines.append(f"val/acc at step {self.horizon}: {self.final:.3f} [{pct} prediction interval: "
                         f"{self.final_lo:.3f}, {self.final_hi:.3f}]")
        if self.target is not None:
            lines.append(f"val/acc {self.target:g} reached at step {format_step(self.target_step)} [{pct}: "
                         f"{format_step(self.target_step_lo)}, {format_step(self.target_step_hi)}]")
        return "\n".join(lines)


def format_step(step: float | None) -> str:
    """A forecast step: rounded, ``never`` for inf, ``–`` for None."""
    if step is None:
        return "–"
    return "never" if math.isinf(step) else f"{step:.0f}"


def _quantiles(x: np.ndarray, level: float) -> tuple[float, float]:
    """The (α/2, 1 − α/2) quantiles of ``x`` (inverted CDF, as stats.percentile), α = 1 − level."""
    alpha = 1.0 - level
    lo, hi = np.quantile(x, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return float(lo), float(hi)


def forecast(steps: Sequence[int], samples: Sequence[float], acc: Sequence[float], horizon: int | None = None,
             target: float | None = None, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0,
             band_points: int = 0, exclude: float = EXCLUDE) -> Forecast:
    """The forecast from evaluations at ``steps`` (the first before any training), the
    ``samples`` generated up to each, and their accuracy ``acc``: the fitted curve, the plateau,
    the accuracy at step ``horizon`` and the step at which ``target`` is reached, with
    bootstrap intervals at ``level`` from ``resamples`` replicates drawn by
    ``np.random.default_rng(seed)`` (the same inputs give the same forecast).
    ``band_points`` > 0: also the band of the replicates' curves at that many steps;
    ``exclude``: the fraction of the samples whose evaluations are left out of the fit."""
    if not 0 < level < 1:
        raise ValueError(f"forecast: level = {level!r}, expected a number in (0, 1)")
    c, y = _check(samples, acc, exclude)
    clock = Clock(tuple(float(s) for s in steps), tuple(float(x) for x in samples))
    r0, a, b, logm = _fit_many(c, y[None, :])
    curve = Curve(float(r0[0]), float(a[0]), float(b[0]), float(math.exp(logm[0])))
    fitted = curve(c)
    n = len(c) - 1
    resid = y[1:] - fitted[1:]
    resid = (resid - resid.mean()) * math.sqrt(n / (n - 3))
    rng = np.random.default_rng(seed)
    draws = resid[rng.integers(0, n, size=(resamples, n + 1))]
    r0s, as_, bs, logms = _fit_many(c, fitted[None, :] + draws)
    plateau_lo, plateau_hi = _quantiles(as_, level)
    out: dict[str, Any] = {}
    end = horizon if horizon is not None else int(steps[-1])
    if horizon is not None:
        c_h = clock.samples_at(horizon)
        predicted = r0s + (as_ - r0s) * _gain(np.array(c_h), bs, np.exp(logms)) + resid[rng.integers(0, n, resamples)]
        lo, hi = _quantiles(predicted, level)
        out |= {"horizon": int(horizon), "final": float(curve(c_h)), "final_lo": lo, "final_hi": hi}
    if target is not None:
        crossings = np.array([clock.step_at(Curve(r, x, bb, math.exp(m)).reaching(target))
                              for r, x, bb, m in zip(r0s, as_, bs, logms)])
        lo, hi = _quantiles(crossings, level)
        out |= {"target": float(target), "target_step": clock.step_at(curve.reaching(target)),
                "target_step_lo": lo, "target_step_hi": hi}
    if band_points > 0:
        at = np.linspace(0, end, band_points)
        cs = np.array([clock.samples_at(s) for s in at])
        curves = r0s[:, None] + (as_ - r0s)[:, None] * _gain(cs[None, :], bs[:, None], np.exp(logms)[:, None])
        alpha = 1.0 - level
        lo, hi = np.quantile(curves, [alpha / 2, 1 - alpha / 2], axis=0, method="inverted_cdf")
        out["band"] = (tuple(at.tolist()), tuple(lo.tolist()), tuple(hi.tolist()))
    return Forecast(curve, clock, len(c), int(steps[-1]), level, curve.a, plateau_lo, plateau_hi, **out)


def evaluations(rows: Sequence[dict[str, Any]], upto: int | None = None) -> tuple[list[int], list[float], list[float]]:
    """(steps, samples, val/acc) of the evaluations in metrics.jsonl ``rows`` (sorted by step),
    the samples generated up to each (``batch/generated_samples`` summed), up to step ``upto``."""
    steps, samples, acc = [], [], []
    total = 0.0
    for row in sorted(rows, key=lambda r: r["step"]):
        if upto is not None and row["step"] > upto:
            break
        total += row.get("batch/generated_samples", 0.0)
        value = row.get("val/acc")
        if value is not None and math.isfinite(value):
            steps.append(int(row["step"]))
            samples.append(total)
            acc.append(float(value))
    return steps, samples, acc


class RunForecast:
    """The evaluations of a run as it trains, and the forecast after each one.

        tracker = RunForecast(kept_rows, horizon=cfg.train.total_steps, target=cfg.eval.target)
        metrics |= tracker.observe(step, metrics)     # forecast/* on a validation step with enough to fit

    ``rows``: the metrics.jsonl rows a resumed run keeps; the forecast at a step is the one
    ``reasonrl forecast RUN_DIR --upto STEP`` computes (the same evaluations, the same seed)."""

    def __init__(self, rows: Sequence[dict[str, Any]], horizon: int, target: float | None = None) -> None:
        self.steps, self.samples, self.acc = evaluations(rows)
        self.total = sum(r.get("batch/generated_samples", 0.0) for r in rows)
        self.horizon, self.target = horizon, target

    def observe(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Count the step's samples; after a validation with enough evaluations to fit
        (MIN_FITTED), the forecast's metrics, else {}."""
        self.total += metrics.get("batch/generated_samples", 0.0)
        value = metrics.get("val/acc")
        if value is None or not math.isfinite(value):
            return {}
        self.steps.append(step)
        self.samples.append(self.total)
        self.acc.append(float(value))
        try:
            return forecast(self.steps, self.samples, self.acc, self.horizon, self.target).metrics()
        except NotEnoughEvaluations:
            return {}
