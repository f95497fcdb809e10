"""Forecasts of held-out accuracy (reasonrl/experiments/forecast.py): the curve by hand, exact
recovery of known parameters, the bootstrap intervals' coverage on noisy synthetic curves,
the run's tracker, the console line and ``reasonrl forecast``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reasonrl.cli import main
from reasonrl.experiments.forecast import (Clock, Curve, NotEnoughEvaluations, RunForecast, evaluations,
                                           fit, forecast)
from reasonrl.metrics import console_line, validation_summary

TRUE = Curve(r0=0.35, a=0.85, b=1.6, c_mid=9000.0)
STEPS = list(range(0, 151, 5))
SAMPLES = [0.0] + [200.0 * s for s in STEPS[1:]]


def test_the_curve_and_its_crossing_by_hand():
    c = Curve(r0=0.2, a=0.8, b=2.0, c_mid=100.0)
    # R(C) = 0.2 + 0.6 / (1 + (100 / C)^2): 0.2 at 0, 0.5 at the midpoint, 0.2 + 0.6 / 1.25 = 0.68 at 200
    assert c([0.0, 100.0, 200.0]).tolist() == pytest.approx([0.2, 0.5, 0.68], abs=1e-12)
    assert c.reaching(0.5) == pytest.approx(100.0)
    # 0.7: (0.6 / 0.5 - 1)^(-1/2) = 0.2^(-0.5) = sqrt(5)
    assert c.reaching(0.7) == pytest.approx(100.0 * math.sqrt(5))
    assert c.reaching(0.8) == math.inf and c.reaching(0.9) == math.inf  # the plateau is never reached
    assert c.reaching(0.1) == 0.0 and c.reaching(0.2) == 0.0  # R0 already is
    falling = Curve(r0=0.6, a=0.3, b=1.0, c_mid=50.0)
    assert falling(50.0) == pytest.approx(0.45) and falling.reaching(0.7) == math.inf


@pytest.mark.parametrize("true, points", [
    (TRUE, len(STEPS)), (TRUE, 10),  # the whole run, and its first 30%
    (Curve(0.6, 0.3, 0.7, 2000.0), len(STEPS)), (Curve(0.6, 0.3, 0.7, 2000.0), 10),  # falling
    (Curve(0.1, 0.95, 4.0, 25000.0), len(STEPS)),  # a sharp, late bend (past the first 30%)
])
def test_exact_recovery_of_known_parameters_without_noise(true, points):
    got = fit(SAMPLES[:points], true(np.array(SAMPLES[:points])))
    assert got.r0 == true.r0
    assert got.a == pytest.approx(true.a, rel=1e-4)
    assert got.b == pytest.approx(true.b, rel=1e-4)
    assert got.c_mid == pytest.approx(true.c_mid, rel=1e-4)


def test_a_flat_series_fits_its_level_and_bounds_hold():
    flat = fit(SAMPLES[:8], [0.4] * 8)
    assert flat.r0 == 0.4 and flat.a == pytest.approx(0.4)
    # Still rising steeply at the last point: A would pass 1 unbounded; it stops at the bound.
    steep = fit(SAMPLES[:8], [0.1, 0.3, 0.5, 0.7, 0.85, 0.95, 1.0, 1.0])
    assert steep.a <= 1.0 and 0.25 <= steep.b <= 8.0


def test_too_few_evaluations_is_a_clear_answer():
    with pytest.raises(NotEnoughEvaluations, match="4 to fit after the first; a forecast fits 5"):
        forecast(STEPS[:5], SAMPLES[:5], [0.3, 0.4, 0.5, 0.55, 0.6])
    # Six after the first, but the first quarter of the samples (below 1500 of 6000) holds one:
    # it is left out of the fit, and 5 remain.
    assert forecast(STEPS[:7], SAMPLES[:7], [0.3, 0.4, 0.5, 0.55, 0.6, 0.62, 0.63]).evals == 6
    with pytest.raises(NotEnoughEvaluations, match=r"4 to fit after the first \(2 in the first 40% of the samples"):
        forecast(STEPS[:7], SAMPLES[:7], [0.3, 0.4, 0.5, 0.55, 0.6, 0.62, 0.63], exclude=0.4)
    with pytest.raises(ValueError, match="decrease"):
        fit([0, 10, 5, 20, 30, 40], [0.3] * 6)


def test_clock_interpolates_and_extrapolates_by_the_later_rate():
    # Steps 0, 10, 20, 30, 40 with samples 0, 100, 200, 400, 600: the later half (steps 20-40)
    # generated 400 samples in 20 steps, 20 a step.
    clock = Clock((0, 10, 20, 30, 40), (0, 100, 200, 400, 600))
    assert clock.rate == 20.0
    assert clock.samples_at(25) == 300.0 and clock.samples_at(50) == 800.0
    assert clock.step_at(150.0) == 15.0 and clock.step_at(1000.0) == 60.0 and clock.step_at(math.inf) == math.inf


def test_intervals_cover_at_about_their_rate_on_noisy_curves():
    """Curves drawn at random, evaluations with normal noise (sd 0.02, as 128 prompts x 4
    samples give): fitted to the first 30% of the evaluations, the 95% prediction interval of
    the last one holds it about 95% of the time, and is not the trivial [0, 1]."""
    rng = np.random.default_rng(7)
    c = np.array(SAMPLES)
    hits, widths, plateau_hits, plateau_widths = 0, [], 0, []
    trials = 40  # 60 trials of 300 replicates: 57 and 58 of 60 held (0.95, 0.97)
    for i in range(trials):
        true = Curve(rng.uniform(0.3, 0.4), rng.uniform(0.7, 0.9), rng.uniform(1.0, 2.5), rng.uniform(5000, 15000))
        y = true(c) + rng.normal(0, 0.02, len(c))
        early = forecast(STEPS[:10], c[:10], y[:10], horizon=150, resamples=200, seed=i)
        hits += early.final_lo <= y[-1] <= early.final_hi
        widths.append(early.final_hi - early.final_lo)
        whole = forecast(STEPS, c, y, resamples=200, seed=i)
        plateau_hits += whole.plateau_lo <= true.a <= whole.plateau_hi
        plateau_widths.append(whole.plateau_hi - whole.plateau_lo)
    assert 0.85 <= hits / trials <= 1.0 and 0.85 <= plateau_hits / trials <= 1.0
    assert float(np.median(widths)) < 0.4 and float(np.median(plateau_widths)) < 0.2  # not the trivial [0, 1]


def test_forecast_names_its_metrics_and_is_reproducible():
    y = TRUE(np.array(SAMPLES)) + np.random.default_rng(1).normal(0, 0.02, len(SAMPLES))
    fc = forecast(STEPS[:10], SAMPLES[:10], y[:10], horizon=150, target=0.8)
    again = forecast(STEPS[:10], SAMPLES[:10], y[:10], horizon=150, target=0.8)
    assert fc == again  # one seed: the same inputs give the same forecast
    m = fc.metrics()
    assert set(m) == {"forecast/plateau", "forecast/plateau_lo", "forecast/plateau_hi", "forecast/final",
                      "forecast/final_lo", "forecast/final_hi", "forecast/exponent", "forecast/midpoint",
                      "forecast/evals", "forecast/target", "forecast/target_step", "forecast/target_step_lo",
                      "forecast/target_step_hi"}
    assert m["forecast/evals"] == 8 and m["forecast/target"] == 0.8  # samples 1000, 2000 < 9000 / 4 left out
    assert m["forecast/plateau_lo"] <= m["forecast/plateau"] <= m["forecast/plateau_hi"]
    assert m["forecast/target_step_lo"] <= m["forecast/target_step"] <= m["forecast/target_step_hi"]
    assert m["forecast/final"] == pytest.approx(float(fc.curve(150 * 200.0)))  # 200 samples a step
    without = forecast(STEPS[:10], SAMPLES[:10], y[:10]).metrics()
    assert "forecast/final" not in without and "forecast/target_step" not in without


def _rows(values, per_step=200.0):
    """metrics.jsonl rows: a step every step, a validation every 5 (values at 0, 5, 10, ...)."""
    rows = []
    for step in range(0, 5 * (len(values) - 1) + 1):
        row = {"step": step} | ({"batch/generated_samples": per_step} if step else {})
        if step % 5 == 0:
            row["val/acc"] = values[step // 5]
        rows.append(row)
    return rows


def test_evaluations_sum_the_samples_up_to_each_validation():
    rows = _rows([0.3, 0.4, 0.5])
    assert evaluations(rows) == ([0, 5, 10], [0.0, 1000.0, 2000.0], [0.3, 0.4, 0.5])
    assert evaluations(rows, upto=7) == ([0, 5], [0.0, 1000.0], [0.3, 0.4])


def test_the_run_tracker_equals_the_forecast_of_the_rows_and_survives_a_resume():
    values = [float(v) for v in TRUE(np.array(SAMPLES[:9]))]
    rows = _rows(values)
    straight = RunForecast([], horizon=150, target=0.8)
    logged = [straight.observe(r["step"], r) for r in rows]
    # At step 25 the first validation after it (samples 1000 of 5000) is in the first quarter:
    # 4 to fit. At step 30 it is still left out (1000 < 1500), and 5 remain.
    assert all(m == {} for m in logged[:30]) and logged[30]["forecast/evals"] == 6
    steps, samples, acc = evaluations(rows, upto=30)
    assert logged[30] == forecast(steps, samples, acc, 150, 0.8).metrics()
    resumed = RunForecast(rows[:21], horizon=150, target=0.8)  # a checkpoint at step 20
    assert [resumed.observe(r["step"], r) for r in rows[21:]] == logged[21:]


def test_console_line_and_run_summary_show_the_forecast():
    values = {"val/acc": 0.55, "forecast/plateau": 0.8461, "forecast/plateau_lo": 0.609, "forecast/plateau_hi": 1.0,
              "forecast/target": 0.8, "forecast/target_step": 163.4, "forecast/target_step_lo": 87.0,
              "forecast/target_step_hi": math.inf}
    assert console_line(45, 150, {"train/acc": 0.5, **values}) == (
        "step 45/150 acc=0.5 val=0.55 plateau=0.846 [0.609, 1.000] 0.8@step=163 [87, never]")
    assert validation_summary({"actor/pg_loss": 1.0, **values})["forecast/target_step_hi"] == "inf"


def test_reasonrl_forecast_fits_the_early_validations_of_a_run(tmp_path, capsys):
    y = TRUE(np.array(SAMPLES)) + np.random.default_rng(3).normal(0, 0.02, len(SAMPLES))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([float(v) for v in y])))
    assert main(["forecast", str(run), "--at", "0.3", "--target", "0.8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = forecast(STEPS[:10], SAMPLES[:10], y[:10], 150, 0.8)  # no config.yaml: the last step is the horizon
    assert out["upto"] == 45 and out["evals"] == 8 and out["horizon"] == 150  # steps 5 and 10 left out
    assert out["plateau"] == [expected.plateau, expected.plateau_lo, expected.plateau_hi]
    assert out["final"] == [expected.final, expected.final_lo, expected.final_hi]
    assert out["measured_final"] == y[-1] and out["inside"] == (expected.final_lo <= y[-1] <= expected.final_hi)
    assert main(["forecast", str(run), "--upto", "45", "--target", "0.8"]) == 0
    text = capsys.readouterr().out
    assert "fit to 8 of the 10 evaluations up to step 45 (the first, R0, and those after 2 early ones)" in text and "measured val/acc at step 150" in text
    assert main(["forecast", str(run), "--upto", "20"]) == 2
    assert "not enough evaluations: 4 to fit after the first" in capsys.readouterr().err
