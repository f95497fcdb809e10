"""reasonrl.algo.aggregate: hand-computed values and a loop reference."""

import random

import pytest
import torch

from reasonrl.algo import AGG_MODES, agg_normaliser, aggregate, masked_mean, masked_var, masked_whiten

# Row 0: 4 valid tokens, row 1: 2 valid (then padding holding 100s), row 2: none.
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0], [100.0, 100.0, 100.0, 100.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_masked_mean_hand():
    # valid 1, 2, 4 -> 7 / 3
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert masked_mean(x, torch.tensor([1.0, 1.0, 0.0, 1.0])).item() == pytest.approx(7 / 3)
    # per row: [1] -> 1 ; [3, 4] -> 3.5
    got = masked_mean(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), dim=-1)
    assert torch.allclose(got, torch.tensor([1.0, 3.5]))
    # nothing valid -> 0, not NaN
    assert masked_mean(x, torch.zeros(4)).item() == 0.0


def test_masked_var_and_whiten_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 2, squared deviations 1 + 0 + 1 = 2: biased 2/3, unbiased 2/2 = 1
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_var(x, m).item() == pytest.approx(1.0)
    # (x - 2) / sqrt(1 + 1e-8) on the valid positions
    w = masked_whiten(x, m)
    assert torch.allclose(w[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    assert torch.allclose(masked_whiten(x, m, shift_mean=False)[:3], torch.tensor([1.0, 2.0, 3.0]), atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(x, torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_aggregate_hand():
    # token-mean: (1+2+3+4+5+6) / 6 = 3.5
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(3.5)
    # seq-mean-token-mean: token means 2.5 and 5.5, row 2 left out -> 4.0
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(4.0)
    # seq-mean-token-sum: sums 10 and 11 -> 10.5
    assert aggregate(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(10.5)
    # seq-mean-token-sum-norm: 10.5 / T = 10.5 / 4 = 2.625; horizon 3: 10.5 / 3 = 3.5
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm").item() == pytest.approx(2.625)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", horizon=3).item() == pytest.approx(3.5)


def test_aggregate_with_total_hand():
    # token-mean, mini-batch of 12 valid tokens: 21 / 12
    assert aggregate(LOSS, MASK, "token-mean", total=12).item() == pytest.approx(1.75)
    # seq-mean-token-mean over 4 sequences: (2.5 + 5.5) / 4
    assert aggregate(LOSS, MASK, "seq-mean-token-mean", total=4).item() == pytest.approx(2.0)
    # seq-mean-token-sum over 3 sequences: 21 / 3
    assert aggregate(LOSS, MASK, "seq-mean-token-sum", total=3).item() == pytest.approx(7.0)
    # -norm over 3 sequences, horizon 7: 21 / (3 * 7)
    assert aggregate(LOSS, MASK, "seq-mean-token-sum-norm", horizon=7, total=3).item() == pytest.approx(1.0)


def test_agg_normaliser_hand():
    assert agg_normaliser(MASK, "token-mean") == 6.0  # 4 + 2 valid tokens
    for mode in AGG_MODES[1:]:
        assert agg_normaliser(MASK, mode) == 2.0  # rows 0 and 1 have a valid token


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_empty_mask_is_zero_with_finite_grad(mode):
    loss = torch.randn(2, 3, requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 3), mode)
    out.backward()
    assert out.item() == 0.0
    assert torch.equal(loss.grad, torch.zeros(2, 3))


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError, match="'token-sum'.*token-mean"):
        aggregate(LOSS, MASK, "token-sum")
    with pytest.raises(ValueError, match="'mean'"):
        agg_normaliser(MASK, "mean")


def _loop_aggregate(loss, mask, mode, horizon):
    rows = []
    for b in range(loss.shape[0]):
        terms = [float(loss[b, t]) for t in range(loss.shape[1]) if mask[b, t] > 0]
        if terms:
            rows.append(terms)
    if not rows:
        return 0.0
    if mode == "token-mean":
        flat = [x for r in rows for x in r]
        return sum(flat) / len(flat)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / len(rows) / horizon


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_matches_loop(mode):
    gen = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    for _ in range(5):
        b, t = rng.randint(1, 6), rng.randint(1, 7)
        loss = torch.randn(b, t, generator=gen, dtype=torch.float64)
        mask = (torch.rand(b, t, generator=gen) > 0.4).double()
        mask[rng.randrange(b)] = 0.0  # one sequence without a valid token
        expected = _loop_aggregate(loss, mask, mode, horizon=t)
        assert aggregate(loss, mask, mode).item() == pytest.approx(expected, abs=1e-12)
