"""Gradient accumulation: micro-batch sums with total=agg_normaliser(full mask) equal one full-batch call."""

import pytest
import torch

from reasonrl.algo import AGG_MODES, agg_normaliser, ppo_clip, value_loss

B, T = 8, 6


def _batch():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 1.0
    old = logp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # varied lengths, one empty sequence
    mask = (torch.arange(T) < lengths[:, None]).double()
    return logp, old, adv, mask, lengths


def _policy_loss(logp, old, adv, mask, mode, total=None):
    loss, _ = ppo_clip(logp, old, adv, mask, 0.2, 0.28, dual_clip=3.0, agg=mode, horizon=T, total=total)
    return loss


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("micro", [1, 4])
def test_microbatch_sum_equals_full_batch(mode, micro):
    logp, old, adv, mask, _ = _batch()
    full_leaf = logp.clone().requires_grad_(True)
    full = _policy_loss(full_leaf, old, adv, mask, mode)
    full.backward()

    total = agg_normaliser(mask, mode)
    acc_leaf = logp.clone().requires_grad_(True)
    summed = torch.zeros((), dtype=torch.float64)
    for s in range(0, B, micro):
        rows = slice(s, s + micro)
        part = _policy_loss(acc_leaf[rows], old[rows], adv[rows], mask[rows], mode, total)
        part.backward()  # gradients accumulate in acc_leaf.grad, as in a training loop
        summed = summed + part.detach()
    assert summed.item() == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(acc_leaf.grad, full_leaf.grad, atol=1e-12)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_microbatch_with_own_padding(mode):
    # each 1-row micro-batch trimmed to its own length (dynamic padding): same loss with horizon fixed
    logp, old, adv, mask, lengths = _batch()
    full = _policy_loss(logp, old, adv, mask, mode)
    total = agg_normaliser(mask, mode)
    summed = 0.0
    for b in range(B):
        n = max(int(lengths[b]), 1)
        cut = (slice(b, b + 1), slice(0, n))
        summed += _policy_loss(logp[cut], old[cut], adv[cut], mask[cut], mode, total).item()
    assert summed == pytest.approx(full.item(), abs=1e-12)


def test_value_loss_microbatch_sum_equals_full_batch():
    logp, old, adv, mask, _ = _batch()  # reuse as values / old values / returns
    total = agg_normaliser(mask, "token-mean")
    full, _ = value_loss(logp, old, adv, mask, 0.2)
    rows = [slice(b, b + 1) for b in range(B)]
    summed = sum(value_loss(logp[r], old[r], adv[r], mask[r], 0.2, total=total)[0] for r in rows)
    assert summed.item() == pytest.approx(full.item(), abs=1e-12)
