"""Off-policy correction: importance weights from the behaviour policy to the PPO anchor.

Notation (per response token t of a sample drawn from the behaviour policy mu, the weights
that sampled it, possibly several versions behind the trainer):

    mu_t     = log mu(a_t | s_t)        behaviour log-prob, recorded while sampling
    old_t    = log pi_old(a_t | s_t)    the PPO anchor: the trainer's weights at the start of
                                        the update (the proximal policy of decoupled PPO)
    w_t      = exp(old_t - mu_t)        the importance weight pi_old / mu

The policy loss of a token becomes ``w'_t * l_t``, ``l_t`` the PPO clipped surrogate
around pi_old (:func:`~reasonrl.algo.losses.ppo_clip`), with ``w'`` detached:

    tis        w'_t = min(w_t, C)                      truncated IS (Ionides 2008; verl, slime)
    decoupled  w'_t = w_t if w_t <= C else 0           decoupled PPO (Hilton et al. 2021), with
                                                        AReaL's cap: tokens past it are masked

Masked tokens keep their place in the loss normaliser (the original token count), as in
AReaL's ``ppo_actor_loss_fn``. The exponent is clamped to [-20, 20] so a wild mismatch
cannot overflow.
"""

from __future__ import annotations

import torch

_LOG_RATIO_BOUND = 20.0


def importance_ratio(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """w = exp(clamp(old - mu, -20, 20)) per token, 0 on padding, detached."""
    log_ratio = torch.clamp(old_logprobs - behaviour_logprobs, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    return (torch.exp(log_ratio) * mask).detach()


def truncated_is_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """TIS: w'_t = min(exp(old_t - mu_t), C), 0 on padding, detached."""
    return torch.clamp(importance_ratio(old_logprobs, behaviour_logprobs, mask), max=cap)


def masked_is_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Decoupled PPO: w'_t = exp(old_t - mu_t) where it is <= C, else 0; 0 on padding, detached."""
    w = importance_ratio(old_logprobs, behaviour_logprobs, mask)
    return torch.where(w <= cap, w, torch.zeros_like(w))


IS_WEIGHTS = {"tis": truncated_is_weights, "decoupled": masked_is_weights}
"""``algo.off_policy`` -> the function of its per-token importance weights."""


def behaviour_metrics(
    old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> dict[str, torch.Tensor]:
    """How far the behaviour policy is from the anchor, over valid tokens (0-dim, detached):

      behaviour_kl       = masked_mean(w - log w - 1)      k3 estimate of KL(mu || pi_old)
      is_weight_mean     = masked_mean(w),  is_weight_max = max w
      is_truncated_frac  = masked_mean[w > C]              tokens TIS truncates, decoupled masks
      ess                = (sum w)^2 / (N sum w^2)         effective sample size over the N tokens,
                                                           as a fraction (1: weights all equal)
    with w = exp(clamp(old - mu, -20, 20)).
    """
    valid = mask.bool()
    if not valid.any():
        zero = torch.zeros((), device=mask.device)
        return {k: zero for k in ("behaviour_kl", "is_weight_mean", "is_weight_max", "is_truncated_frac", "ess")}
    log_w = torch.clamp(old_logprobs - behaviour_logprobs, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND).detach()[valid]
    w = torch.exp(log_w)
    return {
        "behaviour_kl": k3_mean(log_w),
        "is_weight_mean": w.mean(),
        "is_weight_max": w.max(),
        "is_truncated_frac": (w > cap).float().mean(),
        "ess": w.sum() ** 2 / (w.numel() * (w**2).sum()),
    }


def k3_mean(log_ratio: torch.Tensor) -> torch.Tensor:
    """mean(exp(r) - r - 1) over the (already selected, clamped) log-ratios r = log(p / q) of
    samples from q: Schulman's k3 estimate of KL(q || p), never negative."""
    return (torch.exp(log_ratio) - log_ratio - 1.0).mean()


def logprob_mismatch(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far the sampler's log-probs are from the trainer's for the same weights (different
    numerics: bf16 products, another engine), over the tokens where ``mask`` is 1 (0-dim, detached):

      logprob_diff_mean = masked_mean(|d|),  logprob_diff_max = max |d|
      logprob_kl        = masked_mean(exp(d) - d - 1)    k3 estimate of KL(sampler || trainer)
    with d = trainer - sampler (clamped to [-20, 20] inside the exponent). All 0 without tokens.
    """
    valid = mask.bool()
    if not valid.any():
        zero = torch.zeros((), device=mask.device)
        return {"logprob_diff_mean": zero, "logprob_diff_max": zero, "logprob_kl": zero}
    d = (trainer_logprobs - sampler_logprobs).detach()[valid]
    return {
        "logprob_diff_mean": d.abs().mean(),
        "logprob_diff_max": d.abs().max(),
        "logprob_kl": k3_mean(torch.clamp(d, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)),
    }
