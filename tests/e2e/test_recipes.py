"""Every recipe must raise held-out accuracy on the embedded task (read from metrics.jsonl).

Slow: these train for real on the cached warm start (built once per machine).
"""

from __future__ import annotations

import pytest

from reasonrl.cli import RECIPES
from reasonrl.config import load
from reasonrl.controller import Trainer
from reasonrl.metrics import read_jsonl

pytestmark = pytest.mark.slow

SHORT = ["train.total_steps=16", "eval.every_steps=8", "eval.n_prompts=96", "run.progress=false"]


@pytest.mark.parametrize("recipe", ["dapo", "grpo", "dr_grpo", "lite_ppo", "ppo"])
def test_recipe_raises_heldout_accuracy(recipe, tmp_path):
    cfg = load(RECIPES / f"{recipe}.yaml", [f"run.dir={tmp_path / recipe}", *SHORT])
    Trainer(cfg).run()
    rows = read_jsonl(tmp_path / recipe / "metrics.jsonl")
    val = [r for r in rows if "val/acc" in r]
    assert [r["step"] for r in val] == [0, 8, 16]
    before, after = val[0]["val/acc"], val[-1]["val/acc"]
    assert after >= before + 0.08, f"{recipe}: held-out accuracy {before:.3f} -> {after:.3f}"
    assert (tmp_path / recipe / "final" / "config.json").is_file()
    train_rows = [r for r in rows if r["step"] > 0]
    assert len(train_rows) == 16 and all("actor/pg_loss" in r and "timing_s/gen" in r for r in train_rows)
