"""The DAPO demo recipe in fp32 and in bf16-mixed: held-out accuracy at equal steps and step time, one JSON line out.

Each seed trains the recipe (``recipes/dapo.yaml``, the embedded warm start) twice, once per
``train.precision``, as ``reasonrl train --no-supervisor`` runs one after the other; the
precision that goes first alternates with the seed, so both see the same machine noise.
Reported per run: the held-out accuracy of the last validation (``val/acc``, mean@k) and of
the best one, the median step time and its stages, and bf16-mixed's sampler/trainer gap
(``rollout/logprob_diff_mean``, ``rollout/logprob_kl``); then, over seeds, the median final
and mean final accuracy of each precision, the accuracy difference per seed, and the ratio of
median step times.

    python bench/precision.py --seeds 0,1,2
    python bench/precision.py --seeds 0 --steps 30       # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from reasonrl.precision import PRECISIONS

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "dapo.yaml"


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def train(run_dir: Path, precision: str, seed: int, args) -> dict:
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "--no-supervisor", f"run.dir={run_dir}",
           f"run.seed={seed}", f"train.precision={precision}", "run.progress=false", f"run.threads={args.threads}"]
    if args.steps:
        cmd += [f"train.total_steps={args.steps}", f"eval.every_steps={max(args.steps // 3, 1)}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    vals = [(r["step"], r["val/acc"]) for r in rows if "val/acc" in r]
    steps = [r for r in rows if "timing_s/step" in r]

    def med(key):
        values = [r[key] for r in steps if key in r]
        return round(statistics.median(values), 4) if values else None

    return {
        "precision": precision, "seed": seed, "final_step": vals[-1][0], "final_val_acc": round(vals[-1][1], 4),
        "best_val_acc": round(max(v for _, v in vals), 4), "start_val_acc": round(vals[0][1], 4),
        "step_s": med("timing_s/step"), "gen_s": med("timing_s/gen"), "old_log_prob_s": med("timing_s/old_log_prob"),
        "update_actor_s": med("timing_s/update_actor"), "logprob_diff_mean": med("rollout/logprob_diff_mean"),
        "logprob_kl": med("rollout/logprob_kl"), "max_memory_gb": med("perf/max_memory_gb"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=0, help="train.total_steps (0: the recipe's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            order = PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]
            for precision in order:
                runs.append(train(Path(tmp) / f"{precision}-{seed}", precision, seed, args))
                log(json.dumps(runs[-1]))
    by = {p: [r for r in runs if r["precision"] == p] for p in PRECISIONS}
    seeds = [r["seed"] for r in by["fp32"]]
    final = {p: {r["seed"]: r["final_val_acc"] for r in by[p]} for p in PRECISIONS}
    step = {p: statistics.median(r["step_s"] for r in by[p]) for p in PRECISIONS}
    print(json.dumps({
        "bench": "precision", "recipe": "recipes/dapo.yaml", "threads": args.threads,
        "median_final_val_acc": {p: statistics.median(final[p].values()) for p in PRECISIONS},
        "mean_final_val_acc": {p: round(statistics.mean(final[p].values()), 4) for p in PRECISIONS},
        "val_acc_diff_per_seed": [round(final["bf16-mixed"][s] - final["fp32"][s], 4) for s in seeds],
        "median_step_s": step, "step_time_ratio_bf16_over_fp32": round(step["bf16-mixed"] / step["fp32"], 3),
        "runs": runs,
    }))


if __name__ == "__main__":
    main()
