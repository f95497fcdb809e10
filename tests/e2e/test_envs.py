"""Each shipped environment's recipe must raise the held-out success rate over its warm start
(read from metrics.jsonl: ``val/acc`` is the share of held-out episodes that succeed, mean over
``eval.k`` samples of 64 initial states never trained).

Slow: these train for real from the environments' cached warm starts (reasonrl/warmstart/env.py,
built once per machine: the imperfect starting policies, which succeed 25-50% of the time).
Figures and commands in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from reasonrl.cli import RECIPES
from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.long]

STEPS = {"grpo_grid": 20, "grpo_tool_arith": 20}


@pytest.mark.parametrize("recipe", list(STEPS))
def test_training_raises_the_success_rate_over_the_starting_policy(recipe, tmp_path):
    steps = STEPS[recipe]
    overrides = [f"run.dir={tmp_path}", f"train.total_steps={steps}", f"eval.every_steps={steps}", "eval.greedy=false",
                 "run.progress=false", "checkpoint.every_steps=0"]
    Controller.from_config(load(RECIPES / f"{recipe}.yaml", overrides), log=lambda *a: None).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    val = [r for r in rows if "val/acc" in r]
    assert [r["step"] for r in val] == [0, steps]
    before, after = val[0]["val/acc"], val[-1]["val/acc"]
    assert after >= before + 0.1, f"{recipe}: held-out success rate {before:.3f} -> {after:.3f}"
    train = [r for r in rows if "env/success_rate" in r]
    assert len(train) == steps and all(r["env/failed"] == 0 for r in train)
