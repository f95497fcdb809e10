"""The machine's matrix rate in fp32 and under bf16 autocast, at training and decode shapes, one JSON line out.

A linear layer's forward + backward (``y = x W^T``, then the gradients of ``x`` and ``W``:
6 m k n FLOP) at the shapes one training step of the embedded model and of a
Qwen2.5-0.5B-shaped model runs, and a decode step's forward (2 m k n FLOP): the bound the
step times of ``bench/precision.py``, ``bench/vs_trl.py`` and ``bench/memory.py`` are read
against. bf16 runs under ``torch.autocast`` from fp32 weights and activations, the casts
included, as ``train.precision=bf16-mixed`` does. Median of ``--repeats`` timings per shape.

    python bench/matrix_rate.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch

SHAPES = {  # name: (rows m, in k, out n, with backward)
    "embedded train qkv (2048 x 192 -> 320)": (2048, 192, 320, True),
    "embedded train gate_up (2048 x 192 -> 1024)": (2048, 192, 1024, True),
    "embedded decode gate_up (128 x 192 -> 1024)": (128, 192, 1024, False),
    "0.5B train gate_up (2048 x 896 -> 9728)": (2048, 896, 9728, True),
    "0.5B train lm_head (2048 x 896 -> 151936)": (2048, 896, 151936, True),
    "0.5B decode gate_up (32 x 896 -> 9728)": (32, 896, 9728, False),
}


def rate(m: int, k: int, n: int, backward: bool, bf16: bool, repeats: int) -> float:
    """GFLOP/s of one shape."""
    x = torch.randn(m, k).requires_grad_(backward)
    w = (torch.randn(n, k) * k**-0.5).requires_grad_(backward)
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def once() -> float:
        start = time.perf_counter()
        with ctx():
            y = torch.nn.functional.linear(x, w)
        if backward:
            y.backward(torch.ones_like(y))
            x.grad = w.grad = None
        return time.perf_counter() - start

    once()
    seconds = statistics.median(once() for _ in range(repeats))
    return (6 if backward else 2) * m * k * n / seconds / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = {}
    for name, (m, k, n, backward) in SHAPES.items():
        fp32, bf16 = rate(m, k, n, backward, False, args.repeats), rate(m, k, n, backward, True, args.repeats)
        out[name] = {"fp32_gflops": round(fp32, 1), "bf16_gflops": round(bf16, 1), "bf16_over_fp32": round(bf16 / fp32, 2)}
    print(json.dumps({"bench": "matrix_rate", "threads": args.threads, "shapes": out}))


if __name__ == "__main__":
    main()
