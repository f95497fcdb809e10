"""Rollout throughput of the vLLM backend vs reasonrl's decode loop, on the embedded warm start.

The same prompts (the embedded task's train split) and sampling for both, ``--prompts`` x
``--samples`` per call, temperature 1, interleaved: each repeat times vLLM then the fast
loop with the same seed; figures are medians. Needs the optional vllm package (README,
"vLLM backend"); on a CPU, ``OMP_NUM_THREADS`` is set to ``--threads`` before vLLM starts
so that it keeps torch at that thread count instead of lowering it to 1 for both.

    REASONRL_CACHE=/tmp/rrcache python bench/vllm_rollout.py [--threads 2] [--repeats 5]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    import vllm

    from reasonrl.config import load
    from reasonrl.models.loading import load_eos_ids, load_model, load_tokenizer, model_context
    from reasonrl.warmstart import resolve_model_dir
    from reasonrl.data.splits import load_splits, tokenize_prompts
    from reasonrl.rollout.fast import FastGenerator
    from reasonrl.types import SamplingParams
    from reasonrl.workers import RolloutWorker
    from rollout import timed_generate  # bench/rollout.py: the device's queued work included

    torch.set_num_threads(args.threads)
    cfg = load(str(ROOT / "recipes" / "grpo.yaml"), [
        "run.dir=/tmp/reasonrl-bench-vllm", "run.progress=false", f"run.threads={args.threads}", f"run.device={args.device}",
        "algo.kl_loss_coef=0", "rollout.backend=vllm", f"rollout.max_new_tokens={args.max_new_tokens}",
    ])
    model_dir = resolve_model_dir(cfg, log=lambda *a: None)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, cfg.model.dtype, args.device)
    fast = FastGenerator(model, tokenizer.pad_token_id, load_eos_ids(model_dir, tokenizer))
    train, _ = load_splits(cfg)
    prompts = tokenize_prompts(train[: args.prompts], tokenizer, cfg, model_context(model_dir), cfg.data.source).ids
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    backends = {"vllm": RolloutWorker(cfg, model_dir), "fast": fast}

    def tokens_per_s(generator, seed):
        seconds, batch = timed_generate(generator, prompts, args.samples, params, seed)
        return batch.lengths.sum().item() / seconds

    for generator in backends.values():  # warm-up
        tokens_per_s(generator, 0)
    rows = {name: [] for name in backends}
    for seed in range(1, args.repeats + 1):
        for name, generator in backends.items():
            rows[name].append(tokens_per_s(generator, seed))
    med = {name: statistics.median(v) for name, v in rows.items()}
    print(json.dumps({
        "bench": "vllm_rollout",
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "params": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "batch": args.prompts * args.samples,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "vllm_tokens_per_s": round(med["vllm"]),
        "fast_tokens_per_s": round(med["fast"]),
        "fast_over_vllm": round(med["fast"] / med["vllm"], 2),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
