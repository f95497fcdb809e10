"""The sweep file (reasonrl/experiments/sweep.py) and the summary of a sweep's runs
(reasonrl/experiments/summary.py), without training."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from reasonrl.config import ConfigError
from reasonrl.experiments.summary import (RunResult, curves_figure, format_table, read_result, summarize, summary_csv,
                                          summary_json, write_summary)
from reasonrl.experiments.runner import plan
from reasonrl.experiments.sweep import RECIPES, cell_name, parse_sweep, read_sweep

BASE = {"recipe": "grpo", "set": {"train.total_steps": 30, "eval": {"every_steps": 10}}, "seeds": [0, 1]}


def sweep_of(tmp_path: Path, overrides=(), **keys):
    return parse_sweep({**BASE, **keys}, "s.yaml", tmp_path, overrides)


def test_a_grid_becomes_cells_and_runs_go_seed_major(tmp_path):
    s = sweep_of(tmp_path, grid={"algo.eps_high": [0.2, 0.28], "algo.loss_agg": ["token-mean", "seq-mean-token-mean"]},
                 baseline={"algo": {"eps_high": 0.2, "loss_agg": "token-mean"}}, target=0.5)
    assert [c.settings for c in s.cells] == [
        {"algo.eps_high": 0.2, "algo.loss_agg": "token-mean"}, {"algo.eps_high": 0.2, "algo.loss_agg": "seq-mean-token-mean"},
        {"algo.eps_high": 0.28, "algo.loss_agg": "token-mean"}, {"algo.eps_high": 0.28, "algo.loss_agg": "seq-mean-token-mean"}]
    assert s.baseline is s.cells[0] and s.recipe == RECIPES / "grpo.yaml" and s.target == 0.5
    assert s.settings == {"train.total_steps": 30, "eval.every_steps": 10}
    runs = s.runs(tmp_path / "d")
    assert [(r.cell.name, r.seed) for r in runs] == [(c.name, seed) for seed in (0, 1) for c in s.cells]
    assert runs[1].dir == tmp_path / "d" / "algo.eps_high=0.2__algo.loss_agg=seq-mean-token-mean" / "seed_0"


def test_each_run_config_is_recipe_set_cell_seed_and_dir(tmp_path):
    s = sweep_of(tmp_path, cells=[{"algo.eps_high": 0.28, "train.lr": 3e-4}], set={"train.lr": 1e-4, "run.threads": 1})
    [run] = s.runs(tmp_path / "d")[:1]
    cfg = s.config(run)
    assert (cfg.algo.eps_high, cfg.train.lr, cfg.run.seed, cfg.run.dir) == (0.28, 3e-4, 0, str(run.dir))
    assert (cfg.run.progress, cfg.run.log_every, cfg.run.threads) == (False, 0, 1)
    assert cfg.algo.adv_estimator == "grpo"  # from the recipe
    parallel = sweep_of(tmp_path, ["sweep.parallel=2"])
    assert parallel.options.parallel == 2 and parallel.config(parallel.runs(tmp_path)[0], cores=7).run.threads == 3
    assert sweep_of(tmp_path, ["train.lr=2e-4"]).settings["train.lr"] == 2e-4  # added to set


def test_the_resolved_sweep_reads_back_equal(tmp_path):
    s = sweep_of(tmp_path, grid={"algo.eps_high": [0.2, 0.28]}, baseline={"algo.eps_high": 0.28}, target=0.4,
                 sweep={"parallel": 2}, expect="no difference", margin=0.02)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(s.to_dict()))
    back = read_sweep(path)
    assert dataclasses.replace(back, source=s.source) == s and (back.expect, back.margin) == ("no difference", 0.02)


def test_recipes_are_found_beside_the_sweep_file_or_packaged(tmp_path):
    (tmp_path / "mine.yaml").write_text("algo: {eps_high: 0.3}\n")
    assert sweep_of(tmp_path, recipe="mine.yaml").recipe == tmp_path / "mine.yaml"
    assert sweep_of(tmp_path, recipe="dapo.yaml").recipe == RECIPES / "dapo.yaml"
    with pytest.raises(ConfigError, match="recipe = 'nope'.*packaged recipe.*dapo"):
        sweep_of(tmp_path, recipe="nope")


@pytest.mark.parametrize("keys, message", [
    ({"grid": {"algo.eps_high": [0.2]}, "cells": [{}]}, "grid and cells are both given"),
    ({"grid": {"algo.eps_high": 0.2}}, r"grid: algo.eps_high = 0.2: expected a non-empty list"),
    ({"cells": [{"algo.eps_high": 0.2}, {"algo": {"eps_high": 0.2}}]}, "is given twice"),
    ({"cells": [{"algo.eps_high": 0.2}], "baseline": {"algo.eps_high": 0.3}}, r"baseline .* is none of the cells"),
    ({"set": {"run.seed": 3}}, "set sets run.seed, which the sweep sets"),
    ({"cells": [{"run.dir": "x"}]}, r"cells\[0\] sets run.dir"),
    ({"seeds": [0, 0]}, "seeds = \\[0, 0\\]: expected a list of distinct integers"),
    ({"seeds": []}, "expected a list of distinct integers"),
    ({"target": 1.5}, r"target = 1.5: expected a held-out accuracy in \[0, 1\]"),
    ({"expect": "higher"}, r"expect = 'higher': expected better, worse, no difference"),
    ({"expect": "no difference"}, r"margin = None: expect: no difference needs a margin"),
    ({"expect": "better", "margin": 0.03}, r"margin = 0.03: a margin belongs to expect: no difference"),
    ({"sweep": {"parallel": 0}}, "sweep.parallel = 0: expected an integer >= 1"),
    ({"sweep": {"workers": 2}}, "unknown key sweep.workers"),
    ({"seed": [1]}, "unknown key seed; a sweep file has recipe, set, grid, cells, seeds"),
])
def test_bad_sweep_files_name_the_key(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        sweep_of(tmp_path, **keys)


def test_bad_run_settings_name_the_file_and_cell(tmp_path):
    s = sweep_of(tmp_path, cells=[{"algo.eps_hgh": 0.2}])
    with pytest.raises(ConfigError, match=r"s.yaml, cell algo.eps_hgh=0.2: .*unknown key algo.eps_hgh; did you mean algo.eps_high"):
        s.config(s.runs(tmp_path)[0])
    s = sweep_of(tmp_path, set={"eval.every_steps": 0})
    with pytest.raises(ConfigError, match="eval.every_steps = 0: a sweep compares held-out accuracy"):
        s.config(s.runs(tmp_path)[0])
    s = sweep_of(tmp_path, ["sweep.parallel=2"], cells=[{"runtime.engine": "local"}, {"runtime.engine": "ray"}])
    with pytest.raises(ConfigError, match=r"s.yaml: runtime.engine differs between runs \('local', 'ray'\) with "
                                          "sweep.parallel = 2: the runs that train at once all run on this machine"):
        plan(s, tmp_path / "sweep")
    assert len(plan(sweep_of(tmp_path, ["sweep.parallel=2"], set={"runtime.engine": "ray"}), tmp_path / "r")) == 2
    assert sweep_of(tmp_path, seeds=3).seeds == (0, 1, 2)
    with pytest.raises(ConfigError, match="s.yaml: recipe: missing"):
        parse_sweep({"seeds": [0]}, "s.yaml", tmp_path)
    (tmp_path / "bad.yaml").write_text("recipe: [\n")
    with pytest.raises(ConfigError, match="bad.yaml: invalid YAML"):
        read_sweep(tmp_path / "bad.yaml")


def test_cell_names_are_file_names_and_distinct():
    assert cell_name({}) == "default"
    assert cell_name({"algo.eps_high": 0.28, "algo.loss_agg": "token-mean"}) == "algo.eps_high=0.28__algo.loss_agg=token-mean"
    a, b = cell_name({"data.families": ["add", "mul"]}), cell_name({"data.families": ["add/mul"]})
    assert a != b and "/" not in a + b and a.startswith("data.families=__add_,__mul__-")
    long = cell_name({f"k{i}": "v" * 20 for i in range(8)})
    assert len(long) == 100 and long != cell_name({f"k{i}": "v" * 20 for i in range(9)})


def metrics(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_read_result_counts_samples_and_seconds_to_the_target(tmp_path):
    run = metrics(tmp_path / "r", [
        {"step": 0, "val/acc": 0.25, "timing_s/testing": 2.0},
        {"step": 1, "batch/generated_samples": 64.0, "timing_s/step": 3.0},
        {"step": 2, "batch/generated_samples": 80.0, "timing_s/step": 4.0, "val/acc": 0.5, "timing_s/testing": 1.0},
        {"step": 3, "batch/generated_samples": 64.0, "timing_s/step": 3.0, "val/acc": 0.375, "timing_s/testing": 1.0},
    ])
    result = read_result(run, 0.5)
    assert result == RunResult([(0, 0.25), (2, 0.5), (3, 0.375)], 0.375, 0.5, (2, 144.0, 10.0))
    assert read_result(run, 0.6).to_target is None and read_result(run, None).to_target is None
    assert read_result(metrics(tmp_path / "no_val", [{"step": 1}]), 0.5) is None


def test_summarize_pairs_seeds_with_the_baseline(tmp_path):
    s = sweep_of(tmp_path, grid={"algo.eps_high": [0.2, 0.28, 0.32]}, seeds=[0, 1, 2], target=0.5)
    base, high, higher = (c.name for c in s.cells)

    def result(final: float, reached=None) -> RunResult:
        return RunResult([(0, 0.3), (10, final)], final, final, reached)

    results = {(base, 0): result(0.4), (base, 1): result(0.4), (base, 2): result(0.5, (10, 640.0, 20.0)),
               (high, 0): result(0.5, (10, 600.0, 30.0)), (high, 1): result(0.7, (10, 700.0, 40.0)),
               (high, 2): result(0.6, (10, 800.0, 50.0)),
               (higher, 0): result(0.45), (higher, 2): result(0.45)}  # seed 1 not finished
    cells = summarize(s, results)
    b, h, hh = cells
    assert b.verdict == "baseline" and b.diff is None and b.seeds == [0, 1, 2]
    assert b.final_mean == pytest.approx(1.3 / 3) and b.reached == 1 and b.samples_to_target == 640.0
    assert (h.diff, h.diff_lo, h.diff_hi) == pytest.approx((0.5 / 3, 0.1, 0.3)) and h.verdict == "better"
    assert (h.steps_to_target, h.samples_to_target, h.seconds_to_target) == (10.0, 700.0, 40.0)
    # seeds 0 and 2 against the baseline's: differences +0.05 and -0.05
    assert hh.seeds == [0, 2] and hh.diff_seeds == 2 and hh.verdict == "no difference"
    assert (hh.diff_lo, hh.diff_hi) == pytest.approx((-0.05, 0.05)) and hh.reached == 0
    assert [p["step"] for p in h.curve] == [0, 10] and h.curve[1]["mean"] == pytest.approx(0.6)

    rows = list(csv.DictReader(io.StringIO(summary_csv(cells))))
    assert [(r["algo.eps_high"], r["seeds"], r["verdict"]) for r in rows] == [
        ("0.2", "3", "baseline"), ("0.28", "3", "better"), ("0.32", "2", "no difference")]
    assert rows[0]["diff"] == "" and float(rows[1]["diff_lo"]) == pytest.approx(0.1)
    data = summary_json(s, cells)
    assert data["baseline"] == {"algo.eps_high": 0.2} and data["target"] == 0.5
    assert "finding" not in format_table(cells, 0.5).splitlines()[0]  # no expectation stated: no column
    # stated before the runs: the higher clip is better
    expecting = summarize(dataclasses.replace(s, expect="better"), results)
    assert [c.finding for c in expecting] == [None, "reproduced", "inconclusive"]
    header, *rows = format_table(expecting, 0.5).splitlines()
    assert "finding" in header and "reproduced" in rows[2] and "inconclusive" in rows[3]
    assert summary_json(dataclasses.replace(s, expect="better"), expecting)["expect"] == "better"
    # stated as no difference within 0.06: [-0.05, 0.05] rules out a larger one; [0.1, ...] does not
    equal = dataclasses.replace(s, expect="no difference", margin=0.06)
    assert [c.finding for c in summarize(equal, results)] == [None, "not reproduced", "reproduced"]
    assert summary_json(equal, cells)["margin"] == 0.06
    for cell in data["cells"]:
        assert {"settings", "final_mean", "final_lo", "final_hi", "diff", "diff_lo", "diff_hi", "verdict"} <= set(cell)
    curves = curves_figure(cells, 0.5)
    renderer = FigureCanvasAgg(curves).get_renderer()
    [legend], [ax] = curves.legends, curves.axes
    assert len(legend.get_texts()) == 4  # three cells and the target
    assert legend.get_window_extent(renderer).y1 < ax.get_window_extent(renderer).y0  # below the axes, over no band
    written = write_summary(tmp_path, s, cells)
    assert [p.name for p in written] == ["summary.csv", "summary.json", "report.html", "curves.png", "diffs.png"]
    assert json.loads((tmp_path / "summary.json").read_text())["cells"][1]["verdict"] == "better"


def test_the_shipped_sweep_files_and_every_run_config_load():
    shipped = sorted((Path(__file__).resolve().parents[2] / "sweeps").rglob("*.yaml"))
    assert shipped
    for path in shipped:
        s = read_sweep(path)
        for run in s.runs("runs/x"):
            s.config(run)
