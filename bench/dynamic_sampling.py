"""Dynamic sampling cost: whole generation batches then filter vs the streaming scheduler.

Every variant collects train batches of ``--want`` mixed-outcome groups x ``--n`` samples
with :class:`~reasonrl.rollout.scheduler.RolloutScheduler` on a FastGenerator:

* ``whole``:  today's DAPO loop: generation batches of a fixed ``--gen-factor * want``
  prompts (the dapo recipe: 24 for 16), decoded to the end, graded, mixed groups kept in
  prompt order, the rest of the last batch dropped (``early_stop=False, gen_batch_prompts``).
* ``sized``:  batches of ``ceil(missing * --oversample)`` prompts, decoded to the end
  (``early_stop=False``): the refill sizing alone, no early stop.
* ``stream``: the same sizing, each group graded as it completes, decoding stopped and the
  unfinished groups aborted once the batch is full (``early_stop=True``).

Models (``--model``): ``synthetic``, the random ~1M-parameter Qwen2 of ``bench/rollout.py``
(EOS bias: lengths spread over 1..24) graded by ``acc = hash(response tokens) % k == 0``
(``--k`` sets the fraction of mixed groups); ``warm``, the embedded warm start
(``reasonrl.warmstart.sft.ensure_warm_start``, cached under ``$REASONRL_CACHE``, trained first
if absent) on the embedded task's train prompts, graded by the real ``dapo_score``, with
the dapo recipe's sampling (temperature 1, 48 new tokens).

For each seed, every variant starts from the same prompt order and sampling seed and
collects ``--steps`` batches in a row. Samples per kept group count every sample started,
aborted ones included; tokens per kept group count every generated token. Figures are
means over the ``seeds x steps`` collects (each keeps exactly ``--want`` groups, so a mean
is total cost / total kept groups; a median would hide the refills: a whole-batch collect
costs one batch or two); ``whole_refill_frac`` is the share of whole-batch collects that
needed more than one batch. ``*_ratio`` is stream / whole (target: samples ratio <= 0.75).
The DAPO recipes generate ``3 x`` the train batch per generation batch
(``gen_prompt_bsz = train_prompt_bsz * 3``): ``--gen-factor 3``; the dapo recipe here asks
for 1.5 (``--gen-factor 1.5``, the default), a tighter baseline. ``kept_len`` is the mean response length in the kept batches: a
lower value for ``stream`` is the early stop's lean toward groups that finish first.

    python bench/dynamic_sampling.py [--model synthetic|warm] [--seeds 5] [--steps 2] [--threads 1]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout import EOS, PAD, build_model, build_prompts  # noqa: E402  (bench/rollout.py)

from reasonrl.rollout.fast import FastGenerator  # noqa: E402
from reasonrl.rollout.scheduler import RolloutScheduler  # noqa: E402
from reasonrl.rollout.seeds import group_seed  # noqa: E402
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch  # noqa: E402


def token_hash(tokens: list[int]) -> int:
    h = 17
    for t in tokens:
        h = (h * 1_000_003 + t) % (1 << 61)
    return h


def synthetic_setup(k: int, pool: int):
    """(generator, score, prompts, params) for the random model and the hash grader."""
    model = build_model(0)
    ids = build_prompts(pool, 0)
    prompts = [(Prompt(id=f"p{i}", text="", ground_truth=""), p) for i, p in enumerate(ids)]

    def score(rollout: RolloutBatch, rows: list[Prompt]) -> ScoredBatch:
        lengths = rollout.lengths.tolist()
        acc = torch.tensor(
            [token_hash(rollout.response_ids[i, : lengths[i]].tolist()) % k == 0 for i in range(rollout.size)]
        )
        return ScoredBatch(rollout, rows, [""] * rollout.size, acc.float(), acc, torch.zeros_like(acc))

    return FastGenerator(model, PAD, EOS), score, prompts, SamplingParams(temperature=1.0, max_new_tokens=24), PAD


def warm_setup(pool: int):
    """(generator, score, prompts, params) for the embedded warm start and dapo_score."""
    os.environ.setdefault("REASONRL_CACHE", "/tmp/rrcache")
    from reasonrl import config
    from reasonrl.data.splits import load_splits
    from reasonrl.data.splits import encode_prompts
    from reasonrl.models.loading import load_model, load_tokenizer
    from reasonrl.warmstart.sft import ensure_warm_start
    from reasonrl.reward.math import dapo_score

    recipe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "recipes", "dapo.yaml")
    cfg = config.load(recipe, [])
    directory = ensure_warm_start(cfg.sft, cfg.data.families, log=lambda m: print(m, file=sys.stderr))
    tokenizer = load_tokenizer(directory)
    model = load_model(directory, cfg.model.dtype, "cpu")
    train, _ = load_splits(cfg)
    prompts = list(zip(train[:pool], encode_prompts(train[:pool], tokenizer)))

    def score(rollout: RolloutBatch, rows: list[Prompt]) -> ScoredBatch:
        texts = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        acc = torch.tensor([bool(dapo_score(t, p.ground_truth)["acc"]) for t, p in zip(texts, rows)])
        return ScoredBatch(rollout, rows, texts, acc.float(), acc, torch.zeros_like(acc))

    r = cfg.rollout
    params = SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens)
    return FastGenerator(model, tokenizer.pad_token_id, tokenizer.eos_token_id), score, prompts, params, tokenizer.pad_token_id


class Source:
    """next_prompts(k) over a seeded permutation of the pool (wraps around): ``(prompt, ids, seed)``
    triples, the ``d``-th draw sampled with ``group_seed(seed, d)`` as a run's producer does."""

    def __init__(self, prompts, seed: int) -> None:
        self.prompts, self.seed = prompts, seed
        self.order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
        self.position = 0

    def __call__(self, k: int):
        draws = range(self.position, self.position + k)
        self.position += k
        return [(*self.prompts[self.order[d % len(self.order)]], group_seed(self.seed, d)) for d in draws]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["synthetic", "warm"], default="synthetic")
    parser.add_argument("--k", type=int, default=14, help="synthetic grader: acc = hash %% k == 0")
    parser.add_argument("--want", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--gen-factor", type=float, default=1.5, help="whole: prompts per batch / want")
    parser.add_argument("--oversample", type=float, default=2.0)
    parser.add_argument("--max-gen-batches", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pool = 4096
    if args.model == "synthetic":
        generator, score, prompts, params, pad = synthetic_setup(args.k, pool)
    else:
        generator, score, prompts, params, pad = warm_setup(pool)
    common = dict(want_groups=args.want, max_gen_batches=args.max_gen_batches, pad_id=pad)
    variants = {
        "whole": dict(early_stop=False, gen_batch_prompts=round(args.want * args.gen_factor)),
        "sized": dict(early_stop=False, oversample=args.oversample),
        "stream": dict(early_stop=True, oversample=args.oversample),
    }
    # Warm-up (first calls allocate and load kernels).
    RolloutScheduler(generator, score, args.n, params, **common, **variants["stream"]).collect(Source(prompts, 10_000))

    rows: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    for seed in range(args.seeds):
        for name, options in variants.items():
            scheduler = RolloutScheduler(generator, score, args.n, params, **common, **options)
            source = Source(prompts, seed)
            for _ in range(args.steps):
                start = time.perf_counter()
                batch, stats = scheduler.collect(source)
                seconds = time.perf_counter() - start
                completed_groups = stats["batch/generated_samples"] / args.n
                record = {
                    "samples_per_kept_group": stats["batch/samples_per_kept_group"],
                    "tokens_per_kept_group": stats["batch/tokens_per_kept_group"],
                    "seconds": seconds,
                    "gen_batches": stats["batch/num_gen_batches"],
                    "aborted_samples": stats["batch/aborted_samples"],
                    "mixed_rate": (stats["batch/kept_groups"] + stats["batch/surplus_groups"]) / completed_groups,
                    "kept_len": batch.rollout.lengths.float().mean().item(),
                }
                for key, value in record.items():
                    rows[name].setdefault(key, []).append(value)

    med = {name: {k: statistics.fmean(v) for k, v in r.items()} for name, r in rows.items()}
    out = {
        "bench": "dynamic_sampling",
        "model": args.model,
        "params": sum(p.numel() for p in generator.model.parameters()),
        "want_groups": args.want,
        "n": args.n,
        "max_new_tokens": params.max_new_tokens,
        "whole_gen_prompts": variants["whole"]["gen_batch_prompts"],
        "oversample": args.oversample,
        "seeds": args.seeds,
        "steps": args.steps,
        "threads": args.threads,
        "mixed_rate": round(statistics.fmean(rows["whole"]["mixed_rate"]), 3),
        "whole_refill_frac": round(statistics.fmean(float(b > 1) for b in rows["whole"]["gen_batches"]), 3),
        "summary": "means over seeds x steps",
    }
    if args.model == "synthetic":
        out["k"] = args.k
    for name in variants:
        for key in ("samples_per_kept_group", "tokens_per_kept_group", "seconds", "gen_batches", "aborted_samples", "kept_len"):
            out[f"{name}_{key}"] = round(med[name][key], 3)
    for key in ("samples_per_kept_group", "tokens_per_kept_group", "seconds"):
        out[f"{key}_ratio"] = round(med["stream"][key] / med["whole"][key], 3)
    out["target_met"] = out["samples_per_kept_group_ratio"] <= 0.75
    print(json.dumps(out))


if __name__ == "__main__":
    main()
