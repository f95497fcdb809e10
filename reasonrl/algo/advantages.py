"""Advantage estimators.

Outcome estimators take one score per sample, ``scores[B]``, and ``group_ids[B]``: samples
with the same id answer the same prompt. Ids are arbitrary integers (any order, not
contiguous). For a group g of n_g samples: mean_g = sum_{i in g} s_i / n_g and
std_g = sqrt(sum_{i in g} (s_i - mean_g)^2 / (n_g - 1)) (unbiased).
Token-level estimators (``reinforce_pp``, ``gae``) take ``[B, T]`` tensors and a mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from reasonrl.algo.aggregate import masked_whiten


def _group_stats(scores: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (n_g, mean_g, std_g) of the sample's group; a group of one has mean 0, std 1."""
    group_ids = torch.as_tensor(group_ids, device=scores.device)
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = unique.numel()
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, inverse, torch.ones_like(scores)
    )
    sums = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, inverse, scores)
    n = counts[inverse]
    mean = sums[inverse] / n
    sq_dev = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, inverse, (scores - mean) ** 2
    )
    single = n == 1
    std = torch.sqrt(sq_dev[inverse] / torch.where(single, torch.ones_like(n), n - 1))
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return n, mean, std


def grpo(scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage (as verl's compute_grpo_outcome_advantage).

    A_i = (s_i - mean_g) / (std_g + eps), std unbiased; a group of one has mean 0 and
    std 1, so A_i = s_i / (1 + eps).
    """
    _, mean, std = _group_stats(scores, group_ids)
    return (scores - mean) / (std + eps)


def dr_grpo(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Dr.GRPO outcome advantage: A_i = s_i - mean_g (no std division); a group of one has mean 0."""
    _, mean, _ = _group_stats(scores, group_ids)
    return scores - mean


def lite_ppo(scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Lite PPO outcome advantage ("Tricks or Traps", 2025): group-level mean, batch-level std.

    A_i = (s_i - mean_g) / (std_batch + eps), where std_batch is the unbiased std of the RAW
    scores over the whole batch, std_batch = sqrt(sum_j (s_j - mean(s))^2 / (B - 1)), as ROLL's
    reward_norm(norm_mean_type="group", norm_std_type="batch") computes it; a batch of one
    has std_batch := 1. A group of one has mean 0, as in ``grpo``.
    """
    _, mean, _ = _group_stats(scores, group_ids)
    std = scores.std() if scores.numel() > 1 else torch.ones((), dtype=scores.dtype, device=scores.device)
    return (scores - mean) / (std + eps)


def batch_normalised(scores: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Batch-level advantage normalisation ("Tricks or Traps", 2025; ROLL's
    reward_norm(norm_mean_type="batch", norm_std_type="batch")): the batch's mean and std, no groups.

    A_i = (s_i - mean(s)) / (std_batch + eps), mean(s) = sum_j s_j / B and std_batch the
    unbiased std of the scores over the batch, as in ``lite_ppo``; a batch of one has
    std_batch := 1 (and A = 0). ``group_ids`` is not read: a group whose samples all scored
    alike still gets its distance to the batch's mean.
    """
    del group_ids
    if scores.numel() < 2:
        return scores - scores
    return (scores - scores.mean()) / (scores.std() + eps)


def rloo(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantage.

    A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1) = n_g / (n_g - 1) * (s_i - mean_g);
    A_i = 0 for a group of one (no other sample to compare with).
    """
    n, mean, _ = _group_stats(scores, group_ids)
    single = n == 1
    scale = torch.where(single, torch.zeros_like(n), n / torch.where(single, torch.ones_like(n), n - 1))
    return scale * (scores - mean)


def outcome_to_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token rewards [B, T] from one score per sample: r[b, t] = s_b at t = last valid token of b, else 0.

    last valid token: max{t : m[b, t] > 0}; a row without a valid token gets no reward.
    """
    valid = mask > 0
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(dim=-1).values
    rewards = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] = scores[rows]
    return rewards


def reinforce_pp(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (as verl's compute_reinforce_plus_plus_outcome_advantage).

    Returns-to-go over the valid tokens, carried across masked positions (the padding after a
    sequence, an environment's tokens between the turns of a multi-turn one), G[b, T] = 0:
      G[b, t] = m[b, t] * (r[b, t] + gamma * G[b, t+1]) + (1 - m[b, t]) * G[b, t+1]
    advantages = masked_whiten(G, m) * m (batch whitening over valid tokens); returns = G.
    With one right-padded sequence per row this is verl's recursion.
    """
    mask = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        running = m * (token_rewards[:, t] + gamma * running) + (1 - m) * running
        returns[:, t] = running
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (as verl's compute_gae_advantage_return).

    Backwards over t, with V' and L carried across masked positions (V'_T = L_T = 0):
      delta_t = r_t + gamma * V'_{t+1} - V_t
      L_t     = m_t * (delta_t + gamma * lam * L_{t+1}) + (1 - m_t) * L_{t+1}
      V'_t    = m_t * V_t + (1 - m_t) * V'_{t+1}
    returns = L + V (raw advantages plus values);
    advantages = masked_whiten(L, m) * m (whitened over valid tokens).
    """
    mask = mask.to(values.dtype)
    next_values = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    raw = torch.zeros_like(values)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = m * (delta + gamma * lam * last_gae) + (1 - m) * last_gae
        next_values = m * values[:, t] + (1 - m) * next_values
        raw[:, t] = last_gae
    returns = raw + values
    advantages = masked_whiten(raw, mask) * mask
    return advantages, returns


GROUP_ESTIMATORS = {"grpo": grpo, "dr_grpo": dr_grpo, "lite_ppo": lite_ppo, "batch": batch_normalised, "rloo": rloo}
"""The outcome estimators by ``algo.adv_estimator`` name: ``fn(scores [B], group_ids [B]) ->
advantages [B]``. The token-level ones, ``reinforce_pp`` and ``gae``, take token rewards (and
values) instead; :data:`ESTIMATORS` gives every one the same call."""


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read, for a batch of B samples of T tokens: ``scores [B]``,
    ``group_ids [B]``, ``action_mask [B, T]`` (the response's valid tokens), ``loss_mask [B, T]``
    (those trained on: the action mask less what a filter drops), ``token_rewards [B, T]`` (an
    environment's per-turn rewards; None: each score at its row's last valid token,
    :func:`outcome_to_token_rewards`), ``values [B, T]`` (the critic's, for ``gae``), ``gamma``
    and ``lam``."""

    scores: torch.Tensor
    group_ids: torch.Tensor
    action_mask: torch.Tensor
    loss_mask: torch.Tensor
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0

    def rewards(self) -> torch.Tensor:
        """The token rewards: given, or each score at its row's last valid token."""
        if self.token_rewards is not None:
            return self.token_rewards
        return outcome_to_token_rewards(self.scores, self.action_mask)


Estimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]]


def _outcome(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Estimator:
    """An outcome estimator on the common call: A[b, t] = fn(scores, group_ids)[b] * loss_mask[b, t]."""
    def estimate(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
        return fn(x.scores, x.group_ids)[:, None] * x.loss_mask, None
    return estimate


def _reinforce_pp(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """:func:`reinforce_pp` on the common call, its advantages times the loss mask."""
    adv, _ = reinforce_pp(x.rewards(), x.action_mask, x.gamma)
    return adv * x.loss_mask, None


def _gae(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gae` on the common call: (advantages times the loss mask, returns)."""
    if x.values is None:
        raise ValueError("gae needs the critic's values")
    adv, returns = gae(x.rewards(), x.values, x.action_mask, x.gamma, x.lam)
    return adv * x.loss_mask, returns


ESTIMATORS: dict[str, Estimator] = {**{name: _outcome(fn) for name, fn in GROUP_ESTIMATORS.items()},
                                    "reinforce_pp": _reinforce_pp, "gae": _gae}
"""Every estimator by ``algo.adv_estimator`` name, one call: ``ESTIMATORS[name](inputs) ->
(advantages [B, T], returns [B, T] or None)`` (returns: the critic's targets, ``gae`` only)."""
