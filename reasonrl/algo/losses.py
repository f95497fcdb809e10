"""Policy, value and KL losses on [B, T] token tensors, and log-prob/entropy helpers.

``logprobs`` are log pi_theta(a_t | s_t) of the sampled tokens under the policy being
trained, ``old_logprobs`` those under the policy that generated the batch, ``mask`` 1 on
valid response tokens. ``agg``, ``horizon`` and ``total`` are passed to ``aggregate``.
"""

from __future__ import annotations

import torch

from reasonrl.algo.aggregate import aggregate, masked_mean

KL_KINDS = ("k1", "abs", "k2", "k3")


def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    horizon: int | None = None,
    total: float | torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and optional dual clip.

    As verl's compute_policy_loss:
      ratio = exp(clamp(logp - old, -20, 20))   (the clamp only guards exp against overflow)
      l1 = -A * ratio,  l2 = -A * clip(ratio, 1 - eps_low, 1 + eps_high),  l = max(l1, l2)
      dual clip, constant c > 1 (Ye et al. 2020): where A < 0, l = min(l, -A * c)
      off-policy correction: l = w * l with detached per-token ``weights`` w
      (:mod:`reasonrl.algo.off_policy`; None: w = 1)
      loss = aggregate(l, m, agg)
    metrics (0-dim, detached, over valid tokens):
      pg_clipfrac       = masked_mean[l2 > l1]
      pg_clipfrac_lower = masked_mean[A < 0 and max(l1, l2) > -A * c]   (0 without dual clip)
      ppo_kl            = masked_mean(old - logp)
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"ppo_clip: dual_clip must be > 1 (or None to disable), got {dual_clip}")
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = torch.maximum(loss1, loss2)
    if dual_clip is None:
        per_token = clipped
        clipfrac_lower = torch.zeros((), dtype=clipped.dtype, device=clipped.device)
    else:
        loss3 = -advantages * dual_clip
        negative = advantages < 0
        per_token = torch.where(negative, torch.minimum(clipped, loss3), clipped)
        clipfrac_lower = masked_mean(((clipped > loss3) & negative).to(clipped.dtype), mask)
    if weights is not None:
        per_token = per_token * weights.detach()
    loss = aggregate(per_token, mask, agg, horizon=horizon, total=total)
    metrics = {
        "pg_clipfrac": masked_mean((loss2 > loss1).to(clipped.dtype), mask).detach(),
        "pg_clipfrac_lower": clipfrac_lower.detach(),
        "ppo_kl": masked_mean(-log_ratio, mask).detach(),
    }
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    agg: str = "token-mean",
    horizon: int | None = None,
    total: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (as verl's compute_value_loss).

      v_clip = clamp(v, v_old - c, v_old + c)
      loss   = 0.5 * aggregate(max((v - R)^2, (v_clip - R)^2), m, agg)
    metrics: vf_clipfrac = masked_mean[(v_clip - R)^2 > (v - R)^2] (0-dim, detached).
    """
    clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
    loss1 = (values - returns) ** 2
    loss2 = (clipped_values - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(loss1, loss2), mask, agg, horizon=horizon, total=total)
    return loss, {"vf_clipfrac": masked_mean((loss2 > loss1).to(loss1.dtype), mask).detach()}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise estimate of KL(pi || pi_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

    With d = logp - ref:
      k1:  d
      abs: |d|
      k2:  0.5 * d^2
      k3:  clamp(exp(-d') + d' - 1, -10, 10), d' = clamp(d, -20, 20)
           (= exp(ref - logp) - (ref - logp) - 1, verl low_var_kl; the inner clamp keeps exp
           finite so no inf * 0 = NaN reaches the gradient)
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        bounded = torch.clamp(diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(-bounded) + bounded - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"kl_penalty: unknown kind {kind!r}; expected one of {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: H = logsumexp(l) - sum_v softmax(l)_v * l_v."""
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[..., token] without materialising the log-softmax over the vocabulary.

    logp[b, t] = l[b, t, tokens[b, t]] - logsumexp_v l[b, t, v]
    """
    picked = logits.gather(dim=-1, index=tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
