"""Every recipe must raise held-out accuracy on the embedded task (read from metrics.jsonl).

Slow: these train for real on the cached warm start (built once per machine, ~3 min on 2
cores). Held-out accuracy is the mean over 4 samples on 256 held-out problems (about +-2.5
points of noise). From this near-deterministic warm start (entropy about 0.08) the gain of one
run depends on its seed's draws: on the AVX-512 EPYC (commit 641d549) dapo, dr_grpo and
lite_ppo gained 20, 17 and 14 points at seed 0 and the test asks them for +5; grpo (20 steps)
gained 19, 18 and 13 at seeds 0-2 and ppo (12 steps) 15, 19 and 7, with a warm start trained on
another CPU as little as -1 and +4 at seed 0, so for those two a seed 0 short of +5 is not the
end: run seed 1 trains too, and the mean over the two must reach +3. The runs are clean, so the guards that read the training itself must
stay quiet: no spike or non-finite incident (the slowdown detector reads wall time, which other
load on the machine can really stretch: tests/unit/test_guards.py replays a clean demo). The DAPO
run trains with runtime.engine=ray (a local cluster; a seeded synchronous Ray run ends with the
local run's weights exactly, tests/integration/test_ray_train.py), so it must reach the band
the local recipes reach; it is also killed at 60% of its steps (SIGKILL under the supervisor,
its cluster with it) and must resume from a checkpoint no older than the recipe's periodic
interval.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from reasonrl.cli import RECIPES
from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.long]

STEPS = {"dapo": 20, "grpo": 20, "dr_grpo": 20, "lite_ppo": 20, "ppo": 12}
"""PPO's steps are about twice as long (32 prompts, a critic, two epochs) and it learns faster per step."""

LEAST_GAIN = 0.05
"""The least gain in held-out accuracy of run seed 0."""

SECOND_SEED = {"grpo": 0.03, "ppo": 0.03}
"""Recipes whose seed 0, short of LEAST_GAIN, is followed by seed 1: the least mean gain of the two."""

RUN_TIMEOUT_S = 900
"""The time one run may take (a test: this per run seed). 2 busy cores (other work on the machine
beside the suite) have stretched one run to 550 s; the suite's per-test 900 s would cut grpo's
and ppo's two runs short."""


def _marks(recipe: str) -> list:
    marks = [pytest.mark.timeout(RUN_TIMEOUT_S * (2 if recipe in SECOND_SEED else 1))]
    return marks + [pytest.mark.xdist_group("ray")] if recipe == "dapo" else marks  # one local cluster at a time


@pytest.mark.parametrize("recipe", [pytest.param(r, marks=_marks(r)) for r in STEPS])
def test_recipe_raises_heldout_accuracy(recipe, tmp_path):
    gains = [_gain(recipe, tmp_path / "seed0", 0)]
    least = LEAST_GAIN
    if gains[0] < LEAST_GAIN and recipe in SECOND_SEED:
        gains.append(_gain(recipe, tmp_path / "seed1", 1))
        least = SECOND_SEED[recipe]
    gain = sum(gains) / len(gains)
    assert gain >= least, f"{recipe}: held-out accuracy gains {[round(g, 3) for g in gains]} (mean {gain:.3f} < {least})"


def _gain(recipe: str, run_dir, seed: int) -> float:
    """One run of ``recipe`` at run seed ``seed``: its held-out accuracy after minus before,
    the run checked along the way."""
    steps = STEPS[recipe]
    overrides = [f"run.dir={run_dir}", f"train.total_steps={steps}", f"eval.every_steps={steps}", "eval.n_prompts=256",
                 "eval.greedy=false", "run.progress=false", f"run.seed={seed}"]
    if recipe == "dapo":
        kill = int(0.6 * steps) + 1  # SIGKILL as step 13 of 20 begins: 12 steps, 60%, are done
        engine = "ray" if importlib.util.find_spec("ray") else "local"
        command = [sys.executable, "-m", "reasonrl.cli", "train", recipe, *overrides, "resilience.backoff_s=0.05",
                   f"faults=[sigkill@{kill}:stage=gen]", f"runtime.engine={engine}"]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [recovered] = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "recovered"]
        interval = load(RECIPES / "dapo.yaml").checkpoint.every_steps
        assert interval > 0 and kill - 1 - interval < recovered["from_step"] <= kill - 1, recovered
    else:
        Controller.from_config(load(RECIPES / f"{recipe}.yaml", overrides)).run()
    incidents = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] in ("spike", "nonfinite")]
    assert incidents == [], incidents
    rows = read_jsonl(run_dir / "metrics.jsonl")
    val = [r for r in rows if "val/acc" in r]
    assert [r["step"] for r in val] == [0, steps]
    assert (run_dir / "final" / "config.json").is_file()
    train_rows = [r for r in rows if r["step"] > 0]
    assert len(train_rows) == steps and all("actor/pg_loss" in r and "timing_s/gen" in r for r in train_rows)
    return val[-1]["val/acc"] - val[0]["val/acc"]
