"""Scaling on this machine: trainer ranks, rollout workers, Ray's overhead, weight sync; one JSON line.

Three measurements, each configuration in a fresh process, the configurations interleaved
over ``--seeds`` (machines are noisy: compare inside one run, medians):

1. **Trained samples/s** of the DAPO recipe (embedded task, warm start) with
   ``runtime.trainer_ranks`` 1 and 2 and ``runtime.roles.rollout.count`` 1 and 2: rows trained
   per second of step time, median over the steps after ``--warmup``.
2. **Ray's overhead** at equal work: the same seeded lockstep run (staleness 0, the rollout
   side in a process of its own) with ``runtime.engine=local`` (a forkserver child over a
   pipe) and ``runtime.engine=ray`` (an actor of a local cluster); the ratio of their median
   step times minus 1.
3. **Weight sync per version**: a WeightsUpdate of the embedded model's and of a
   Qwen2.5-0.5B-shaped model's parameters (random weights, float32 and bfloat16) handed to a
   receiver in a forkserver process (``ProcessGroup``) and to a Ray actor (``RayGroup``, one
   ``ray.put`` per version), each ``--versions`` times; median seconds from the call until the
   receiver holds it (``timing_s/weight_sync``'s definition), leaving out the first two
   versions, which fault in the receiver's and the store's pages (reported apart).

    python bench/scale.py                   # everything, 3 seeds
    python bench/scale.py --parts sync      # only the weight sync
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "dapo.yaml"
THROUGHPUT = {"ranks=1,rollout=1": [], "ranks=2,rollout=1": ["runtime.trainer_ranks=2"],
              "ranks=1,rollout=2": ["runtime.roles.rollout.count=2"]}
OVERHEAD = {"local": ["rollout.mode=lockstep"], "ray": ["runtime.engine=ray"]}
"""runtime.engine=ray runs rollout.mode=sync as lockstep at staleness 0: the same work as local lockstep."""


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def run_config(name: str, extra: list[str], seed: int, steps: int, warmup: int, tmp: Path) -> dict:
    """One training run in a process of its own; its median step time and trained rows/s."""
    from reasonrl.config import load
    from reasonrl.metrics import read_jsonl

    run_dir = tmp / f"{name.replace(',', '_').replace('=', '')}-{seed}"
    overrides = [f"run.dir={run_dir}", f"run.seed={seed}", f"train.total_steps={steps}", "eval.every_steps=0",
                 "checkpoint.every_steps=0", "checkpoint.every_minutes=0", "run.progress=false", "run.loggers=[]", *extra]
    command = [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "--no-supervisor", *overrides]
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        return {"config": name, "seed": seed, "error": out.stderr.strip().splitlines()[-1:]}
    rows = read_jsonl(run_dir / "metrics.jsonl")[warmup:]
    cfg = load(RECIPE, overrides)
    per_step = cfg.train.prompts_per_step * cfg.rollout.n
    step_s = statistics.median(r["timing_s/step"] for r in rows)
    return {"config": name, "seed": seed, "step_s": round(step_s, 3), "samples_per_s": round(per_step / step_s, 2),
            "weight_sync_s": round(statistics.median(r["timing_s/weight_sync"] for r in rows), 4),
            "update_s": round(statistics.median(r["timing_s/update_actor"] for r in rows), 3),
            "gen_s": round(statistics.median(r["timing_s/gen"] for r in rows), 3)}


def interleaved(configs: dict[str, list[str]], seeds: list[int], steps: int, warmup: int, tmp: Path) -> list[dict]:
    results = []
    for seed in seeds:
        for name, extra in configs.items():
            results.append(run_config(name, extra, seed, steps, warmup, tmp))
            log(json.dumps(results[-1]))
    return results


def medians(results: list[dict], key: str) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in results:
        if key in r:
            by.setdefault(r["config"], []).append(r[key])
    return {name: round(statistics.median(v), 3) for name, v in by.items()}


# ------------------------------------------------------------------ weight sync
class Receiver:
    """Holds the last weights handed to it (a rollout worker's load, without the copy into a module)."""

    def __init__(self) -> None:
        self.version = -1

    def load_weights(self, update) -> int:
        self.version = update.version
        return update.version


def model_tensors(shape: str, dtype: str) -> dict:
    """Parameters of the embedded model or of a Qwen2.5-0.5B-shaped one (random, built in memory)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.memory import QWEN25_05B
    from reasonrl.models.loading import build_tiny_model
    from reasonrl.data.tokenizer import build_char_tokenizer

    if shape == "embedded":
        tok = build_char_tokenizer()
        model = build_tiny_model(len(tok), 192, 4, 6, 2, 512, tok.pad_token_id, tok.eos_token_id, seed=0)
    else:
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B))
        model = model.to_empty(device="cpu")
    return {name: p.detach().to(getattr(torch, dtype)).normal_() for name, p in model.named_parameters()}


WARM_VERSIONS = 2
"""Versions left out of the weight-sync medians (reported as ``first_s``): the first ones touch
the receiver's and the object store's pages for the first time (page faults, several seconds
for gigabytes on a loaded machine); later versions reuse them, as a run's do."""


def weight_sync(versions: int) -> list[dict]:
    """Seconds per version into a process and into a Ray actor, per model and dtype."""
    from reasonrl.config import RuntimeConfig
    from reasonrl.runtime import ProcessGroup
    from reasonrl.runtime import ray as rayrt
    from reasonrl.types import WeightsUpdate

    cases = [("embedded", "float32"), ("qwen2.5-0.5b", "float32"), ("qwen2.5-0.5b", "bfloat16")]
    tensors = {case: model_tensors(*case) for case in cases}
    largest = max(sum(t.numel() * t.element_size() for t in ts.values()) for ts in tensors.values())
    cluster = rayrt.connect(RuntimeConfig(), object_store_bytes=2 * largest + (64 << 20))
    results = []
    try:
        groups = {"process": ProcessGroup(Receiver, (), name="receiver", timeout_s=300),
                  "ray": rayrt.RayGroup(Receiver, [()], "receiver", timeout_s=300)}
        try:
            for (shape, dtype), ts in tensors.items():
                nbytes = sum(t.numel() * t.element_size() for t in ts.values())
                for runtime, group in groups.items():
                    times = []
                    for v in range(versions):
                        update = WeightsUpdate(v, ts)
                        began = time.perf_counter()
                        if runtime == "ray":
                            [held] = rayrt.broadcast(group, "load_weights", update)
                        else:
                            [held] = group.submit("load_weights", update)
                        assert held.result(timeout=300) == v
                        times.append(time.perf_counter() - began)
                    steady = times[WARM_VERSIONS:]
                    results.append({"model": shape, "dtype": dtype, "runtime": runtime, "mb": round(nbytes / 2**20, 1),
                                    "first_s": [round(t, 3) for t in times[:WARM_VERSIONS]],
                                    "median_s": round(statistics.median(steady), 4), "max_s": round(max(steady), 4)})
                    log(json.dumps(results[-1]))
        finally:
            for group in groups.values():
                group.close()
    finally:
        cluster.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="throughput,overhead,sync", help="which measurements, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--versions", type=int, default=7, help="weight-sync transfers per case (the first 2 left out)")
    args = ap.parse_args()
    parts, seeds = args.parts.split(","), [int(s) for s in args.seeds.split(",")]
    out: dict = {"bench": "scale", "cores": len(os.sched_getaffinity(0)), "steps": args.steps, "seeds": seeds}
    with tempfile.TemporaryDirectory() as tmp:
        if "throughput" in parts:
            runs = interleaved(THROUGHPUT, seeds, args.steps, args.warmup, Path(tmp))
            out["throughput"] = {"samples_per_s": medians(runs, "samples_per_s"), "step_s": medians(runs, "step_s"),
                                 "update_s": medians(runs, "update_s"), "gen_s": medians(runs, "gen_s"), "runs": runs}
        if "overhead" in parts:
            runs = interleaved(OVERHEAD, seeds, args.steps, args.warmup, Path(tmp))
            step = medians(runs, "step_s")
            pairs = [(a["step_s"], b["step_s"]) for a, b in zip(runs[::2], runs[1::2]) if "step_s" in a and "step_s" in b]
            out["ray_overhead"] = {
                "step_s": step, "weight_sync_s": medians(runs, "weight_sync_s"),
                "overhead_of_median": round(step["ray"] / step["local"] - 1, 3) if len(step) == 2 else None,
                "overhead_paired_median": round(statistics.median(r / l - 1 for l, r in pairs), 3) if pairs else None,
                "runs": runs}
    if "sync" in parts:
        out["weight_sync"] = weight_sync(args.versions)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
