"""reasonrl.algo.off_policy: hand-computed weights, loss and metrics, and a per-token loop form."""

import math
import random

import pytest
import torch

from reasonrl.algo import behaviour_metrics, masked_is_weights, ppo_clip, truncated_is_weights

# Four valid tokens and one padding token; log w = old - mu.
LOG_W = [math.log(0.5), 0.0, math.log(1.5), math.log(3.0), math.log(7.0)]
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])


def _old_mu():
    mu = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    return mu + torch.tensor([LOG_W]), mu


def test_truncated_weights_hand():
    # w = [.5, 1, 1.5, 3, (pad)], C = 2: min(w, 2) = [.5, 1, 1.5, 2, 0]
    old, mu = _old_mu()
    got = truncated_is_weights(old, mu, MASK, cap=2.0)
    assert torch.allclose(got, torch.tensor([[0.5, 1.0, 1.5, 2.0, 0.0]]), atol=1e-6)
    assert not got.requires_grad


def test_masked_weights_hand():
    # decoupled, C = 2: w <= 2 kept, above masked: [.5, 1, 1.5, 0, 0]
    old, mu = _old_mu()
    got = masked_is_weights(old, mu, MASK, cap=2.0)
    assert torch.allclose(got, torch.tensor([[0.5, 1.0, 1.5, 0.0, 0.0]]), atol=1e-6)


def test_behaviour_metrics_hand():
    # w = [.5, 1, 1.5, 3]: mean 1.5, max 3, above C=2: 1 of 4
    # k3 = w - log w - 1: .5 + log 2 - 1, 0, .5 - log 1.5, 2 - log 3
    # ess = (6)^2 / (4 * (.25 + 1 + 2.25 + 9)) = 36 / 50 = .72
    old, mu = _old_mu()
    m = behaviour_metrics(old, mu, MASK, cap=2.0)
    k3 = [0.5 + math.log(2) - 1, 0.0, 0.5 - math.log(1.5), 2 - math.log(3)]
    assert m["behaviour_kl"].item() == pytest.approx(sum(k3) / 4, abs=1e-6)
    assert m["is_weight_mean"].item() == pytest.approx(1.5, abs=1e-6)
    assert m["is_weight_max"].item() == pytest.approx(3.0, abs=1e-5)
    assert m["is_truncated_frac"].item() == pytest.approx(0.25)
    assert m["ess"].item() == pytest.approx(0.72, abs=1e-6)
    # on-policy: every weight 1, KL 0, ESS 1
    on = behaviour_metrics(mu, mu, MASK, cap=2.0)
    assert on["behaviour_kl"].item() == 0.0 and on["ess"].item() == pytest.approx(1.0) and on["is_truncated_frac"] == 0


def test_weighted_ppo_clip_hand():
    # r = 1 everywhere (logp = old): l = -A; A = [1, -1, 2, 1]; w' (TIS, C=2) = [.5, 1, 1.5, 2]
    # token-mean: (-.5 + 1 - 3 - 2) / 4 = -1.125; gradient d/dlogp = -A w / 4 where not clipped
    old, mu = _old_mu()
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0, 9.0]])
    logp = old.clone().requires_grad_(True)
    w = truncated_is_weights(old, mu, MASK, cap=2.0)
    loss, metrics = ppo_clip(logp, old, adv, MASK, 0.2, 0.2, weights=w)
    assert loss.item() == pytest.approx(-1.125, abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 1.0, -3.0, -2.0, 0.0]]) / 4, atol=1e-6)
    # the masked (decoupled) token keeps its place in the normaliser: (-.5 + 1 - 3 + 0) / 4
    loss, _ = ppo_clip(old, old, adv, MASK, 0.2, 0.2, weights=masked_is_weights(old, mu, MASK, cap=2.0))
    assert loss.item() == pytest.approx(-2.5 / 4, abs=1e-6)


@pytest.mark.parametrize("mode", ["tis", "decoupled"])
def test_weighted_ppo_clip_matches_loop(mode):
    rng = random.Random(3)
    gen = torch.Generator().manual_seed(3)
    B, T, cap, eps_low, eps_high = 3, 6, 1.7, 0.2, 0.28
    mu = -torch.rand(B, T, generator=gen) * 3
    old = mu + (torch.rand(B, T, generator=gen) - 0.5) * 2
    logp = old + (torch.rand(B, T, generator=gen) - 0.5) * 0.8
    adv = torch.randn(B, T, generator=gen)
    mask = torch.tensor([[1.0 if t < rng.randint(2, T) else 0.0 for t in range(T)] for _ in range(B)])
    weights = (truncated_is_weights if mode == "tis" else masked_is_weights)(old, mu, mask, cap)
    loss, _ = ppo_clip(logp, old, adv, mask, eps_low, eps_high, weights=weights)
    total, count = 0.0, 0
    for b in range(B):
        for t in range(T):
            if not mask[b, t]:
                continue
            w = math.exp(old[b, t] - mu[b, t])
            w = min(w, cap) if mode == "tis" else (w if w <= cap else 0.0)
            r = math.exp(logp[b, t] - old[b, t])
            a = float(adv[b, t])
            total += w * max(-a * r, -a * min(max(r, 1 - eps_low), 1 + eps_high))
            count += 1
    assert loss.item() == pytest.approx(total / count, rel=1e-5)
