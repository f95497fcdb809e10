"""Sampling randomness per prompt group: seeds and a counter-based noise function.

The tokens a group gets depend only on its seed, never on which worker serves it or what
else shares the generation call. All arithmetic is on 64-bit words (mod 2**64), with
splitmix64's finaliser (Steele, Lea and Flood 2014)::

    mix64(x) = z3,  z0 = x + G
                    z1 = (z0 ^ (z0 >> 30)) * 0xBF58476D1CE4E5B9
                    z2 = (z1 ^ (z1 >> 27)) * 0x94D049BB133111EB
                    z3 =  z2 ^ (z2 >> 31)
    G = 0x9E3779B97F4A7C15  (2**64 / golden ratio), >> logical

    combine(a, b)          = mix64(mix64(a) ^ b) >> 2            62 bits: fits an int64, >= 0
    group_seed(run, draw)  = combine(run, draw)                  the group of the draw-th prompt
    row seed (i, j)        = combine(seeds[i], j)                sample j of group i
    uniform(row, t)        = (mix64(row ^ (t * G)) >> 11) / 2**53, as float32 clamped below 1

A row's ``t``-th sampled token (``t`` counts that row's sampled tokens from 0, across the
turns of an episode and the phases of an interrupted generation) inverts its CDF at
``uniform(row seed, t)`` (:func:`reasonrl.rollout.hf.sample`).
"""

from __future__ import annotations

from typing import Sequence

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB
BELOW_ONE = 1.0 - 2.0**-24
"""The largest float32 below 1."""


def _signed(x: int) -> int:
    """The 64-bit word ``x`` as an int64 value (two's complement)."""
    return x - (1 << 64) if x >= 1 << 63 else x


def mix64(x: int) -> int:
    """splitmix64's output for state ``x`` (see the module docstring), on Python ints mod 2**64."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MUL2) & MASK64
    return z ^ (z >> 31)


def combine(a: int, b: int) -> int:
    """``mix64(mix64(a) ^ b) >> 2``: a 62-bit seed (non-negative, fits int64) from two integers
    (each taken mod 2**64)."""
    return mix64(mix64(a & MASK64) ^ (b & MASK64)) >> 2


def group_seed(run_seed: int, draw: int) -> int:
    """The seed of the group of the ``draw``-th prompt (0-based) drawn in a run seeded ``run_seed``:
    ``combine(run_seed, draw)``."""
    return combine(run_seed, draw)


def check_seeds(seeds: Sequence[int], prompts: Sequence) -> None:
    """ValueError unless ``seeds`` holds one integer per prompt group of ``prompts``."""
    if len(seeds) != len(prompts):
        raise ValueError(f"seeds: expected one seed per prompt group ({len(prompts)}), got {len(seeds)}")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int)]
    if bad:
        raise ValueError(f"seeds: expected integers, got {bad[0]!r} ({type(bad[0]).__name__})")


def row_seeds(seeds: Sequence[int], n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """LongTensor ``[len(seeds) * n]``: the seed of sample ``j`` of group ``i`` (row ``i * n + j``)
    is ``combine(seeds[i], j)``."""
    if n < 1:
        raise ValueError(f"n: expected a number of samples per group >= 1, got {n}")
    return torch.tensor([combine(s, j) for s in seeds for j in range(n)], dtype=torch.long, device=device)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 words by ``k`` in 1..63 (torch's ``>>`` is arithmetic: mask off the sign copies)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64_tensor(x: torch.Tensor) -> torch.Tensor:
    """:func:`mix64` of every int64 word of ``x`` (torch's int64 addition and multiplication wrap mod 2**64)."""
    z = x + _signed(GOLDEN)
    z = (z ^ _shr(z, 30)) * _signed(MUL1)
    z = (z ^ _shr(z, 27)) * _signed(MUL2)
    return z ^ _shr(z, 31)


def uniforms(rows: torch.Tensor, t: torch.Tensor | int) -> torch.Tensor:
    """FloatTensor ``[b, 1]`` in [0, 1): ``uniform(rows[r], t[r])`` (module docstring) for each of the
    ``b`` row seeds ``rows`` (LongTensor ``[b]``) at counters ``t`` (LongTensor ``[b]`` or one int
    for all), on ``rows``' device. A pure function of each (seed, counter) pair: the same on CPU
    and CUDA, whatever the batch around it."""
    if rows.dtype != torch.long or rows.dim() != 1:
        raise ValueError(f"rows: expected a 1-D int64 tensor of row seeds, got {rows.dtype} of shape {tuple(rows.shape)}")
    t = torch.as_tensor(t, dtype=torch.long, device=rows.device)
    z = mix64_tensor(rows ^ (t * _signed(GOLDEN)))
    u = _shr(z, 11).double() * 2.0**-53
    return u.float().clamp_(max=BELOW_ONE)[:, None]
