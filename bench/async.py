"""Asynchronous against synchronous RL at equal trained samples, interleaved over seeds: one JSON line.

Workloads (both the DAPO recipe: dynamic sampling, clip-higher, token-mean loss, soft
overlong punishment, 16 prompts x 8 samples a step):

  dapo      as shipped: the embedded arithmetic task, 48 new tokens
  longtail  the ``chain`` task family (running sums of 2 to 12 digits, the number of terms
            long-tailed: half the chains have 2 or 3 terms, 1 in 128 all 12), so the longest
            responses are several times the median as in reasoning RL; 100 new tokens, a
            16-token overlong buffer, its own warm start (greedy accuracy 0.25)

Modes: ``sync`` (the trainer on all cores), and ``async`` at each ``--staleness`` (the
decoupled PPO loss, ``algo.off_policy=decoupled``; on this machine the trainer and the
rollout process get half the cores each). Each run is ``reasonrl train`` in a process of
its own for ``--steps`` steps, validated before and after (``eval.n_prompts=256``, 4
samples); the seeds run one after another and within a seed the modes rotate, so every mode
sees the same machine.

Per run: trained samples/s over the steps after the first ``--warmup`` (the rollout process
starts at the run's start, so the first steps can find batches it made during the step-0
validation; skipping them keeps that head start out), whole-run wall time of the steps,
the trainer's idle share (time waiting for a batch / step time), the rollout side's idle
share (idle / (idle + generating + grading)), the staleness of the trained groups (mean of
the per-step means, the largest), dropped stale groups, wasted tokens (generated, never
trained), the trained responses' longest / median length, and the final held-out accuracy.
Summary per workload and mode: medians over seeds, and the median over seeds of the
per-seed ratio to sync (``speedup``) and of the accuracy difference to sync (``acc_delta``).

    python bench/async.py [--seeds 3] [--steps 40] [--workloads dapo,longtail] [--staleness 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reasonrl.metrics import read_jsonl  # noqa: E402
from reasonrl.runtime import available_cores  # noqa: E402

WORKLOADS = {
    "dapo": [],
    # the chain family's own warm start stops at greedy accuracy 0.25 on 128 problems (about
    # 250 steps, 3 minutes on 2 cores)
    "longtail": ["data.families=[chain]", "rollout.max_new_tokens=100", "algo.overlong_buffer=16",
                 "sft.target_acc=0.25", "sft.eval_size=128"],
}


def mode_overrides(mode: str, staleness: int, cores: int) -> list[str]:
    if mode == "sync":
        return ["rollout.mode=sync", f"run.threads={cores}"]
    half = max(1, cores // 2)
    return ["rollout.mode=async", f"rollout.max_staleness={staleness}", "algo.off_policy=decoupled",
            f"run.threads={half}", f"runtime.roles.rollout.threads={max(1, cores - half)}"]


def run_one(workload: str, mode: str, staleness: int, seed: int, args, out: Path) -> dict:
    run_dir = out / f"{workload}-{mode}{staleness if mode != 'sync' else ''}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resume of an earlier one
    overrides = [
        f"run.dir={run_dir}", f"run.seed={seed}", "run.progress=false", f"train.total_steps={args.steps}",
        f"eval.every_steps={args.steps}", "eval.n_prompts=256", "checkpoint.every_steps=0", "checkpoint.every_minutes=0",
        *WORKLOADS[workload], *mode_overrides(mode, staleness, args.cores),
    ]
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "dapo", "--no-supervisor", *overrides],
                          cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{run_dir.name}: exit code {proc.returncode}\n{proc.stderr[-3000:]}")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in rows if r["step"] > 0]
    measured = [r for r in steps if r["step"] > args.warmup]
    total = lambda key, rs=steps: sum(r.get(key, 0.0) for r in rs)  # noqa: E731
    samples = lambda rs: len(rs) * 16 * 8  # noqa: E731  (the recipe's 16 prompts x 8 samples)
    busy = total("timing_s/rollout_gen") + total("timing_s/reward")
    return {
        "workload": workload, "mode": mode if mode == "sync" else f"async{staleness}", "seed": seed,
        "samples_per_s": samples(measured) / total("timing_s/step", measured),
        "steps_wall_s": total("timing_s/step"),
        "run_wall_s": time.time() - began,
        "trainer_idle_frac": total("timing_s/trainer_idle") / total("timing_s/step"),
        "rollout_idle_frac": total("timing_s/rollout_idle") / (total("timing_s/rollout_idle") + busy),
        "staleness_mean": statistics.mean(r["staleness/mean"] for r in steps),
        "staleness_max": max(r["staleness/max"] for r in steps),
        "dropped_stale_groups": total("staleness/dropped_groups"),
        "wasted_tokens": total("rollout/wasted_tokens"),
        "longest_over_median_length": max(r["response_length/max"] for r in steps)
        / statistics.median(r["response_length/median"] for r in steps),
        "acc_before": rows[0]["val/acc"],
        "acc_after": rows[-1]["val/acc"],
    }


def summarise(runs: list[dict]) -> dict:
    out = {}
    for workload in dict.fromkeys(r["workload"] for r in runs):
        by_mode: dict[str, list[dict]] = {}
        for r in runs:
            if r["workload"] == workload:
                by_mode.setdefault(r["mode"], []).append(r)
        sync = {r["seed"]: r for r in by_mode["sync"]}
        out[workload] = {}
        for mode, rs in by_mode.items():
            keys = [k for k in rs[0] if isinstance(rs[0][k], float)]
            entry = {k: round(statistics.median(r[k] for r in rs), 4) for k in keys}
            if mode != "sync":
                entry["speedup"] = round(statistics.median(r["samples_per_s"] / sync[r["seed"]]["samples_per_s"] for r in rs), 3)
                entry["acc_delta"] = round(statistics.median(r["acc_after"] - sync[r["seed"]]["acc_after"] for r in rs), 4)
            out[workload][mode] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workloads", default="dapo,longtail")
    parser.add_argument("--staleness", default="1,2")
    parser.add_argument("--cores", type=int, default=available_cores())
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="/tmp/reasonrl-bench-async")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = [("sync", 0)] + [("async", int(s)) for s in args.staleness.split(",")]
    workloads = args.workloads.split(",")
    for workload in workloads:  # the warm starts, once, before any timed run
        subprocess.run([sys.executable, "-m", "reasonrl.cli", "sft", *WORKLOADS[workload]], cwd=ROOT, check=True,
                       capture_output=True, timeout=args.timeout)
    runs = []
    for seed in range(args.seeds):
        for workload in workloads:
            for i in range(len(modes)):
                mode, staleness = modes[(i + seed) % len(modes)]
                runs.append(run_one(workload, mode, staleness, seed, args, out))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "async", "cores": args.cores, "seeds": args.seeds, "steps": args.steps, "warmup": args.warmup,
                      "summary": summarise(runs), "runs": runs}))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
