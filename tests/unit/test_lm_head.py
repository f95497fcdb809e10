"""The chunked LM head computes the full head's log-probs, entropy and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reasonrl.algo import entropy_from_logits, token_logprobs
from reasonrl.models.lm_head import chunked_head_logprobs


def _inputs(bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 5, 16, generator=g, requires_grad=True)
    weight = (torch.randn(1000, 16, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(1000, generator=g) * 0.1).requires_grad_() if bias else None
    tokens = torch.randint(0, 1000, (3, 5), generator=g)
    tokens[0, 0], tokens[0, 1] = 999, 0  # the last, partial chunk and the first
    return hidden, weight, b, tokens


def _full(hidden, weight, bias, tokens, temperature):
    logits = F.linear(hidden, weight, bias).float() / temperature
    return token_logprobs(logits, tokens), entropy_from_logits(logits)


def _grads(out, params):
    return torch.autograd.grad(out, [p for p in params if p is not None])


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [128, 1000, 4096])
def test_chunks_give_the_full_heads_values_and_gradients(bias, chunk):
    hidden, weight, b, tokens = _inputs(bias)
    ref_lp, ref_h = _full(hidden, weight, b, tokens, 0.7)
    lp, h = chunked_head_logprobs(hidden, weight, b, tokens, 0.7, chunk, with_entropy=True)
    assert lp.shape == tokens.shape and h.shape == tokens.shape
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
    coef = torch.linspace(-1, 1, 15).view(3, 5)  # an arbitrary loss of both outputs
    ref = _grads((coef * ref_lp).sum() + (coef.flip(0) * ref_h).sum(), (hidden, weight, b))
    got = _grads((coef * lp).sum() + (coef.flip(0) * h).sum(), (hidden, weight, b))
    for r, o in zip(ref, got):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)


def test_log_probs_alone_and_hand_computed_values():
    hidden = torch.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    tokens = torch.tensor([2, 1])
    lp, h = chunked_head_logprobs(hidden, weight, None, tokens, 1.0, 2, with_entropy=False)
    assert h is None
    # row 0: z = (1, 0, 1), logZ = log(2e + 1); row 1: z = (0, 2, 2), logZ = log(1 + 2e^2)
    e = torch.tensor(1.0).exp()
    expected = torch.stack([1 - torch.log(2 * e + 1), 2 - torch.log(1 + 2 * e**2)])
    torch.testing.assert_close(lp, expected)
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    p0 = torch.stack([e, torch.tensor(1.0), e]) / (2 * e + 1)  # row 0: d logp / d h = W_t - sum_v p_v W_v
    torch.testing.assert_close(grad[0], weight[2] - p0 @ weight)


def test_under_bf16_autocast_the_products_run_in_bf16_as_autocasts_linear():
    hidden, weight, b, tokens = _inputs(True, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_lp, ref_h = _full(hidden, weight, b, tokens, 1.0)
        lp, h = chunked_head_logprobs(hidden, weight, b, tokens, 1.0, 128, with_entropy=True)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(h, ref_h, rtol=1e-4, atol=1e-4)
    ref = _grads(ref_lp.sum() + ref_h.sum(), (hidden, weight, b))
    got = _grads(lp.sum() + h.sum(), (hidden, weight, b))
    for r, o in zip(ref, got):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r, rtol=2e-2, atol=2e-3)


def test_a_chunk_must_be_positive():
    hidden, weight, b, tokens = _inputs(False)
    with pytest.raises(ValueError, match="chunk must be > 0"):
        chunked_head_logprobs(hidden, weight, b, tokens, 1.0, 0, with_entropy=False)
