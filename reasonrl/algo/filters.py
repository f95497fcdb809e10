"""Group filters for dynamic sampling (DAPO)."""

from __future__ import annotations

import torch


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """inverse[i] in [0, G): the dense index of row i's group, and G."""
    unique, inverse = torch.unique(torch.as_tensor(group_ids), return_inverse=True)
    return inverse, unique.numel()


def keep_groups(metric: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: keep[i] = (max_{j in g(i)} x_j > min_{j in g(i)} x_j) or |g(i)| = 1.

    Rows whose group's metric values are not all equal are kept, and so is every group of
    one sample (as verl's DAPO filter keeps it: its std is undefined, not zero); groups of
    two or more with std 0 (all correct, all wrong) are dropped. Returns bool [B].
    """
    values = torch.as_tensor(metric)
    if values.dtype == torch.bool:
        values = values.to(torch.int64)
    inverse, n_groups = _group_index(group_ids)
    inverse = inverse.to(values.device)
    empty = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    high = empty.scatter_reduce(0, inverse, values, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, inverse, values, reduce="amin", include_self=False)
    sizes = torch.zeros(n_groups, dtype=torch.int64, device=values.device).index_add_(0, inverse, torch.ones_like(inverse))
    return ((high > low) | (sizes == 1))[inverse]


def group_outcomes(acc: torch.Tensor, group_ids: torch.Tensor) -> tuple[int, int, int]:
    """Count groups by outcome: (all correct, all wrong, mixed).

    For group g with n_g samples and c_g = sum_{i in g} acc_i:
    all correct: c_g == n_g; all wrong: c_g == 0; mixed: 0 < c_g < n_g.
    """
    correct = torch.as_tensor(acc).bool().to(torch.int64)
    inverse, n_groups = _group_index(group_ids)
    inverse = inverse.to(correct.device)
    n = torch.zeros(n_groups, dtype=torch.int64, device=correct.device).index_add_(0, inverse, torch.ones_like(correct))
    c = torch.zeros(n_groups, dtype=torch.int64, device=correct.device).index_add_(0, inverse, correct)
    all_correct = int((c == n).sum())
    all_wrong = int((c == 0).sum())
    return all_correct, all_wrong, n_groups - all_correct - all_wrong
