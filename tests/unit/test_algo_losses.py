"""reasonrl.algo.losses: hand-computed values and gradients."""

import math

import pytest
import torch

from reasonrl.algo import entropy_from_logits, kl_penalty, ppo_clip, token_logprobs, value_loss

# Five valid tokens (old log-prob 0, so ratio r = exp(logp)) and one padding token.
RATIOS = [1.5, 0.5, 1.1, 0.5, 4.0, 10.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])


def _logp():
    return torch.log(torch.tensor([RATIOS])).requires_grad_(True)


def test_ppo_clip_hand():
    # eps_low .2, eps_high .28 -> clip range [.8, 1.28]
    # t0 r=1.5 A=1:  l1=-1.5, l2=-1.28 -> -1.28 (clipped)
    # t1 r=.5  A=1:  l1=-.5,  l2=-.8   -> -.5
    # t2 r=1.1 A=-1: l1=1.1,  l2=1.1   -> 1.1
    # t3 r=.5  A=-1: l1=.5,   l2=.8    -> .8 (clipped)
    # t4 r=4   A=-1: l1=4,    l2=1.28  -> 4
    # token-mean (-1.28 - .5 + 1.1 + .8 + 4) / 5 = 4.12 / 5 = .824; clipfrac 2/5
    logp = _logp()
    loss, metrics = ppo_clip(logp, torch.zeros(1, 6), ADV, MASK, eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(0.824, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.4)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    # ppo_kl = mean(old - logp) = -log(1.5 * .5 * 1.1 * .5 * 4) / 5 = -log(1.65) / 5
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(1.65) / 5, abs=1e-6)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    # d/dlogp of -A r is -A r where not clipped, 0 where clipped or padded; / 5 tokens
    loss.backward()
    expected = torch.tensor([[0.0, -0.5, 1.1, 0.0, 4.0, 0.0]]) / 5
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_ppo_clip_dual_clip_hand():
    # c = 3: for A < 0, min(l, -A c) = min(l, 3): only t4 changes, 4 -> 3 (a constant, no gradient)
    # token-mean (-1.28 - .5 + 1.1 + .8 + 3) / 5 = .624; clipfrac_lower 1/5
    logp = _logp()
    loss, metrics = ppo_clip(logp, torch.zeros(1, 6), ADV, MASK, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    assert loss.item() == pytest.approx(0.624, abs=1e-6)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.4)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(0.2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5, 1.1, 0.0, 0.0, 0.0]]) / 5, atol=1e-6)


def test_ppo_clip_seq_mode_hand():
    # seq-mean-token-sum over one sequence: 4.12; -norm with horizon 4: 4.12 / 4
    loss, _ = ppo_clip(_logp(), torch.zeros(1, 6), ADV, MASK, 0.2, 0.28, agg="seq-mean-token-sum")
    assert loss.item() == pytest.approx(4.12, abs=1e-5)
    loss, _ = ppo_clip(_logp(), torch.zeros(1, 6), ADV, MASK, 0.2, 0.28, agg="seq-mean-token-sum-norm", horizon=4)
    assert loss.item() == pytest.approx(1.03, abs=1e-5)


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_ppo_clip_rejects_dual_clip_not_above_one(c):
    with pytest.raises(ValueError, match=f"dual_clip must be > 1.*{c}"):
        ppo_clip(_logp(), torch.zeros(1, 6), ADV, MASK, 0.2, 0.2, dual_clip=c)


def test_value_loss_hand():
    # clip .2; t0: v=1, old=.5 -> v_clip = .7; (1-2)^2 = 1 < (.7-2)^2 = 1.69 -> 1.69 (clipped)
    # t1: v=2, old=2 -> v_clip = 2; both (2-1)^2 = 1 -> 1;  t2 padding
    # 0.5 * (1.69 + 1) / 2 = .6725; vf_clipfrac 1/2
    values = torch.tensor([[1.0, 2.0, 0.0]], requires_grad=True)
    loss, metrics = value_loss(
        values, torch.tensor([[0.5, 2.0, 0.0]]), torch.tensor([[2.0, 1.0, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 0.2
    )
    assert loss.item() == pytest.approx(0.6725)
    assert metrics["vf_clipfrac"].item() == pytest.approx(0.5)
    # gradient: t0 clipped value is constant -> 0; t1: 0.5 * 2 (v - R) / 2 = .5
    loss.backward()
    assert torch.allclose(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))


def test_kl_penalty_hand():
    ln2 = math.log(2)
    logp = torch.tensor([ln2, 0.0, 0.0])
    ref = torch.tensor([0.0, ln2, 0.0])  # d = logp - ref = [ln2, -ln2, 0]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([ln2, -ln2, 0.0]))
    assert torch.allclose(kl_penalty(logp, ref, "abs"), torch.tensor([ln2, ln2, 0.0]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([0.5 * ln2**2, 0.5 * ln2**2, 0.0]))
    # k3 = exp(-d) + d - 1: .5 + ln2 - 1 = .19315; 2 - ln2 - 1 = .30685; 0
    assert torch.allclose(kl_penalty(logp, ref, "k3"), torch.tensor([0.5 + ln2 - 1, 1 - ln2, 0.0]), atol=1e-6)


def test_kl_penalty_k3_clamped_with_finite_grad():
    # d = -30: exp(30) is clamped to 10; d = +30: exp(-20) + 19 -> 10
    logp = torch.tensor([-30.0, 30.0], requires_grad=True)
    out = kl_penalty(logp, torch.zeros(2), "k3")
    assert torch.equal(out.detach(), torch.tensor([10.0, 10.0]))
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_kl_penalty_unknown_kind():
    with pytest.raises(ValueError, match="'low_var'.*k1, abs, k2, k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "low_var")


def test_entropy_from_logits_hand():
    # uniform over 4 -> ln 4; logits [0, ln3] -> p = [.25, .75], H = ln4 - .75 ln3 = .562335
    # (-1e9: zero probability; finite, so p * l is 0 rather than 0 * -inf)
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e9, -1e9]])
    got = entropy_from_logits(logits)
    assert torch.allclose(got, torch.tensor([math.log(4), math.log(4) - 0.75 * math.log(3)]), atol=1e-6)
    rand = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(0))
    ref = torch.distributions.Categorical(logits=rand).entropy()
    assert torch.allclose(entropy_from_logits(rand), ref, atol=1e-6)


def test_token_logprobs_hand():
    # [0, ln3] -> log(3/4) at token 1; [ln2, 0] -> log(1/3) at token 1
    logits = torch.tensor([[[0.0, math.log(3)], [math.log(2), 0.0]]])
    got = token_logprobs(logits, torch.tensor([[1, 1]]))
    assert torch.allclose(got, torch.tensor([[math.log(0.75), math.log(1 / 3)]]), atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    rand = torch.randn(2, 4, 9, generator=gen)
    tokens = torch.randint(0, 9, (2, 4), generator=gen)
    ref = torch.log_softmax(rand, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(rand, tokens), ref, atol=1e-6)
