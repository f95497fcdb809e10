"""Reward shaping for over-long responses (DAPO)."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment, one value per sample, added to the score.

    L_exp = max_len - buffer_len
    penalty = min(-(length - L_exp) / buffer_len * factor, 0)
    i.e. 0 for length <= L_exp, falling linearly to -factor at length == max_len
    (and below -factor past max_len, as DAPO's reward manager computes it).
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(
            f"overlong_penalty: buffer_len must be in (0, max_len], got buffer_len={buffer_len}, max_len={max_len}"
        )
    expected = max_len - buffer_len
    exceed = torch.as_tensor(lengths).to(torch.float32) - expected
    return torch.clamp(-exceed / buffer_len * factor, max=0.0)


def overlong_filter_mask(truncated: torch.Tensor) -> torch.Tensor:
    """DAPO overlong filtering: a per-sample loss weight, 0 for truncated samples, 1 otherwise.

    w_i = 1 - [truncated_i]  (float32; multiply into the token mask to drop truncated samples)
    """
    return (~torch.as_tensor(truncated).bool()).to(torch.float32)
