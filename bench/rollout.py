"""Rollout throughput: HFGenerator vs FastGenerator vs the forward-pass bound.

A random ~1M-parameter Qwen2 (hidden 128, 4 layers, 4 heads, 2 kv heads, intermediate
384, vocab 100) with a bias on the EOS logit so that response lengths vary; 16 prompts x
8 samples, prompts of ~12 tokens, at most 24 new tokens, temperature 1. Each repeat times
HF, then fast, then the bound, so the three share the machine's noise; figures are medians.

The bound is the time of the model's forward pass alone over the same tokens: the fast
batch's prompt + response sequences scored in one no-grad pass by the faster of two
forwards, timed every repeat: ``lean_forward``, the lean decoder over right-padded,
length-sorted micro-batches of 2048 tokens with the LM head on response positions (what
training uses; the faster on CPU), and ``hf_forward``, one ``transformers`` forward over
the padded ``[B, P + T]`` batch (the faster on a GPU, where one big pass beats several
small ones). Generation cannot beat it: it runs the same model over the same tokens, one
token per step.

On CUDA, ``fast`` replays a CUDA graph per decode step (the default there) and
``fast_eager`` is the same backend without graphs (``static_shapes=False``).

Every tokens/s figure counts the generated tokens (EOS included), so the ratio of two is
the ratio of their times. ``other_cpu_s`` is the CPU time the rest of the machine used
while the benchmark ran (Linux only), a measure of the noise.

    python bench/rollout.py [--threads 2] [--repeats 5]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import transformers

from machine_load import busy_jiffies
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.seeds import group_seed
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.types import RolloutBatch, SamplingParams

PAD, EOS, VOCAB = 0, 1, 100
EOS_BIAS = 2.2  # about 1 in 12 steps ends a sample: lengths spread over 1..24


SIZES = {  # hidden, layers, heads, kv heads, intermediate
    "tiny": (128, 4, 4, 2, 384),
    "0.5b": (896, 24, 14, 2, 4864),  # Qwen2.5-0.5B's shape (vocab kept small)
}


def build_model(seed: int, size: str = "tiny", device: str = "cpu", dtype: str = "float32") -> torch.nn.Module:
    """The benchmark's random Qwen2, with ``EOS_BIAS`` added to the EOS logit."""
    torch.manual_seed(seed)
    hidden, layers, heads, kv_heads, intermediate = SIZES[size]
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    bias = torch.zeros(VOCAB)
    bias[EOS] = EOS_BIAS
    model.lm_head.bias = torch.nn.Parameter(bias)
    return model.to(device, getattr(torch, dtype))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_prompts(count: int, seed: int) -> list[list[int]]:
    """``count`` prompts of 10..14 tokens drawn from the non-special ids."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(10, 15, (count,), generator=g).tolist()
    return [torch.randint(2, VOCAB, (k,), generator=g).tolist() for k in lengths]


def timed(device: str, fn):
    """``(seconds, fn())``, the device's queued work included."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def timed_generate(generator, prompts, n, params, seed) -> tuple[float, RolloutBatch]:
    device = str(next(generator.model.parameters()).device)
    seeds = [group_seed(seed, i) for i in range(len(prompts))]
    return timed(device, lambda: generator.generate(prompts, n, params, seeds))


def timed_lean_forward(model, batch: RolloutBatch) -> float:
    """Seconds of the training-path scoring forward (lean decoder, 2048-token micro-batches)."""

    def score():
        compute_logprobs(model, batch, temperature=1.0, micro_batch_size=batch.size, micro_batch_tokens=2048)

    return timed(str(batch.prompt_ids.device), score)[0]


def timed_hf_forward(model, batch: RolloutBatch) -> float:
    """Seconds of one no-grad ``transformers`` forward over the padded prompt+response batch."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], 1)
    mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], 1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)

    def forward():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=position_ids)

    return timed(str(ids.device), forward)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build_model(0, args.size, args.device, args.dtype)
    prompts = build_prompts(args.prompts, 0)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    hf, fast = HFGenerator(model, PAD, EOS), FastGenerator(model, PAD, EOS)
    # On CUDA the fast loop replays a CUDA graph per step; also time it without (eager, compacting).
    eager = FastGenerator(model, PAD, EOS, static_shapes=False) if args.device.startswith("cuda") else None
    for generator in (hf, fast, eager):  # warm-up
        if generator is not None:
            timed_generate(generator, prompts, args.samples, params, 0)

    keys = ("hf_tok", "hf_smp", "fast_tok", "fast_smp", "eager_tok", "bound_tok", "lean_forward_tok", "hf_forward_tok")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    lengths: list[float] = []
    jiffies, own = busy_jiffies(), sum(os.times()[:2])
    for seed in range(1, args.repeats + 1):
        seconds, batch = timed_generate(hf, prompts, args.samples, params, seed)
        rows["hf_tok"].append(batch.lengths.sum().item() / seconds)
        rows["hf_smp"].append(batch.size / seconds)
        if eager is not None:
            seconds, batch = timed_generate(eager, prompts, args.samples, params, seed)
            rows["eager_tok"].append(batch.lengths.sum().item() / seconds)
        seconds, batch = timed_generate(fast, prompts, args.samples, params, seed)
        tokens = batch.lengths.sum().item()
        rows["fast_tok"].append(tokens / seconds)
        rows["fast_smp"].append(batch.size / seconds)
        lengths.append(batch.lengths.float().mean().item())
        rows["lean_forward_tok"].append(tokens / timed_lean_forward(model, batch))
        rows["hf_forward_tok"].append(tokens / timed_hf_forward(model, batch))
        rows["bound_tok"].append(max(rows["lean_forward_tok"][-1], rows["hf_forward_tok"][-1]))
    other_cpu_s = (busy_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK") - (sum(os.times()[:2]) - own)

    med = {k: statistics.median(v) for k, v in rows.items() if v}
    print(
        json.dumps(
            {
                "bench": "rollout",
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                "params": sum(p.numel() for p in model.parameters()),
                "dtype": args.dtype,
                "threads": args.threads,
                "batch": args.prompts * args.samples,
                "max_new_tokens": args.max_new_tokens,
                "mean_response_len": round(statistics.median(lengths), 2),
                "repeats": args.repeats,
                "hf_tokens_per_s": round(med["hf_tok"]),
                "hf_samples_per_s": round(med["hf_smp"], 1),
                "fast_tokens_per_s": round(med["fast_tok"]),
                "fast_samples_per_s": round(med["fast_smp"], 1),
                **({"fast_eager_tokens_per_s": round(med["eager_tok"])} if "eager_tok" in med else {}),
                "bound_tokens_per_s": round(med["bound_tok"]),
                "lean_forward_tokens_per_s": round(med["lean_forward_tok"]),
                "hf_forward_tokens_per_s": round(med["hf_forward_tok"]),
                "fast_over_bound": round(med["fast_tok"] / med["bound_tok"], 3),
                "fast_over_hf": round(med["fast_tok"] / med["hf_tok"], 2),
                "other_cpu_s": round(max(other_cpu_s, 0.0), 2),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
