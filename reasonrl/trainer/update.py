"""PPO-style updates: epochs over mini-batches, micro-batches with gradient accumulation.

Each mini-batch is one optimizer step. Its loss is split over micro-batches so that
the sum of the micro-batch losses is exactly the mini-batch loss (``aggregate`` with the
mini-batch normaliser ``total``): gradients do not depend on the micro-batch size.

Data-parallel ranks (a :class:`~reasonrl.trainer.distributed.DataParallel` context ``dp``) split
each mini-batch the same way: every rank holds the whole batch, computes ``total`` from the
whole mini-batch, and runs forward and backward on its own rows only (a token-balanced share,
:meth:`~reasonrl.trainer.distributed.DataParallel.own`)::

    loss_rank = sum over its rows' micro-batches of aggregate(l, m, agg, total=total)
    sum over ranks of loss_rank = the mini-batch loss;  grad = all-reduce SUM of grad(loss_rank)

so N ranks take the single-rank optimizer steps, with the single-rank clipping (the global
norm: after the all-reduce every rank holds the same gradients) and the same skip decisions
(computed from the all-reduced loss and gradients, so every rank agrees).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import torch

from reasonrl.algo import (
    IS_WEIGHTS,
    agg_normaliser,
    aggregate,
    behaviour_metrics,
    kl_penalty,
    logprob_mismatch,
    ppo_clip,
    value_loss,
)
from reasonrl.config import AlgoConfig, TrainConfig
from reasonrl.trainer.critic import Critic
from reasonrl.trainer.distributed import DataParallel
from reasonrl.trainer.logprobs import compute_logprobs, micro_batches, policy_logprobs, sequence_lengths
from reasonrl.types import TrainBatch

MicroLoss = Callable[[torch.Tensor, float], tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]]
"""(rows of the micro-batch, mini-batch normaliser) -> (loss share, shares, means).

``shares`` are this micro-batch's parts of mini-batch aggregates (summed over the
micro-batches of a mini-batch); ``means`` are per-micro-batch ratios (averaged)."""


def minibatch_steps(
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    mask: torch.Tensor,
    lengths: torch.Tensor,
    agg: str,
    train: TrainConfig,
    micro_loss: MicroLoss,
    active: torch.Tensor | None = None,
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """Run ``train.ppo_epochs`` passes over the batch in mini-batches of ``train.mini_batch_size``.

    Per mini-batch: zero grads, accumulate the gradients of its micro-batches
    (:func:`~reasonrl.trainer.logprobs.micro_batches` of ``train.micro_batch_size`` rows, or
    length-sorted within ``train.micro_batch_tokens``; ``lengths`` are the rows' prompt +
    response tokens), clip the global grad norm to ``train.grad_clip``, step. With
    ``active`` (a [B] bool), only active rows run forward and backward; the others must have
    an exactly zero gradient (the loss normaliser still counts them), and a mini-batch
    without active rows steps on zero gradients, as the full computation would. A
    non-finite loss or grad norm skips the optimizer step
    (counted in ``nonfinite_skips``). Returns shares summed per mini-batch then averaged over mini-batches, means averaged
    over micro-batches, and ``grad_norm`` averaged over mini-batches.

    With ``dp``, the rank runs its own rows of each mini-batch's (active) rows, then
    :meth:`~reasonrl.trainer.distributed.DataParallel.reduce_gradients` sums the gradients and
    the loss over the ranks before clipping; the returned metrics are the global ones
    (shares summed over ranks, means averaged over every rank's micro-batches).
    """
    sums: dict[str, list[float]] = defaultdict(list)
    share_keys = {"loss"}
    skips = 0
    B = mask.shape[0]
    for _ in range(train.ppo_epochs):
        for mini in torch.arange(B, device=mask.device).split(train.mini_batch_size):
            total = agg_normaliser(mask[mini], agg)
            optimizer.zero_grad(set_to_none=True)
            run = mini if active is None else mini[active[mini]]
            shares: dict[str, float] = {"loss": 0.0}
            if run.numel() == 0:  # every loss term of the mini-batch is exactly zero
                for p in params:
                    p.grad = torch.zeros_like(p)
            for micro, real in _passes(run, lengths, train, dp, filler=mini[:1]):
                loss, micro_shares, means = micro_loss(micro, total)
                if not real:  # a pass that only keeps the ranks' forward passes in step
                    (loss * 0).backward()
                    continue
                loss.backward()
                shares["loss"] += loss.item()
                for k, v in micro_shares.items():
                    shares[k] = shares.get(k, 0.0) + float(v)
                for k, v in means.items():
                    sums[k].append(float(v))
            if dp is not None:
                shares["loss"] = dp.reduce_gradients(params, shares["loss"])
            share_keys.update(shares)
            for k, v in shares.items():
                sums[k].append(v)
            if dp is None:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
            else:
                grad_norm = dp.clip(params, train.grad_clip)
            sums["grad_norm"].append(float(grad_norm))
            if torch.isfinite(grad_norm) and math.isfinite(shares["loss"]):
                optimizer.step()
            else:
                optimizer.zero_grad(set_to_none=True)
                skips += 1
    for k in share_keys:  # a mini-batch that ran no rows has zero shares
        sums[k] += [0.0] * (len(sums["loss"]) - len(sums[k]))
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    if dp is not None:  # loss and grad_norm are global already
        split = share_keys - {"loss"}
        means = set(sums) - share_keys - {"grad_norm"}
        out.update(dp.reduce_metrics(sums, split, means, len(sums["loss"])))
    out["nonfinite_skips"] = float(skips)
    return out


def _passes(
    rows: torch.Tensor, lengths: torch.Tensor, train: TrainConfig, dp: DataParallel | None, filler: torch.Tensor
) -> list[tuple[torch.Tensor, bool]]:
    """``(micro-batch, real)`` forward passes over ``rows`` (this rank's own part of them with ``dp``)."""
    if dp is None:
        return [(m, True) for m in micro_batches(rows, lengths, train.micro_batch_size, train.micro_batch_tokens)]
    own = dp.own(rows, lengths)
    return dp.passes(micro_batches(own, lengths, train.micro_batch_size, train.micro_batch_tokens), filler)


def own_logprobs(
    model: torch.nn.Module, rollout, temperature: float, train: TrainConfig, rows: torch.Tensor, dp: DataParallel
) -> torch.Tensor:
    """[B, T] log-probs of ``rows`` (this rank's, 0 elsewhere) without gradients, in the
    micro-batches of :func:`~reasonrl.trainer.logprobs.compute_logprobs` (under fsdp padded to
    the ranks' common number of passes, :meth:`~reasonrl.trainer.distributed.DataParallel.passes`)."""
    lengths = sequence_lengths(rollout)
    out = torch.zeros_like(rollout.response_mask)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            micros = micro_batches(rows, lengths, train.micro_batch_size, train.micro_batch_tokens)
            for micro, real in dp.passes(micros, filler=torch.zeros(1, dtype=torch.long, device=out.device)):
                logprobs, _, T = policy_logprobs(model, rollout, micro, temperature, with_entropy=False,
                                                 head_chunk=train.lm_head_chunk)
                if real:
                    out[micro, :T] = logprobs
    finally:
        model.train(was_training)
        dp.settle(model)
    return out * rollout.response_mask


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    algo: AlgoConfig,
    train: TrainConfig,
    temperature: float,
    horizon: int,
    version: int,
    dp: DataParallel | None = None,
) -> dict[str, float]:
    """One PPO update of the policy on ``batch``, whose weights are ``version``.

    loss = ppo_clip(logp, old, A; eps_low, eps_high, dual_clip; weights = w)
           + kl_loss_coef * agg(kl_penalty(logp, ref, kl_kind))
           - entropy_coef * agg(entropy)
    all aggregated with ``algo.loss_agg`` over the loss mask. With ``algo.off_policy`` tis or
    decoupled, ``w = IS_WEIGHTS[off_policy](old, mu, mask, tis_cap)``, mu the sampling
    log-probs (:mod:`reasonrl.algo.off_policy`); otherwise w = 1.

    The anchor ``old`` is ``batch.old_logprobs``, or, when that is None, the policy's own
    log-probs at the start of this update (the proximal policy): the rows of the first
    mini-batch take them from their first forward, which runs before any optimizer step (so
    the ratio is exactly 1 there, as the definition says), and the other rows from one
    no-grad pass before the first step. A single mini-batch thus costs no extra forward.
    The behaviour gap is then returned as ``off_policy/*`` (:func:`behaviour_metrics`), and the
    numerics gap on the tokens sampled by ``version`` itself as ``rollout/logprob_*``
    (:func:`logprob_mismatch`; none when no token was).

    With ``train.skip_zero_advantage`` and no KL or entropy term, rows whose advantages are 0
    on every token (a group-relative group with equal rewards) are not run: each of their
    loss terms is ``-0 * ratio``, so their gradient is exactly zero and the update is the
    same. ``actor/entropy`` (averaged over micro-batches) and the clip fractions then
    describe the rows that ran; ``trained_tokens`` and ``trained_rows_frac`` say how many.

    With ``dp`` (data-parallel ranks, every one calling this on the whole batch), each rank
    trains its own rows of every mini-batch (:func:`minibatch_steps`) and computes the
    proximal anchor of the rows it will train only: its rows of the first mini-batch from
    their first forward, its rows of the later ones in a pass before the first step. One
    all-reduce at the end gathers the anchor rows for the ``off_policy/*`` and
    ``rollout/logprob_*`` metrics, so every returned metric is the global one.
    """
    rollout = batch.scored.rollout
    lengths = sequence_lengths(rollout)
    skipping = train.skip_zero_advantage and algo.kl_loss_coef == 0 and algo.entropy_coef == 0
    active = ((batch.advantages != 0) & batch.loss_mask.bool()).any(-1) if skipping else None
    weigh = IS_WEIGHTS.get(algo.off_policy)
    behaviour = rollout.logprobs * rollout.action_mask
    anchor, known = batch.old_logprobs, None
    if anchor is None:
        anchor = torch.zeros_like(batch.loss_mask)
        known = torch.zeros(rollout.size, dtype=torch.bool, device=anchor.device)
        minis = torch.arange(rollout.size, device=anchor.device).split(train.mini_batch_size)
        runs = [m if active is None else m[active[m]] for m in minis]
        if dp is None:
            rest = torch.cat(runs[1:] + [runs[0][:0]])
            if rest.numel():
                scored = compute_logprobs(model, rollout, temperature, train.micro_batch_size, train.micro_batch_tokens, rest,
                                          head_chunk=train.lm_head_chunk)
                anchor[rest] = scored[rest]
        else:
            rest = torch.cat([dp.own(run, lengths) for run in runs[1:]] + [runs[0][:0]])
            anchor[rest] = own_logprobs(model, rollout, temperature, train, rest, dp)[rest]
            mine = known.clone()
            mine[rest] = True
            mine[dp.own(runs[0], lengths)] = True
        known[rest] = True

    def micro_loss(rows: torch.Tensor, total: float) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        logprobs, entropy, T = policy_logprobs(model, rollout, rows, temperature, with_entropy=True,
                                               head_chunk=train.lm_head_chunk)
        mask = batch.loss_mask[rows, :T]
        if known is not None and not bool(known[rows].all()):  # first seen before any optimizer step
            anchor[rows, :T] = logprobs.detach() * rollout.action_mask[rows, :T]
            known[rows] = True
        old = anchor[rows, :T]
        loss, metrics = ppo_clip(
            logprobs,
            old,
            batch.advantages[rows, :T],
            mask,
            algo.eps_low,
            algo.eps_high,
            algo.dual_clip,
            agg=algo.loss_agg,
            horizon=horizon,
            total=total,
            weights=None if weigh is None else weigh(old, behaviour[rows, :T], mask, algo.tis_cap),
        )
        shares = {"pg_loss": loss.detach()}
        if algo.kl_loss_coef > 0:
            kl = aggregate(kl_penalty(logprobs, batch.ref_logprobs[rows, :T], algo.kl_kind), mask, algo.loss_agg, horizon, total)
            loss = loss + algo.kl_loss_coef * kl
            shares["kl_loss"] = kl.detach()
        if skipping:  # a metric of the rows that run: per micro-batch
            metrics["entropy"] = aggregate(entropy.detach(), mask, algo.loss_agg, horizon)
            return loss, shares, metrics
        ent = aggregate(entropy, mask, algo.loss_agg, horizon, total)
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * ent
        shares["entropy"] = ent.detach()
        return loss, shares, metrics

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    out = minibatch_steps(params, optimizer, batch.loss_mask, lengths, algo.loss_agg, train, micro_loss, active, dp)
    trained = batch.loss_mask if active is None else batch.loss_mask * active[:, None]
    out["trained_tokens"] = float(trained.sum())
    out["trained_rows_frac"] = 1.0 if active is None else float(active.float().mean())
    if known is not None:
        if dp is not None:
            anchor, known = dp.gather_rows(anchor, mine)
        gap = behaviour_metrics(anchor[known], behaviour[known], rollout.action_mask[known], algo.tis_cap)
        out.update({f"off_policy/{k}": v.item() for k, v in gap.items()})
        out.update(sampler_gap(anchor, behaviour, rollout, version, known))
    return out


def sampler_gap(
    trainer: torch.Tensor, sampler: torch.Tensor, rollout, version: int, rows: torch.Tensor | None = None
) -> dict[str, float]:
    """``rollout/logprob_*`` (:func:`logprob_mismatch`) of the trainer's log-probs against the
    sampling ones on the response tokens that weights ``version`` sampled (of ``rows``, a [B]
    bool, when given): the gap of numerics alone, no staleness in it. Empty when there is none."""
    same = rollout.action_mask.bool() & (rollout.versions == version)
    if rows is not None:
        same &= rows[:, None]
    if not bool(same.any()):
        return {}
    return {f"rollout/{k}": v.item() for k, v in logprob_mismatch(trainer, sampler, same).items()}


def update_critic(
    critic: Critic, optimizer: torch.optim.Optimizer, batch: TrainBatch, algo: AlgoConfig, train: TrainConfig, horizon: int
) -> dict[str, float]:
    """One update of the critic: value_coef * 0.5 * agg(max((V - R)^2, (clip(V, V_old +- c) - R)^2))."""
    rollout = batch.scored.rollout

    def micro_loss(rows: torch.Tensor, total: float) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        values, T = critic(rollout, rows)
        mask = batch.loss_mask[rows, :T]
        loss, metrics = value_loss(
            values, batch.values[rows, :T], batch.returns[rows, :T], mask, train.value_clip, algo.loss_agg, horizon, total
        )
        return train.value_coef * loss, {"vf_loss": loss.detach()}, metrics

    critic.train()
    lengths = sequence_lengths(rollout)
    return minibatch_steps(list(critic.parameters()), optimizer, batch.loss_mask, lengths, algo.loss_agg, train, micro_loss)


def params_finite(module: torch.nn.Module) -> bool:
    """Whether every parameter of ``module`` is finite: ``isfinite(p).all()`` per parameter,
    combined with ``&`` on the first parameter's device and read back with one synchronisation."""
    finite = None
    for p in module.parameters():
        flag = p.isfinite().all()
        finite = flag if finite is None else finite & flag.to(finite.device)
    return finite is None or bool(finite)
