"""The mixture law of a sweep over mix weights (reasonrl/experiments/mixfit.py): which cells
are mixtures, the law recovered from results without noise, its best mix by hand, the linear
law with too few mixtures, and the bootstrap interval around a noisy optimum."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from reasonrl.config import ConfigError
from reasonrl.experiments.mixfit import features, fit_mix, mixtures, simplex_grid
from reasonrl.experiments.summary import RunResult
from reasonrl.experiments.sweep import parse_sweep

DESIGN = ([1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5], [0.2, 0.4, 0.4])


def sweep_of(cells, seeds=3):
    return parse_sweep({"recipe": "dapo", "cells": cells, "seeds": seeds}, "mix.yaml", Path("."))


def law(w):
    """0.5 w1 + 0.6 w2 + 0.4 w3 + 0.8 w1 w2 + 0.1 w1 w3 + 0.2 w2 w3: on the edge w3 = 0,
    y = 0.6 + 0.7 w1 - 0.8 w1^2, largest at w1 = 0.7 / 1.6 = 0.4375 (y = 0.753125), which beats
    every point inside (the w3 terms are smaller)."""
    return 0.5 * w[0] + 0.6 * w[1] + 0.4 * w[2] + 0.8 * w[0] * w[1] + 0.1 * w[0] * w[2] + 0.2 * w[1] * w[2]


def results(sweep, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for cell in sweep.cells:
        w = cell.settings.get("data.weights") or [cell.settings[k] for k in ("w.add", "w.mul", "w.sum")]
        for s in sweep.seeds:
            out[(cell.name, s)] = RunResult([], law(w) + rng.normal(0, noise), 0.0, None)
    return out


def test_a_list_key_or_numeric_keys_that_sum_to_one_are_the_mixture():
    names, w = mixtures(sweep_of([{"data.weights": list(m)} for m in DESIGN]))
    assert names == ["data.weights[0]", "data.weights[1]", "data.weights[2]"] and w.tolist() == [list(m) for m in DESIGN]
    names, w = mixtures(sweep_of([{"w.add": a, "w.mul": b, "w.sum": c} for a, b, c in DESIGN]))
    assert names == ["w.add", "w.mul", "w.sum"] and w[6].tolist() == [0.2, 0.4, 0.4]


@pytest.mark.parametrize("cells, message", [
    ([{"algo.eps_high": 0.2}, {"algo.eps_high": 0.28}], "vary no mixture"),
    ([{"data.weights": [0.5, 0.6]}, {"data.weights": [0.5, 0.5]}], r"weights \[0.5, 0.6\] \(sum 1.1\)"),
    ([{"data.weights": [1.2, -0.2]}, {"data.weights": [0.5, 0.5]}], "expected weights >= 0"),
    ([{"data.weights": [1, 0], "train.lr": 1e-4}, {"data.weights": [0, 1], "train.lr": 2e-4}], "also vary train.lr"),
])
def test_a_sweep_that_is_no_mixture_is_refused_naming_why(cells, message):
    with pytest.raises(ConfigError, match=message):
        mixtures(sweep_of(cells))


def test_the_simplex_grid():
    grid = simplex_grid(3)
    assert len(grid) == math.comb(102, 2) and np.allclose(grid.sum(1), 1) and grid.min() == 0
    assert len(simplex_grid(6)) == math.comb(25, 5)  # 1/20: C(105, 5) = 96M and C(55, 5) = 3.5M are too many


def test_features_are_the_weights_then_their_pairwise_products():
    assert features(np.array([[0.2, 0.3, 0.5]]), True).tolist() == [[0.2, 0.3, 0.5, 0.06, 0.1, 0.15]]
    assert features(np.array([[0.2, 0.8]]), False).tolist() == [[0.2, 0.8]]


def test_the_quadratic_law_is_recovered_and_its_best_mix_found():
    sweep = sweep_of([{"data.weights": list(m)} for m in DESIGN])
    fitted = fit_mix(sweep, results(sweep), resamples=50)
    assert fitted.quadratic and fitted.observations == 21 and fitted.mixtures == 7
    assert fitted.coef == pytest.approx([0.5, 0.6, 0.4, 0.8, 0.1, 0.2], abs=1e-9)
    assert fitted.best == pytest.approx([0.44, 0.56, 0.0])  # the grid point (1/100) nearest 0.4375
    assert fitted.best_acc == pytest.approx(law([0.44, 0.56, 0.0]))
    assert fitted.best_lo == fitted.best_hi == fitted.best  # no noise: every replicate agrees
    assert fitted.measured_best["name"] == sweep.cells[3].name and fitted.inside_hull
    # The law is of the model's form: a left-out cell is predicted exactly from the 6 others,
    # and far better than by their mean.
    assert fitted.loo_rmse == pytest.approx(0.0, abs=1e-9) and fitted.loo_baseline_rmse > 0.1


def test_noise_gives_an_interval_that_holds_the_true_optimum():
    sweep = sweep_of([{"w.add": a, "w.mul": b, "w.sum": c} for a, b, c in DESIGN], seeds=5)
    fitted = fit_mix(sweep, results(sweep, noise=0.01, seed=2), resamples=300)
    assert fitted.best_lo[0] <= 0.4375 <= fitted.best_hi[0] and fitted.best_hi[0] - fitted.best_lo[0] < 0.3
    assert fitted.best_acc_lo <= 0.753125 <= fitted.best_acc_hi
    assert "best static mix" in fitted.describe() and "w.add=" in fitted.describe()


def test_too_few_mixtures_fit_the_linear_law_and_fewer_than_the_sources_none():
    four = sweep_of([{"data.weights": list(m)} for m in DESIGN[:4]])
    fitted = fit_mix(four, results(four), resamples=20)
    assert not fitted.quadratic and len(fitted.coef) == 3
    assert sorted(fitted.best) == [0.0, 0.0, 1.0]  # a linear law's best is a corner
    assert fitted.loo_rmse is not None and fitted.loo_baseline_rmse is not None
    two = sweep_of([{"data.weights": list(m)} for m in DESIGN[:2]])
    with pytest.raises(ConfigError, match="2 mixtures have finished runs; a law over 3 weights needs at least 3"):
        fit_mix(two, results(two))


def test_fit_mix_refuses_a_sweep_of_no_mixture_before_it_trains(tmp_path, capsys):
    from reasonrl.cli import main

    sweep = tmp_path / "clip.yaml"
    sweep.write_text("recipe: dapo\ngrid: {algo.eps_high: [0.2, 0.28]}\nseeds: 2\n")
    assert main(["sweep", str(sweep), "--dir", str(tmp_path / "runs"), "--fit-mix"]) == 2
    assert "--fit-mix: the cells vary no mixture" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
