"""Micro-batching must not change the update: 1x8 and 8x1 give the same loss and gradients."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from reasonrl.config import AlgoConfig, TrainConfig
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.trainer.update import update_policy
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
        metrics = update_policy(model, opt, batch, algo, train, temperature=1.0, horizon=7, version=0)
        delta = torch.cat([(p0 - p1).flatten() for p0, p1 in zip(base.parameters(), model.parameters())])
        results.append((metrics, delta))
    (m8, d8), (m1, d1) = results
    assert d8.abs().max() > 1e-4  # the update did something
    torch.testing.assert_close(d1, d8, rtol=1e-4, atol=1e-6)
    assert m1["pg_loss"] == pytest.approx(m8["pg_loss"], rel=1e-5, abs=1e-7)
    assert m1["entropy"] == pytest.approx(m8["entropy"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m8["grad_norm"], rel=1e-5)


def _sgd_update(base, batch, algo, train):
    """(metrics, parameter change) of one update_policy call with SGD at lr 1 on a copy of ``base``."""
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    metrics = update_policy(model, opt, batch, algo, train, temperature=1.0, horizon=7, version=0)
    return metrics, torch.cat([(p0 - p1).flatten() for p0, p1 in zip(base.parameters(), model.parameters())])


def test_token_budget_micro_batches_give_same_update():
    torch.use_deterministic_algorithms(True)
    base = tiny_qwen2()
    batch = _train_batch(base)
    algo = AlgoConfig(loss_agg="token-mean", eps_low=0.2, eps_high=0.28)
    m_rows, d_rows = _sgd_update(base, batch, algo, TrainConfig(mini_batch_size=8, micro_batch_size=8, grad_clip=1e9))
    m_tok, d_tok = _sgd_update(base, batch, algo, TrainConfig(mini_batch_size=8, micro_batch_tokens=20, grad_clip=1e9))
    assert d_rows.abs().max() > 1e-4
    torch.testing.assert_close(d_tok, d_rows, rtol=1e-4, atol=1e-6)
    assert m_tok["pg_loss"] == pytest.approx(m_rows["pg_loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_rows_with_zero_advantage_are_skipped_without_changing_the_update(agg):
    torch.use_deterministic_algorithms(True)
    base = tiny_qwen2()
    batch = _train_batch(base)
    batch.advantages[[1, 2, 5]] = 0.0  # three rows (e.g. equal-reward groups) carry no signal
    algo = AlgoConfig(loss_agg=agg, eps_low=0.2, eps_high=0.28, entropy_coef=0.0, kl_loss_coef=0.0)
    for mini in (8, 4):
        full = TrainConfig(mini_batch_size=mini, micro_batch_size=2, grad_clip=1e9, skip_zero_advantage=False)
        m_all, d_all = _sgd_update(base, batch, algo, full)
        m_skip, d_skip = _sgd_update(base, batch, algo, replace(full, skip_zero_advantage=True))
        assert d_all.abs().max() > 1e-4
        torch.testing.assert_close(d_skip, d_all, rtol=1e-4, atol=1e-6)
        assert m_skip["pg_loss"] == pytest.approx(m_all["pg_loss"], rel=1e-5, abs=1e-7)
        # Rows 0, 3, 4 and 6 run; row 7's response is empty (nothing in its loss mask).
        assert m_all["trained_rows_frac"] == 1.0 and m_skip["trained_rows_frac"] == 4 / 8
        assert m_skip["trained_tokens"] == float(batch.loss_mask.sum() - batch.loss_mask[[1, 2, 5]].sum())


def test_a_mini_batch_without_signal_still_steps_the_optimizer():
    # Every row of the first mini-batch has zero advantage: Adam still steps (its moments
    # decay) exactly as with the rows run, whose gradient would be zero.
    base = tiny_qwen2()
    batch = _train_batch(base)
    batch.advantages[:4] = 0.0
    algo = AlgoConfig(loss_agg="token-mean", entropy_coef=0.0, kl_loss_coef=0.0)
    deltas = []
    for skip in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        train = TrainConfig(mini_batch_size=4, micro_batch_size=4, grad_clip=1e9, skip_zero_advantage=skip)
        update_policy(model, opt, batch, algo, train, temperature=1.0, horizon=7, version=0)
        deltas.append(torch.cat([(p0 - p1).flatten() for p0, p1 in zip(base.parameters(), model.parameters())]))
    torch.testing.assert_close(deltas[1], deltas[0], rtol=1e-4, atol=1e-7)


def test_entropy_or_kl_terms_disable_skipping():
    base = tiny_qwen2()
    batch = _train_batch(base)
    batch.advantages[[1, 2]] = 0.0
    train = TrainConfig(mini_batch_size=8, micro_batch_size=8, grad_clip=1e9)
    m, _ = _sgd_update(base, batch, AlgoConfig(entropy_coef=0.01, kl_loss_coef=0.0), train)
    assert m["trained_rows_frac"] == 1.0


@pytest.mark.parametrize("off_policy", ["tis", "decoupled"])
@pytest.mark.parametrize(("mini", "epochs"), [(8, 1), (4, 1), (4, 2)])
def test_the_proximal_anchor_from_the_update_equals_one_computed_before_it(off_policy, mini, epochs):
    # old_logprobs=None: the first mini-batch takes the anchor from its own first forward, the
    # others from a pass before the first step. The same update as a separately computed anchor.
    torch.use_deterministic_algorithms(True)
    base = tiny_qwen2()
    batch = _train_batch(base)
    # the sampler's log-probs: some weights cross the cap (2): truncated (tis) or masked (decoupled)
    g = torch.Generator().manual_seed(2)
    rollout = batch.scored.rollout
    rollout.logprobs = (batch.old_logprobs + 0.5 * torch.randn(batch.old_logprobs.shape, generator=g)) * rollout.response_mask
    algo = AlgoConfig(loss_agg="token-mean", eps_low=0.2, eps_high=0.28, off_policy=off_policy, tis_cap=2.0)
    train = TrainConfig(mini_batch_size=mini, micro_batch_size=2, ppo_epochs=epochs, grad_clip=1e9)
    anchor = compute_logprobs(base, rollout, temperature=1.0, micro_batch_size=8)
    m_given, d_given = _sgd_update(base, replace(batch, old_logprobs=anchor), algo, train)
    m_fused, d_fused = _sgd_update(base, replace(batch, old_logprobs=None), algo, train)
    assert d_given.abs().max() > 1e-4
    torch.testing.assert_close(d_fused, d_given, rtol=1e-4, atol=1e-6)
    assert m_fused["pg_loss"] == pytest.approx(m_given["pg_loss"], rel=1e-4, abs=1e-6)
    assert 0 < m_fused["off_policy/is_truncated_frac"] < 1 and m_fused["off_policy/is_weight_max"] > 2
    assert "off_policy/ess" in m_fused and "off_policy/ess" not in m_given  # a given anchor: the caller reports the gap


def test_a_single_mini_batch_costs_no_extra_forward_for_the_proximal_anchor():
    base = tiny_qwen2()
    batch = replace(_train_batch(base), old_logprobs=None)
    algo = AlgoConfig(loss_agg="token-mean", off_policy="decoupled")
    calls = []
    for mini, expected in ((8, 1), (4, 3)):  # one forward per micro-batch of 8 rows; + a pass over the later 4
        model = copy.deepcopy(base)
        calls.clear()
        model.model.embed_tokens.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[0]))
        update_policy(model, torch.optim.SGD(model.parameters(), lr=0.1), batch, algo,
                      TrainConfig(mini_batch_size=mini, micro_batch_size=8, grad_clip=1e9), temperature=1.0, horizon=7, version=0)
        assert len(calls) == expected, (mini, calls)
