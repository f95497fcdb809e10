"""A mixture law fitted to a sweep over data-mix weights: the static mix it predicts is best.

    keys, mixes = mixtures(sweep)                  # ConfigError when the cells vary no mixture
    law = fit_mix(sweep, results)                  # results: {(cell name, seed): RunResult}
    print(law.describe())                          # the best mix, its predicted val/acc, intervals

**The mixtures.** A sweep over mix weights varies, from cell to cell, either one key whose
values are lists of K ≥ 2 weights (``data.weights: [0.5, 0.3, 0.2]``) or K ≥ 2 numeric keys
(one weight each); in every cell the weights are ≥ 0 and sum to 1 (within 1e-6). The cells
may differ in nothing else: a law over mixtures cannot tell another setting's effect apart.

**The law: Scheffé's quadratic mixture polynomial**, the quadratic surrogate from mixture to
outcome that MoDoMoDo (arXiv 2505.24871) fits to choose a multi-domain RLVR mix::

    y(w) = Σ_i β_i w_i + Σ_{i<j} β_ij w_i w_j,        w_i ≥ 0, Σ_i w_i = 1

(no intercept and no squares: on the simplex 1 = Σ w_i and w_i² = w_i − Σ_{j≠i} w_i w_j, so
they add nothing). y is a run's final held-out accuracy (val/acc at its last step); every
finished run is one observation, least squares over all of them. The K + K(K−1)/2 terms need as
many distinct mixtures among the cells; with fewer, but at least K, the linear law
``Σ β_i w_i`` is fitted instead (and its best mix is always a single source: it has no term
for one source helping another); with fewer than K, there is nothing to fit. D-CPT Law's form
(arXiv 2406.01375) is a law of the loss in model size, data size and ratio, for pre-training;
with one model and one run length there is nothing here to fit its extra terms to.

**The best mix** maximises the law over a grid of the simplex (every mixture whose weights
are multiples of 1/r, r the finest of 100, 50, 20, 10, 5, 2 that keeps the grid at most
GRID_POINTS mixtures).

**Intervals: the bootstrap over seeds.** Each of RESAMPLES replicates resamples, within every
cell, that cell's runs with replacement, refits the law and finds its best mix; the 95%
percentile intervals are those of the replicates' best weights, of their predicted best
accuracy, and of the law's prediction at the fitted best mix. **Leave one cell out**: each
cell's mean final accuracy predicted by the law fitted to the other cells (where they still
have enough mixtures); its root-mean-square error against that of predicting the mean of the
other cells says whether the law predicts anything at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from reasonrl.config import ConfigError
from reasonrl.experiments.summary import RunResult
from reasonrl.experiments.sweep import Sweep

LEVEL = 0.95
RESAMPLES = 2000
GRID_POINTS = 200_000
"""The most mixtures the best-mix search evaluates."""
TOLERANCE = 1e-6
"""How far a cell's weights may sum from 1."""


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def mixtures(sweep: Sweep) -> tuple[list[str], np.ndarray]:
    """(component names, the mixture of each cell (cells x K)); ConfigError naming the sweep
    file when its cells vary no mixture, a weight is negative, a cell's weights do not sum
    to 1, or the cells differ in another key."""
    cells = sweep.cells
    keys = list(dict.fromkeys(k for c in cells for k in c.settings))
    varied = [k for k in keys if any(c.settings.get(k, _MISSING) != cells[0].settings.get(k, _MISSING) for c in cells)]
    lists = [k for k in varied if all(isinstance(c.settings.get(k), list) and len(c.settings[k]) >= 2
                                      and all(_is_number(v) for v in c.settings[k]) for c in cells)]
    scalars = [k for k in varied if all(_is_number(c.settings.get(k)) for c in cells)]
    if len(lists) == 1 and len({len(c.settings[lists[0]]) for c in cells}) == 1:
        key = lists[0]
        names = [f"{key}[{i}]" for i in range(len(cells[0].settings[key]))]
        weights = np.array([c.settings[key] for c in cells], dtype=float)
        mixed = [key]
    elif not lists and len(scalars) >= 2:
        names, mixed = scalars, scalars
        weights = np.array([[c.settings[k] for k in scalars] for c in cells], dtype=float)
    else:
        raise ConfigError(f"{sweep.source}: --fit-mix: the cells vary no mixture; expected one key whose values are "
                          "lists of weights (data.weights: [0.5, 0.3, 0.2]), or two or more numeric keys, whose "
                          "weights sum to 1 in every cell", "cells")
    others = [k for k in varied if k not in mixed]
    if others:
        raise ConfigError(f"{sweep.source}: --fit-mix: the cells also vary {', '.join(others)}; a mixture law needs "
                          f"cells that differ only in the mixture ({', '.join(mixed)})", others[0])
    for cell, w in zip(cells, weights):
        if np.any(w < 0) or abs(w.sum() - 1) > TOLERANCE:
            raise ConfigError(f"{sweep.source}: --fit-mix: cell {cell.name}: weights {w.tolist()} (sum "
                              f"{w.sum():.6g}); expected weights >= 0 that sum to 1", mixed[0])
    return names, weights


_MISSING = object()


def features(w: np.ndarray, quadratic: bool) -> np.ndarray:
    """The terms of the law at mixtures ``w`` (n x K): w_i, then w_i w_j (i < j) when quadratic."""
    if not quadratic:
        return w
    pairs = [w[:, i] * w[:, j] for i, j in combinations(range(w.shape[1]), 2)]
    return np.column_stack([w, *pairs])


def simplex_grid(k: int) -> np.ndarray:
    """Every mixture of k weights that are multiples of 1/r, r the finest of 100, 50, 20, 10,
    5, 2 with at most GRID_POINTS of them (C(r + k − 1, k − 1))."""
    r = next((r for r in (100, 50, 20, 10, 5, 2) if math.comb(r + k - 1, k - 1) <= GRID_POINTS), 1)
    points = []

    def fill(prefix: list[int], left: int, slots: int) -> None:
        if slots == 1:
            points.append([*prefix, left])
            return
        for v in range(left + 1):
            fill([*prefix, v], left - v, slots - 1)

    fill([], r, k)
    return np.array(points, dtype=float) / r


@dataclass(frozen=True)
class MixLaw:
    """The fitted law, its best mix with intervals, and how well it predicts a left-out cell."""

    names: list[str]
    quadratic: bool
    coef: list[float]
    """β_1..β_K, then β_ij in (i, j) order (i < j) when quadratic."""
    observations: int
    mixtures: int
    best: list[float]
    best_lo: list[float]
    best_hi: list[float]
    best_acc: float
    """The law's val/acc at the best mix."""
    best_acc_lo: float
    best_acc_hi: float
    """The interval of the law's prediction at ``best`` (refitted on the replicates)."""
    measured_best: dict[str, Any]
    """The cell with the highest mean final val/acc: its name, mixture and mean."""
    loo_rmse: float | None
    loo_baseline_rmse: float | None
    """Leave one cell out: the law's RMS error on the cells' means, and that of the mean of
    the other cells (None where too few cells remain)."""
    inside_hull: bool
    """Whether the best mix is a convex combination of the measured mixtures (else the law extrapolates)."""

    def describe(self) -> str:
        law = "quadratic (Scheffé)" if self.quadratic else "linear (too few mixtures for the quadratic terms)"
        mix = ", ".join(f"{n}={w:.2f} [{lo:.2f}, {hi:.2f}]" for n, w, lo, hi in
                        zip(self.names, self.best, self.best_lo, self.best_hi))
        lines = [f"mixture law: {law}, fitted to {self.observations} runs of {self.mixtures} mixtures",
                 f"best static mix (95% bootstrap over seeds): {mix}",
                 f"predicted final val/acc there: {self.best_acc:.3f} [{self.best_acc_lo:.3f}, {self.best_acc_hi:.3f}]"
                 + ("" if self.inside_hull else " (outside the measured mixtures: an extrapolation)"),
                 f"best measured cell: {self.measured_best['name']} (mean final val/acc "
                 f"{self.measured_best['mean']:.3f})"]
        if self.loo_rmse is not None:
            lines.append(f"leave one cell out: RMS error {self.loo_rmse:.3f} (the mean of the other cells: "
                         f"{self.loo_baseline_rmse:.3f})")
        return "\n".join(lines)


def _fit(w: np.ndarray, y: np.ndarray, quadratic: bool) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(features(w, quadratic), y, rcond=None)
    return coef


def _inside_hull(point: np.ndarray, vertices: np.ndarray) -> bool:
    """Whether ``point`` is a convex combination of the rows of ``vertices``: the least-squares
    weights λ ≥ 0, Σ λ = 1 (projected gradient on the simplex) reproduce it within 1e-3."""
    n = len(vertices)
    lam = np.full(n, 1.0 / n)
    step = 1.0 / max(np.linalg.norm(vertices, 2) ** 2, 1e-12)
    for _ in range(5000):  # the gradient of |Vᵀλ − p|² / 2 is V (Vᵀλ − p)
        lam = _project(lam - step * vertices @ (vertices.T @ lam - point))
    return bool(np.linalg.norm(vertices.T @ lam - point) < 1e-3)


def _project(v: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` onto the probability simplex (Duchi et al. 2008)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1
    rho = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
    return np.maximum(v - css[rho] / (rho + 1), 0.0)


def fit_mix(sweep: Sweep, results: dict[tuple[str, int], RunResult], level: float = LEVEL,
            resamples: int = RESAMPLES, seed: int = 0) -> MixLaw:
    """The mixture law of ``sweep``'s finished runs ``results`` (see the module docstring);
    ConfigError when the cells vary no mixture or too few mixtures have finished runs."""
    names, cell_w = mixtures(sweep)
    k = len(names)
    by_cell = [(w, [results[(c.name, s)].final for s in sweep.seeds if (c.name, s) in results])
               for c, w in zip(sweep.cells, cell_w)]
    by_cell = [(w, ys, c) for (w, ys), c in zip(by_cell, sweep.cells) if ys]
    distinct = len({tuple(w) for w, _, _ in by_cell})
    terms = k + k * (k - 1) // 2
    if distinct < k:
        raise ConfigError(f"{sweep.source}: --fit-mix: {distinct} mixtures have finished runs; a law over {k} weights "
                          f"needs at least {k} ({terms} for the quadratic terms)", "cells")
    quadratic = distinct >= terms
    w = np.array([cw for cw, ys, _ in by_cell for _ in ys])
    y = np.array([v for _, ys, _ in by_cell for v in ys])
    coef = _fit(w, y, quadratic)
    grid = simplex_grid(k)
    grid_x = features(grid, quadratic)
    best = grid[int(np.argmax(grid_x @ coef))]
    rng = np.random.default_rng(seed)
    best_w, best_y, at_best = [], [], []
    for _ in range(resamples):
        ys = [np.asarray(ys)[rng.integers(0, len(ys), len(ys))] for _, ys, _ in by_cell]
        c = _fit(w, np.concatenate(ys), quadratic)
        values = grid_x @ c
        i = int(np.argmax(values))
        best_w.append(grid[i])
        best_y.append(values[i])
        at_best.append(float((features(best[None, :], quadratic) @ c)[0]))
    alpha = 1 - level
    q = [alpha / 2, 1 - alpha / 2]
    lo_w, hi_w = np.quantile(np.array(best_w), q, axis=0, method="inverted_cdf")
    acc_lo, acc_hi = np.quantile(np.array(at_best), q, method="inverted_cdf")
    means = [(c.name, cw, float(np.mean(ys))) for cw, ys, c in by_cell]
    top = max(means, key=lambda m: m[2])
    loo, base = _leave_one_out(by_cell, k, quadratic)
    return MixLaw(names, quadratic, [float(x) for x in coef], len(y), distinct, best.tolist(), lo_w.tolist(),
                  hi_w.tolist(), float((features(best[None, :], quadratic) @ coef)[0]), float(acc_lo), float(acc_hi),
                  {"name": top[0], "mixture": top[1].tolist(), "mean": top[2]}, loo, base,
                  _inside_hull(best, np.unique(cell_w, axis=0)))


def _leave_one_out(by_cell: list, k: int, quadratic: bool) -> tuple[float | None, float | None]:
    """(the law's RMS error on each left-out cell's mean, that of the other cells' mean); None
    when leaving a cell out leaves too few mixtures for the law."""
    terms = k + k * (k - 1) // 2 if quadratic else k
    errors, baseline = [], []
    for i, (cw, ys, _) in enumerate(by_cell):
        rest = [x for j, x in enumerate(by_cell) if j != i]
        if len({tuple(w) for w, _, _ in rest}) < terms:
            return None, None
        w = np.array([rw for rw, rys, _ in rest for _ in rys])
        y = np.array([v for _, rys, _ in rest for v in rys])
        coef = _fit(w, y, quadratic)
        errors.append(float((features(cw[None, :], quadratic) @ coef)[0]) - float(np.mean(ys)))
        baseline.append(float(np.mean(y)) - float(np.mean(ys)))
    return float(np.sqrt(np.mean(np.square(errors)))), float(np.sqrt(np.mean(np.square(baseline))))


def law_json(law: MixLaw) -> dict[str, Any]:
    """mix_fit.json: the law and its best mix."""
    return {"law": "scheffe-quadratic" if law.quadratic else "scheffe-linear", "level": LEVEL, **vars(law)}
