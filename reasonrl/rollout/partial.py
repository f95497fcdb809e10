"""Partial rollouts: generation that a new weight version interrupts; the unfinished samples then
go on with the new weights (``rollout.interrupt``, AReaL's interruptible generation).

    rollouts = PartialRollouts(fast, pending=has_new_weights, reload=load_new_weights, version=current_version)
    batch = rollouts.generate(prompts, n, params, seeds)   # batch.versions may hold several versions per row

A phase decodes (:meth:`FastGenerator._decode`) until every row has ended or ``pending()``
says that new weights wait; ``reload()`` then loads them, and the next phase encodes each
unfinished row's prompt plus its tokens so far afresh (their keys and values were computed
with the old weights) and continues it within what is left of ``max_new_tokens``, its random
draws going on from where they stopped (token ``t`` of a row is drawn with
``uniforms(row seed, t)`` in whichever phase samples it). Each token
keeps the version that sampled it, so staleness is counted from a row's oldest token. When no
update arrives, the result is :meth:`FastGenerator.generate`'s, token for token.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import torch

from reasonrl.config.capabilities import BACKENDS
from reasonrl.rollout.fast import FastGenerator, GroupsDone, StreamResult
from reasonrl.rollout.hf import inference, is_eos, pad_prompts
from reasonrl.rollout.seeds import check_seeds, row_seeds
from reasonrl.types import RolloutBatch, SamplingParams


class _Rows:
    """Every row's prompt and, across phases, its tokens, log-probs and versions so far."""

    def __init__(self, prompts: list[list[int]], n: int) -> None:
        self.prompt = [p for p in prompts for _ in range(n)]
        B = len(self.prompt)
        self.tokens: list[list[int]] = [[] for _ in range(B)]
        self.logprobs: list[list[float]] = [[] for _ in range(B)]
        self.versions: list[list[int]] = [[] for _ in range(B)]
        self.ended = [False] * B

    def add(self, row: int, tokens: torch.Tensor, logprobs: torch.Tensor, version: int, ended: bool) -> None:
        self.tokens[row] += tokens.tolist()
        self.logprobs[row] += logprobs.tolist()
        self.versions[row] += [version] * tokens.numel()
        self.ended[row] = ended


class PartialRollouts:
    """A :class:`FastGenerator` whose generation a weight update interrupts (see the module docstring).

    ``pending()``: new weights wait (asked after every decode step); ``reload()``: load them;
    ``version()``: the version of the weights loaded now.
    """

    continues = False  # no start(): the rules refuse env.name with rollout.interrupt
    interrupts = True
    streams = True
    trainer_numerics = BACKENDS["fast"].trainer_numerics

    def __init__(self, fast: FastGenerator, pending: Callable[[], bool], reload: Callable[[], None], version: Callable[[], int]) -> None:
        self.fast, self.pending, self.reload, self.version = fast, pending, reload, version

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        self.fast.load_weights(tensors)

    def load_adapters(self, tensors: dict[str, torch.Tensor]) -> None:
        self.fast.load_adapters(tensors)

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int]) -> RolloutBatch:
        """``n`` samples per prompt; see :class:`~reasonrl.rollout.base.RolloutBackend`."""
        return self.generate_stream(prompts, n, params, seeds, lambda groups, rows: False).batch

    def generate_stream(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int], on_groups_done: GroupsDone,
        cancel: Callable[[], bool] | None = None,
    ) -> StreamResult:
        """:meth:`FastGenerator.generate_stream` across interruptions: a group is reported once
        all its rows have ended, whichever phase each ended in; ``cancel()`` ends it as there."""
        check_seeds(seeds, prompts)
        fast, device = self.fast, next(self.fast.model.parameters()).device
        rows = _Rows(prompts, n)
        row_seed = row_seeds(seeds, n, device)
        G, max_new = len(prompts), params.max_new_tokens
        reported = [False] * G
        completed: list[int] = []
        active = list(range(G * n))  # the rows this phase decodes, in phase-row order
        stopped, first = False, True
        while active:
            version = self.version()
            if first:
                prompt_ids, prompt_mask = pad_prompts(prompts, n, fast.pad_id, device)
                phase_n, limits, phase_params = n, None, params
            else:
                prompt_ids, prompt_mask = pad_prompts([rows.prompt[r] + rows.tokens[r] for r in active], 1, fast.pad_id, device)
                left = torch.tensor([max_new - len(rows.tokens[r]) for r in active], device=device)
                phase_n, limits, phase_params = 1, left, replace(params, max_new_tokens=int(left.max()))
            recorded = torch.zeros(len(active), dtype=torch.bool)
            phase_rows = active
            index = torch.tensor(phase_rows, dtype=torch.long, device=device)
            offsets = torch.tensor([len(rows.tokens[r]) for r in phase_rows], dtype=torch.long, device=device)

            def on_step(t: int, ended: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> bool:
                new = (ended.cpu() & ~recorded).nonzero().squeeze(-1).tolist()
                for i in new:
                    length = self._length(tokens[i, : t + 1], None if limits is None else int(limits[i]))
                    rows.add(phase_rows[i], tokens[i, :length], logprobs[i, :length], version, ended=True)
                    recorded[i] = True
                done = sorted({r // n for r in (phase_rows[i] for i in new)}
                              - {g for g in range(G) if reported[g]})
                done = [g for g in done if all(rows.ended[g * n + j] for j in range(n))]
                if not done:
                    return False
                for g in done:
                    reported[g] = True
                completed.extend(done)
                return bool(on_groups_done(done, self._batch(rows, [g * n + j for g in done for j in range(n)], n)))

            with inference(fast.model):
                decoded = fast._decode(prompt_ids, prompt_mask, phase_n, phase_params, row_seed[index], on_step=on_step,
                                       limits=limits, stop=self.pending, offsets=offsets, cancel=cancel)
            if decoded.stopped or not decoded.interrupted:
                stopped = decoded.stopped
                break
            for i in (~recorded).nonzero().squeeze(-1).tolist():  # interrupted: no EOS, no limit yet
                rows.add(phase_rows[i], decoded.tokens[i, : decoded.steps], decoded.logprobs[i, : decoded.steps], version, ended=False)
            active = [r for r in phase_rows if not rows.ended[r] and not reported[r // n]]
            self.reload()
            first = False
        order = [g for g in range(G) if reported[g]]
        aborted = [g for g in range(G) if not reported[g]]
        return StreamResult(
            batch=self._batch(rows, [g * n + j for g in order for j in range(n)], n),
            completed=completed,
            aborted=aborted,
            aborted_lengths=[len(rows.tokens[g * n + j]) for g in aborted for j in range(n)],
            stopped=stopped,
        )

    def _length(self, tokens: torch.Tensor, limit: int | None) -> int:
        """Tokens of a row that has ended by step ``len(tokens) - 1``: through its first EOS (any
        of the backend's EOS ids) within its limit, else up to the limit (what follows either is garbage)."""
        if limit is not None:
            tokens = tokens[:limit]
        eos = is_eos(tokens, torch.tensor(self.fast.eos_ids, dtype=torch.long, device=tokens.device)).nonzero()
        return int(eos[0]) + 1 if eos.numel() else len(tokens)

    def _batch(self, rows: _Rows, which: list[int], n: int) -> RolloutBatch:
        """The RolloutBatch of rows ``which`` (whole groups, prompt order), ``group_ids`` = prompt index."""
        device = next(self.fast.model.parameters()).device
        pad, eos_ids = self.fast.pad_id, self.fast.eos_ids
        B = len(which)
        if B == 0:
            prompt_ids = prompt_mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        else:
            prompt_ids, prompt_mask = pad_prompts([rows.prompt[r] for r in which], 1, pad, device)
        T = max((len(rows.tokens[r]) for r in which), default=0)
        response_ids = torch.full((B, T), pad, dtype=torch.long)
        logprobs = torch.zeros((B, T))
        versions = torch.zeros((B, T), dtype=torch.long)
        for i, r in enumerate(which):
            k = len(rows.tokens[r])
            response_ids[i, :k] = torch.tensor(rows.tokens[r], dtype=torch.long)
            logprobs[i, :k] = torch.tensor(rows.logprobs[r])
            versions[i, :k] = torch.tensor(rows.versions[r], dtype=torch.long)
        lengths = torch.tensor([len(rows.tokens[r]) for r in which], dtype=torch.long)
        mask = (torch.arange(T)[None] < lengths[:, None]).float()
        eos = torch.tensor([bool(rows.tokens[r]) and rows.tokens[r][-1] in eos_ids for r in which], dtype=torch.bool)
        return RolloutBatch(
            prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids.to(device),
            response_mask=mask.to(device), logprobs=logprobs.to(device), eos=eos.to(device), truncated=(~eos).to(device),
            group_ids=torch.tensor([r // n for r in which], dtype=torch.long, device=device), versions=versions.to(device),
        )
