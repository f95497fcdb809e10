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

``--gen-bound`` measures something else: how far generation is from the time of its own
matrix products at this machine's rates. For each precision (fp32, and bf16-mixed: generation
under ``torch.autocast`` to bf16 from fp32 weights, as ``train.precision=bf16-mixed`` runs it)
and each ``--lengths`` cap, interleaved over the repeats, the fast backend generates; then every
matrix product that run needed is timed alone at its own shape (``matrix_seconds``: the prefill's
linear layers and attention over the distinct prompts, then each decode step's linear layers, LM
head and attention for the rows still generating, at that step's cache length; each distinct
shape timed once, the median of 5). ``gen_over_bound`` is the generation's seconds over those
products' seconds, per precision and cap (medians over the repeats): 1.0 would be a loop that
costs nothing beyond its arithmetic.

Every tokens/s figure counts the generated tokens (EOS included), so the ratio of two is
the ratio of their times. ``other_cpu_s`` is the CPU time the rest of the machine used
while the benchmark ran (Linux only), a measure of the noise.

    python bench/rollout.py [--threads 2] [--repeats 5]
    python bench/rollout.py --gen-bound --size embedded [--lengths 24,48] [--repeats 5]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
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
    "embedded": (192, 4, 6, 2, 512),  # the embedded model's sizes (reasonrl.config.SFTConfig)
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


PRECISIONS = {"fp32": None, "bf16-mixed": torch.bfloat16}
"""``--gen-bound``'s precisions: the autocast dtype generation runs under (None: off)."""


def precision_context(name: str):
    dtype = PRECISIONS[name]
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


class ProductTimer:
    """Seconds of one matrix product at a given shape under a precision, each distinct shape
    timed once (the median of 5 after a warm-up) on random operands, under the same autocast
    as the generation and with its operands' dtypes: weights and the key/value cache in the
    products' dtype (cast once per version by ``LeanDecoder.fuse``), a projection's input in
    fp32 (the residual stream's; autocast casts it, and that cast is counted)."""

    def __init__(self, precision: str) -> None:
        self.precision = precision
        self.dtype = PRECISIONS[precision] or torch.float32
        self.seconds: dict[tuple, float] = {}

    def _time(self, key: tuple, fn) -> float:
        if key not in self.seconds:
            with precision_context(self.precision):
                fn()
                runs = [timed("cpu", fn)[0] for _ in range(5)]
            self.seconds[key] = statistics.median(runs)
        return self.seconds[key]

    def linear(self, m: int, k: int, n: int) -> float:
        """``[m, k] x [n, k]^T``, as ``F.linear`` runs a projection."""
        if m == 0:
            return 0.0
        x, w = torch.randn(m, k), torch.randn(n, k, dtype=self.dtype)
        return self._time(("linear", m, k, n), lambda: torch.nn.functional.linear(x, w))

    def attention(self, rows: int, kv_heads: int, group: int, queries: int, keys: int, head_dim: int) -> float:
        """Scores ``q k^T`` and their product with the values, for ``rows`` sequences of
        ``kv_heads`` groups of ``group * queries`` query rows over ``keys`` keys."""
        if rows == 0:
            return 0.0
        q = torch.randn(rows, kv_heads, group * queries, head_dim, dtype=self.dtype)
        k = torch.randn(rows, kv_heads, head_dim, keys, dtype=self.dtype)
        v = torch.randn(rows, kv_heads, keys, head_dim, dtype=self.dtype)
        return self._time(("attention", rows, kv_heads, group, queries, keys, head_dim),
                          lambda: torch.matmul(torch.matmul(q, k), v))


def matrix_seconds(model, batch: RolloutBatch, n: int, timer: ProductTimer) -> float:
    """Seconds of the matrix products the fast backend's generation of ``batch`` needed, each
    timed alone (:class:`ProductTimer`): the prefill over the distinct prompts (``[G, P]``, the
    LM head on their last position), then, for each decode step ``t``, every row with more than
    ``t + 1`` tokens feeds token ``t`` through every layer and the LM head, its attention over
    ``P + t + 1`` keys (a row's first token comes from the prefill's logits)."""
    cfg = model.config
    hidden, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = hidden // heads
    group = heads // kv_heads
    layers = cfg.num_hidden_layers

    def layer_products(m: int) -> float:  # the fused q/k/v and gate/up projections, as LeanDecoder runs them
        return (timer.linear(m, hidden, (heads + 2 * kv_heads) * head_dim) + timer.linear(m, heads * head_dim, hidden)
                + timer.linear(m, hidden, 2 * inter) + timer.linear(m, inter, hidden))

    prompts, P = batch.prompt_ids.shape[0] // n, batch.prompt_ids.shape[1]
    seconds = layers * (layer_products(prompts * P) + timer.attention(prompts, kv_heads, group, P, P, head_dim))
    seconds += timer.linear(prompts, hidden, vocab)
    lengths = batch.lengths.tolist()
    for t in range(max(lengths) - 1):
        rows = sum(1 for length in lengths if length > t + 1)
        seconds += layers * (layer_products(rows) + timer.attention(rows, kv_heads, group, 1, P + t + 1, head_dim))
        seconds += timer.linear(rows, hidden, vocab)
    return seconds


def caps_list(text: str) -> list[int]:
    """``--lengths``: comma-separated caps on new tokens, each at least 1."""
    try:
        caps = [int(c) for c in text.split(",")]
    except ValueError:
        caps = []
    if not caps or min(caps) < 1:
        raise argparse.ArgumentTypeError(f"expected caps on new tokens like 24,48 (integers >= 1), got {text!r}")
    return caps


def gen_bound(args) -> dict:
    """``--gen-bound``: generation against its matrix products' time, per precision and cap."""
    model = build_model(0, args.size)
    prompts = build_prompts(args.prompts, 0)
    caps = args.lengths
    fast = FastGenerator(model, PAD, EOS)
    timers = {name: ProductTimer(name) for name in PRECISIONS}
    cells = [(name, cap) for name in PRECISIONS for cap in caps]
    rows: dict[tuple, dict[str, list[float]]] = {c: {"gen": [], "bound": [], "len": []} for c in cells}
    for name, cap in cells:  # warm-up: first shapes, oneDNN's kernel cache under bf16
        with precision_context(name):
            timed_generate(fast, prompts, args.samples, SamplingParams(temperature=1.0, max_new_tokens=cap), 0)
    jiffies, own = busy_jiffies(), sum(os.times()[:2])
    for seed in range(1, args.repeats + 1):
        for name, cap in cells:
            with precision_context(name):
                seconds, batch = timed_generate(fast, prompts, args.samples,
                                                SamplingParams(temperature=1.0, max_new_tokens=cap), seed)
            rows[(name, cap)]["gen"].append(seconds)
            rows[(name, cap)]["bound"].append(matrix_seconds(model, batch, args.samples, timers[name]))
            rows[(name, cap)]["len"].append(batch.lengths.float().mean().item())
    other_cpu_s = (busy_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK") - (sum(os.times()[:2]) - own)

    def per_cell(fn) -> dict:
        return {name: {str(cap): fn(rows[(name, cap)]) for cap in caps} for name in PRECISIONS}

    return {
        "bench": "rollout",
        "mode": "gen_bound",
        "size": args.size,
        "params": sum(p.numel() for p in model.parameters()),
        "threads": args.threads,
        "batch": args.prompts * args.samples,
        "repeats": args.repeats,
        "gen_over_bound": per_cell(lambda r: round(statistics.median(g / b for g, b in zip(r["gen"], r["bound"])), 2)),
        "gen_s": per_cell(lambda r: round(statistics.median(r["gen"]), 4)),
        "matrix_s": per_cell(lambda r: round(statistics.median(r["bound"]), 4)),
        "mean_response_len": per_cell(lambda r: round(statistics.median(r["len"]), 2)),
        "other_cpu_s": round(max(other_cpu_s, 0.0), 2),
        "torch": torch.__version__,
    }


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
    parser.add_argument("--gen-bound", action="store_true",
                        help="generation against its matrix products' time, fp32 and bf16-mixed (CPU; module docstring)")
    parser.add_argument("--lengths", default="24,48", type=caps_list, help="--gen-bound: the caps on new tokens")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.gen_bound:
        if args.device != "cpu" or args.dtype != "float32":
            parser.error("--gen-bound runs on the CPU from fp32 weights (bf16-mixed is one of its precisions)")
        print(json.dumps(gen_bound(args)))
        return

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
