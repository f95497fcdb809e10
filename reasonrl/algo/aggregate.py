"""Masked statistics and the reduction of a [B, T] loss matrix to a scalar.

Notation: ``x[b, t]`` a per-token quantity, ``m[b, t]`` the mask (1 on valid tokens,
0 on padding), ``S = {b : sum_t m[b, t] > 0}`` the sequences with at least one valid token.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den where den != 0, else 0 (den is replaced by 1 so no NaN reaches autograd)."""
    return num / torch.where(den != 0, den, torch.ones_like(den))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set.

    masked_mean(x, m) = sum(x * m) / sum(m), reduced over ``dim`` (all dims if None);
    0 where sum(m) == 0.
    """
    if dim is None:
        return _safe_div((x * mask).sum(), mask.sum())
    return _safe_div((x * mask).sum(dim=dim), mask.sum(dim=dim))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked positions (as verl's ``masked_var``).

    var = masked_mean((x - mu)^2, m) with mu = masked_mean(x, m);
    unbiased: var * n / (n - 1), n = sum(m), which needs n >= 2 (ValueError otherwise).
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = float(mask.sum())
        if n < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 valid elements, the mask sums to {n}")
        var = var * (n / (n - 1))
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked positions (as verl).

    whiten(x) = (x - mu) / sqrt(var + 1e-8), mu = masked_mean(x, m), var = masked_var(x, m)
    (unbiased); with shift_mean=False the mean is added back: whiten(x) + mu.
    Padding positions are transformed too; multiply by the mask to zero them.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def _check_mode(mode: str) -> None:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {', '.join(AGG_MODES)}")


def agg_normaliser(mask: torch.Tensor, mode: str) -> float:
    """The denominator of ``aggregate`` for a whole mini-batch mask [B, T].

    token-mean: sum_{b,t} m[b, t] (the number of valid tokens);
    seq-mean-*: |S| (the number of sequences with at least one valid token).
    Pass it as ``total`` to every micro-batch call of ``aggregate`` so that the sum over
    micro-batches equals one call on the whole mini-batch.
    """
    _check_mode(mode)
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(dim=-1) > 0).sum())


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    horizon: int | None = None,
    total: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    With N = total if given, else agg_normaliser(mask, mode) (the value for this batch):
      token-mean:              sum_{b,t} l[b,t] m[b,t] / N
      seq-mean-token-mean:     sum_{b in S} (sum_t l[b,t] m[b,t] / sum_t m[b,t]) / N
      seq-mean-token-sum:      sum_{b in S} sum_t l[b,t] m[b,t] / N
      seq-mean-token-sum-norm: sum_{b in S} sum_t l[b,t] m[b,t] / (N * H)   (Dr.GRPO)
    H = ``horizon`` (default T, the padded length; used by the -norm mode only).
    Without ``total`` these are the token mean and the means over the sequences of S;
    sequences without a valid token never count. The result is 0 when N == 0.
    With ``total`` = the whole mini-batch's normaliser, the results of the micro-batches
    sum to the mini-batch aggregate (gradient accumulation).
    """
    _check_mode(mode)
    if total is None:
        total = agg_normaliser(mask, mode)
    total = torch.as_tensor(total, dtype=loss.dtype, device=loss.device)
    token_terms = loss * mask
    if mode == "token-mean":
        return _safe_div(token_terms.sum(), total)
    seq_sums = token_terms.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        return _safe_div(_safe_div(seq_sums, mask.sum(dim=-1)).sum(), total)
    if mode == "seq-mean-token-sum":
        return _safe_div(seq_sums.sum(), total)
    if horizon is None:
        horizon = loss.shape[-1]
    if horizon <= 0:
        raise ValueError(f"aggregate: horizon must be > 0 for seq-mean-token-sum-norm, got {horizon}")
    return _safe_div(seq_sums.sum(), total * horizon)
