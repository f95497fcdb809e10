"""Micro-batching must not change the update: 1x8 and 8x1 give the same loss and gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from reasonrl.config import AlgoConfig, TrainConfig
from reasonrl.train.logprobs import compute_logprobs
from reasonrl.train.update import update_policy
from reasonrl.types import ScoredBatch, TrainBatch
from tests.conftest import synthetic_rollout, tiny_qwen2


def _train_batch(model):
    rollout = synthetic_rollout(B=8)
    old = compute_logprobs(model, rollout, temperature=1.0, micro_batch_size=8)
    g = torch.Generator().manual_seed(1)
    adv = torch.randn(8, generator=g)[:, None] * rollout.response_mask
    # Old log-probs shifted so that some ratios are clipped and the clip fractions are non-trivial.
    old = old + 0.3 * torch.randn(old.shape, generator=g) * rollout.response_mask
    scored = ScoredBatch(rollout, [None] * 8, [""] * 8, torch.zeros(8), torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.bool))
    return TrainBatch(scored, rollout.response_mask, old, adv)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_gives_same_loss_and_gradients(agg):
    torch.use_deterministic_algorithms(True)
    base = tiny_qwen2()
    batch = _train_batch(base)
    algo = AlgoConfig(loss_agg=agg, eps_low=0.2, eps_high=0.28, entropy_coef=0.01)
    results = []
    for micro in (8, 1):
        model = copy.deepcopy(base)
        # SGD with lr 1: the parameter change is exactly minus the accumulated gradient.
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        train = TrainConfig(mini_batch_size=8, micro_batch_size=micro, grad_clip=1e9)
        metrics = update_policy(model, opt, batch, algo, train, temperature=1.0, horizon=7)
        delta = torch.cat([(p0 - p1).flatten() for p0, p1 in zip(base.parameters(), model.parameters())])
        results.append((metrics, delta))
    (m8, d8), (m1, d1) = results
    assert d8.abs().max() > 1e-4  # the update did something
    torch.testing.assert_close(d1, d8, rtol=1e-4, atol=1e-6)
    assert m1["pg_loss"] == pytest.approx(m8["pg_loss"], rel=1e-5, abs=1e-7)
    assert m1["entropy"] == pytest.approx(m8["entropy"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m8["grad_norm"], rel=1e-5)
