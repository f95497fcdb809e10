"""A fast rollout backend: one batched decode loop over a preallocated key/value cache.

Same output contract as :class:`~reasonrl.rollout.hf.HFGenerator` and, under greedy
decoding, the same tokens. Each distinct prompt is encoded once (one prefill of the
left-padded prompts, its cache then copied to its ``n`` samples); each step then feeds one
token per live row, never re-encoding the prefix; rows that emitted EOS are dropped from
the work by compacting the batch and the cache. The model runs through
:class:`~reasonrl.models.decoder.LeanDecoder`: about 20 tensor operations per layer and step.

On a CUDA device a step (sampling included) is instead captured once per batch as a CUDA
graph and replayed (:meth:`FastGenerator._static_step`): a small model's step is hundreds
of kernels of microseconds each, whose launches cost more than their work. A graph needs
fixed shapes, so that loop keeps every row to the end and attends over the whole cache,
masked; on a GPU the extra rows cost little, and the launches saved are most of the step.

:meth:`FastGenerator.generate_stream` is the same loop with a callback that sees each
prompt group as soon as all its ``n`` samples have ended, and may stop the loop early
(the unfinished groups are then aborted): the building block of dynamic sampling that
generates nothing it will throw away (:mod:`reasonrl.rollout.scheduler`).

:meth:`FastGenerator.start` opens a :class:`FastContinuation` for multi-turn rollouts: turns of
the policy and environment tokens appended in between, over one cache, the prefix never
encoded again (:mod:`reasonrl.rollout.agent_loop`).

Threads: ``generate`` never changes torch's thread settings; set them in the caller. On
CPU, use ``torch.set_num_threads`` = the cores the process has to itself: when other busy
processes share those cores, fewer threads are faster (spinning threads wait on each other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch

from reasonrl.models.decoder import KVCache, LeanDecoder
from reasonrl.errors import InputError
from reasonrl.models.lora import load_adapters
from reasonrl.rollout.base import copy_weights, declares
from reasonrl.rollout.hf import (
    Continuation,
    Turn,
    assemble,
    collect_turns,
    eos_tuple,
    inference,
    is_eos,
    pad_prompts,
    response_mask,
    sample,
    turn_buffers,
)
from reasonrl.rollout.seeds import check_seeds, row_seeds, uniforms
from reasonrl.types import RolloutBatch, SamplingParams

# Compact the batch once at most this fraction of its rows is still live.
COMPACT_AT = 0.75


GroupsDone = Callable[[list[int], RolloutBatch], bool]
"""``on_groups_done(groups, rows) -> stop``: ``groups`` are the prompt indices (ascending)
whose ``n`` samples all ended at this decode step; ``rows`` holds exactly their rows
(``len(groups) * n``, prompt order, ``group_ids`` = prompt indices). Return True to stop
decoding now and abort every group that has not completed."""


class Decoded(NamedTuple):
    """What :meth:`FastGenerator._decode` returns (see there)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    stopped: bool
    interrupted: bool
    steps: int


@dataclass
class StreamResult:
    """What :meth:`FastGenerator.generate_stream` returns.

    batch:           the rows of the completed groups only, in prompt order, with
                     ``group_ids`` = the prompt index (so they may have gaps); responses
                     trimmed to the longest among them
    completed:       prompt indices of the completed groups, in the order they were
                     reported (decode step, then prompt index)
    aborted:         prompt indices of the groups aborted by an early stop (ascending)
    aborted_lengths: per row of the aborted groups (``aborted`` order, then sample), the
                     tokens generated for it before the stop (EOS included); a row of an
                     aborted group may have ended, its group had not
    stopped:         the callback asked to stop
    """

    batch: RolloutBatch
    completed: list[int]
    aborted: list[int]
    aborted_lengths: list[int]
    stopped: bool


def capture_graph(fn: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph:
    """``fn`` captured as a CUDA graph, after one warm-up run on a side stream (lazy
    initialisations such as cuBLAS workspaces must not be captured): the caller must undo
    what that run changed, or make ``fn`` give the same result when run twice."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@declares("fast")
class FastGenerator:
    """Rollouts with a hand-written batched decode loop over the trainer's own decoder.

    Runs the model's parameters through :class:`~reasonrl.models.decoder.LeanDecoder` (Llama,
    Qwen2 and Qwen3 decoders; ``rollout.backend=hf`` runs any other causal LM). It samples
    with ``model``: the trainer's own module when colocated with the policy (every update
    is seen at once), or a copy that :meth:`load_weights` refreshes. The returned tensors
    live on the model's device.

    ``static_shapes``: decode a fixed batch over the whole cache, each step a replayed CUDA
    graph; ``None`` (the default) does so on CUDA devices and compacts the batch elsewhere;
    ``True`` on a CPU runs the same fixed-shape loop eagerly (tests). Both loops draw a row's
    ``t``-th token with ``uniforms(row seed, t)`` (:mod:`reasonrl.rollout.seeds`), so they
    give the same tokens wherever their logits agree. A row ends on any of ``eos_ids``.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_ids: int | Sequence[int],
                 static_shapes: bool | None = None) -> None:
        try:
            self.decoder = LeanDecoder(model)
        except ValueError as err:
            raise InputError(f"rollout.backend=fast: {err}; use rollout.backend=hf") from None
        self.model = model
        self.pad_id = pad_id
        self.eos_ids = eos_tuple(eos_ids)
        self.static_shapes = static_shapes

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        copy_weights(self.model, tensors)

    def load_adapters(self, tensors: dict[str, torch.Tensor]) -> None:
        load_adapters(self.model, tensors)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        seeds: Sequence[int],
    ) -> RolloutBatch:
        """Sample ``n`` responses per prompt; see :class:`~reasonrl.rollout.base.RolloutBackend`.

        All randomness comes from ``seeds`` (one per prompt group): a group's tokens do not
        depend on the other prompts of the call, and the global RNG is untouched.
        """
        check_seeds(seeds, prompts)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)
        rows = row_seeds(seeds, n, device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                decoded = self._decode(prompt_ids, prompt_mask, n, params, rows)
                response_ids, logprobs = decoded.tokens, decoded.logprobs
        finally:
            self.model.train(was_training)
        return assemble(prompt_ids, prompt_mask, response_ids, logprobs, n, self.pad_id, self.eos_ids)

    def generate_stream(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        seeds: Sequence[int],
        on_groups_done: GroupsDone,
        cancel: Callable[[], bool] | None = None,
    ) -> StreamResult:
        """:meth:`generate`, reporting each prompt group to ``on_groups_done`` (see
        :data:`GroupsDone`) at the decode step where its last sample ends (EOS or
        ``max_new_tokens``), and stopping as soon as the callback returns True, or as soon as
        ``cancel()`` (asked after every decode step) does: a caller in another thread that
        decided the batch is full.

        The callback does not change the sampling: every completed group has exactly the
        tokens and log-probs that :meth:`generate` gives it for the same ``seeds``,
        and if the callback never stops the loop the
        batch equals :meth:`generate`'s. Deterministic: no threads, no timing involved.
        """
        check_seeds(seeds, prompts)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)
        rows = row_seeds(seeds, n, device)
        G = len(prompts)
        completed: list[int] = []
        reported = torch.zeros(G, dtype=torch.bool)

        def on_step(t: int, ended: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor) -> bool:
            done = ended.view(G, n).all(1).cpu() & ~reported
            if not done.any():
                return False
            groups = done.nonzero().squeeze(-1)
            reported[groups] = True
            completed.extend(groups.tolist())
            rows = self._group_rows(groups, n, device)
            batch = self._rows(prompt_ids, prompt_mask, tokens[:, : t + 1], logprobs[:, : t + 1], rows, n)
            return bool(on_groups_done(groups.tolist(), batch))

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                decoded = self._decode(prompt_ids, prompt_mask, n, params, rows, on_step=on_step, cancel=cancel)
                tokens, logprobs, stopped, steps_run = decoded.tokens, decoded.logprobs, decoded.stopped, decoded.steps
        finally:
            self.model.train(was_training)
        aborted = (~reported).nonzero().squeeze(-1)
        aborted_rows = self._group_rows(aborted, n, device)
        aborted_mask, _ = response_mask(tokens[aborted_rows, :steps_run], self.eos_ids)
        order = reported.nonzero().squeeze(-1)  # completed groups, prompt order
        batch = self._rows(prompt_ids, prompt_mask, tokens, logprobs, self._group_rows(order, n, device), n)
        return StreamResult(
            batch=batch,
            completed=completed,
            aborted=aborted.tolist(),
            aborted_lengths=aborted_mask.sum(-1).long().tolist(),
            stopped=stopped,
        )

    @staticmethod
    def _group_rows(groups: torch.Tensor, n: int, device) -> torch.Tensor:
        """[len(groups) * n] long: the rows of prompt groups ``groups``, in that order."""
        return (groups.to(device)[:, None] * n + torch.arange(n, device=device)).reshape(-1)

    def _rows(self, prompt_ids, prompt_mask, tokens, logprobs, rows: torch.Tensor, n: int) -> RolloutBatch:
        """The RolloutBatch of rows ``rows`` (whole groups), ``group_ids`` = prompt indices."""
        batch = assemble(
            prompt_ids[rows], prompt_mask[rows], tokens[rows], logprobs[rows], n, self.pad_id, self.eos_ids
        )
        batch.group_ids = rows // n
        return batch

    def _prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, length: int, static: bool):
        """Encode each distinct prompt (every ``n``-th row) once into a cache of ``length``
        slots, then copy it to the prompt's ``n`` rows.

        Returns ``(fused weights, cache, rope table, logits [B, V] of the first response token,
        key bias [B, 1, 1, length]: -inf on the prompts' padding, 0 elsewhere)``; ``static``:
        the cache's empty slots hold zeros and are masked too (see ``LeanDecoder.decode``).
        """
        decoder = self.decoder
        ids, mask = prompt_ids[::n], prompt_mask[::n]
        P = prompt_mask.shape[1]
        layers = decoder.fuse()
        table = decoder.rope_table(length, ids.device, next(self.model.parameters()).dtype)
        dtype = layers.dtype  # of the products and the cache: autocast's under train.precision=bf16-mixed
        cache = decoder.new_cache(ids.shape[0], length, ids.device, dtype, zeroed=static)
        logits = decoder.prefill(layers, ids, mask, cache, table)
        parent = torch.arange(prompt_ids.shape[0], device=ids.device) // n
        cache.select(parent)
        key_bias = torch.zeros((prompt_ids.shape[0], 1, 1, length), dtype=dtype, device=ids.device)
        key_bias[:, 0, 0, :P].masked_fill_(prompt_mask == 0, float("-inf"))
        if static:
            key_bias[:, 0, 0, P:] = float("-inf")
        return layers, cache, table, logits[parent], key_bias

    def _decode(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
        params: SamplingParams,
        seeds: torch.Tensor,
        on_step: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], bool] | None = None,
        limits: torch.Tensor | None = None,
        stop: Callable[[], bool] | None = None,
        cancel: Callable[[], bool] | None = None,
        offsets: torch.Tensor | None = None,
    ) -> Decoded:
        """Decode ``[B, P]`` prompts, each repeated ``n`` times in a row: ``Decoded(tokens [B, S],
        logprobs [B, S], ...)``; anything after a row's end is garbage.

        Row r's token ``t`` is drawn with ``uniforms(seeds[r], offsets[r] + t)``: ``seeds`` [B]
        the row seeds, ``offsets`` [B] (default 0) the tokens each row sampled before this call.
        A row ends on any of ``self.eos_ids``. ``limits`` [B] (optional): row r ends after
        ``limits[r]`` tokens (<= max_new_tokens).
        With ``on_step``, it is called after each step ``t`` at which some row ended, as
        ``on_step(t, ended [B] bool, tokens, logprobs)`` (``ended``: the row has emitted EOS or
        reached its limit or ``max_new_tokens``); a True return stops the loop at once
        (``stopped``). ``stop()`` is asked after every step; True ends the loop there
        (``interrupted``); ``cancel()`` likewise, but the loop is abandoned (``stopped``: nothing
        continues from it, so the fixed-shape loop may run it). ``steps`` is the number of steps
        run. The callbacks only observe:
        what is sampled does not depend on them until they stop the loop. Limits and ``stop``
        run the eager loop (no CUDA graph).
        """
        B, P = prompt_ids.shape
        steps = params.max_new_tokens
        device = prompt_ids.device
        tokens_out = torch.full((B, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs_out = torch.zeros((B, steps), device=device)
        eos_ids = torch.tensor(self.eos_ids, dtype=torch.long, device=device)
        seeds = seeds.to(device)
        offsets = torch.zeros_like(seeds) if offsets is None else offsets.to(device)
        if steps == 0:
            stopped = on_step is not None and bool(on_step(-1, torch.ones(B, dtype=torch.bool, device=device), tokens_out, logprobs_out))
            return Decoded(tokens_out, logprobs_out, stopped, False, 0)
        static = device.type == "cuda" if self.static_shapes is None else self.static_shapes
        static = static and limits is None and stop is None
        layers, cache, table, logits, key_bias = self._prefill(prompt_ids, prompt_mask, n, P + steps, static)
        rows = torch.arange(B, device=device)  # original row of each batch row
        position = prompt_mask.sum(-1)  # next position id of each batch row
        alive = torch.ones(B, dtype=torch.bool, device=device)  # not ended yet
        ended = torch.zeros(B, dtype=torch.bool, device=device) if on_step is not None else None
        static_step = None
        if static:
            state = (layers, cache, table, key_bias, logits, position, P, eos_ids)
            static_step = self._static_step(state, params, (seeds, offsets), tokens_out, logprobs_out, alive)
        live_before, stopped, interrupted, t = B, False, False, 0
        for t in range(steps):
            if static_step is not None:
                static_step(t)  # samples token t of every row, then feeds it to the model
            else:
                u = uniforms(seeds[rows], offsets[rows] + t) if params.temperature > 0 else None
                tokens, logprobs = sample(logits, params, u)
                tokens_out[rows, t] = tokens
                logprobs_out[rows, t] = logprobs
                alive &= ~is_eos(tokens, eos_ids)
                if limits is not None:
                    alive &= limits[rows] > t + 1
            n_alive = int(alive.sum())
            last = n_alive == 0 or t == steps - 1
            if on_step is not None and (n_alive < live_before or last):
                ended[rows[~alive]] = True
                if t == steps - 1:
                    ended[:] = True
                if on_step(t, ended, tokens_out, logprobs_out):
                    stopped = True
                    break
            live_before = n_alive
            if last:
                break
            if stop is not None and stop():
                interrupted = True
                break
            if cancel is not None and cancel():
                stopped = True
                break
            if static_step is not None:
                continue
            if n_alive <= COMPACT_AT * alive.shape[0]:
                keep = alive.nonzero().squeeze(-1)
                cache.select(keep)
                rows, tokens, position, alive = rows[keep], tokens[keep], position[keep], alive[keep]
                key_bias = key_bias[keep]
            logits = self.decoder.decode(layers, tokens, position, key_bias, cache, table)
            position = position + 1
        return Decoded(tokens_out, logprobs_out, stopped, interrupted, t + 1)

    def _static_step(self, state, params: SamplingParams, draws: tuple[torch.Tensor, torch.Tensor], tokens_out,
                     logprobs_out, alive):
        """``step(t)`` of the fixed-shape loop: sample token ``t`` of every row from the
        current logits into ``tokens_out``, ``logprobs_out`` and ``alive``, then run the
        model on it (cache slot ``P + t``) for the next logits. On CUDA the whole step is
        one captured graph (:func:`capture_graph`), replayed; elsewhere it runs eagerly.

        ``state`` is ``(fused weights, cache, rope table, key bias, logits [B, V] after the
        prompts, first positions [B], P, EOS ids [E] on the device)``. The step keeps its inputs in tensors of its own:
        the step index on the device, the logits buffer, and the uniforms of every step,
        computed at once (``[steps, B, 1]``: ``uniforms(seeds, offsets + t)`` for each step ``t``,
        ``draws = (seeds, offsets)``, as the eager loop draws them).
        """
        layers, cache, table, key_bias, logits, position, P, eos = state
        device, steps = logits.device, tokens_out.shape[1]
        t_now = torch.zeros(1, dtype=torch.long, device=device)
        table_u = None
        if params.temperature > 0:
            seeds, offsets = draws
            table_u = torch.stack([uniforms(seeds, offsets + t) for t in range(steps)])
        decoder = self.decoder

        def run() -> None:
            u = None if table_u is None else table_u.index_select(0, t_now)[0]
            tokens, logprobs = sample(logits, params, u)
            tokens_out.index_copy_(1, t_now, tokens[:, None])
            logprobs_out.index_copy_(1, t_now, logprobs[:, None])
            alive.logical_and_(~is_eos(tokens, eos))
            logits.copy_(decoder.decode(layers, tokens, position + t_now, key_bias, cache, table, slot=P + t_now))

        if device.type != "cuda":
            def step(t: int) -> None:
                t_now.fill_(t)
                run()
            return step
        first = logits.clone()
        graph = capture_graph(run, device)  # its warm-up ran step 0: sampling it again is the same,
        logits.copy_(first)  # but from the logits it overwrote

        def replay(t: int) -> None:
            t_now.fill_(t)
            graph.replay()
        return replay

    def start(
        self, prompts: list[list[int]], n: int, capacity: int, rows: torch.Tensor, eos_ids: Sequence[int] | None = None
    ) -> "FastContinuation":
        """A :class:`FastContinuation` of ``n`` rows per prompt with row seeds ``rows``
        (:func:`~reasonrl.rollout.seeds.row_seeds`), at most ``capacity`` tokens after each
        prompt, turns ending on any of ``eos_ids`` (default: the backend's). Continuations
        run the eager loop, on CUDA too (no CUDA graph: rows advance at their own pace)."""
        return FastContinuation(self, prompts, n, capacity, rows, self.eos_ids if eos_ids is None else eos_ids)


class FastContinuation(Continuation):
    """A :class:`~reasonrl.rollout.hf.Continuation` over one key/value cache: each distinct prompt
    is encoded once (:meth:`FastGenerator._prefill`), then every token once: a turn feeds one
    token per live row and step, :meth:`extend` each row's tokens as one ragged chunk
    (:meth:`~reasonrl.models.decoder.LeanDecoder.extend`, per-row rotary positions and key mask);
    the prefix is never encoded again.

    Cache row ``r``: its left-padded prompt in slots ``< P`` (real ones from ``low[r]``),
    then every token fed since, packed from slot ``P`` (``fill[r]``: slots written), so
    rows advance at their own pace; ``P + capacity`` slots are allocated at the start and
    never grown. A turn's last token is fed with the row's next extension or turn
    (``pending``). A turn works on a copy of its rows' cache (on the continuation's own when
    every row takes part), dropping the rows that ended once at most ``COMPACT_AT`` of them
    is live, and copies the slots it wrote back. Always the eager loop, on CUDA too: a
    continuation never captures CUDA graphs (its rows advance at their own pace).
    """

    def __init__(
        self, gen: FastGenerator, prompts: list[list[int]], n: int, capacity: int, rows: torch.Tensor,
        eos_ids: Sequence[int]
    ) -> None:
        super().__init__(prompts, n, capacity, rows, eos_ids, gen.pad_id, next(gen.model.parameters()).device)
        self.model, self.decoder = gen.model, gen.decoder
        prompt_ids, prompt_mask = pad_prompts(prompts, n, gen.pad_id, self.device)
        P = prompt_ids.shape[1]
        with inference(self.model):
            # static: a zeroed cache (attention reads past a shorter row's end, masked); its key bias is unused
            prefilled = gen._prefill(prompt_ids, prompt_mask, n, P + capacity, static=True)
            self.weights, self.cache, self.table, self.logits, _ = prefilled
        self.low = P - prompt_mask.sum(-1)
        self.fill = torch.full((self.size,), P, dtype=torch.long, device=self.device)
        self.pending: list[int | None] = [None] * self.size
        """Each row's last sampled token, not fed yet (the logits of such a row are stale)."""

    def _work(self, rows: list[int]) -> tuple[torch.Tensor, bool, KVCache]:
        """``(rows as a tensor, own, cache)``: the continuation's cache when ``rows`` are all its
        rows in order (``own``), else a copy of theirs."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        own = rows == list(range(self.size))
        return index, own, self.cache if own else self.cache.take(index)

    def _extend(self, rows: list[int], token_lists: list[list[int]]) -> None:
        chunks = [([] if self.pending[r] is None else [self.pending[r]]) + t for r, t in zip(rows, token_lists)]
        rows, chunks = [r for r, c in zip(rows, chunks) if c], [c for c in chunks if c]
        if not rows:
            return
        index, own, work = self._work(rows)
        lengths = torch.tensor([len(c) for c in chunks], dtype=torch.long, device=self.device)
        ids = torch.full((len(rows), int(lengths.max())), self.pad_id, dtype=torch.long)
        for k, chunk in enumerate(chunks):
            ids[k, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
        fill = self.fill[index]
        with inference(self.model):
            self.logits[index] = self.decoder.extend(
                self.weights, ids.to(self.device), lengths, fill, self.low[index], work, self.table
            )
        if not own:
            self.cache.put(index, work, torch.arange(len(rows), device=self.device), int(fill.min()))
        self.fill[index] = fill + lengths
        for r in rows:
            self.pending[r] = None

    def _turn(self, rows: list[int], limits: list[int], params: SamplingParams) -> list[Turn]:
        self._extend(rows, [[] for _ in rows])  # feed the pending tokens
        device, b, steps = self.device, len(rows), max(limits)
        index, own, work = self._work(rows)
        first_fill = self.fill[index]
        start = int(first_fill.min())
        limit, eos_ids, tokens, logprobs, lengths, eos, alive = turn_buffers(limits, self.eos_ids, self.pad_id, device)
        live = torch.arange(b, device=device)  # the turn row of each row of ``work``
        fill, low, logits = first_fill, self.low[index], self.logits[index]
        with inference(self.model):
            for t in range(steps):
                act = alive.nonzero().squeeze(-1)
                turn_rows = live[act]
                tok, logp = sample(logits[act], params, self.draws(index[turn_rows], t, params))
                tokens[turn_rows, t], logprobs[turn_rows, t], lengths[turn_rows] = tok, logp, t + 1
                eos[turn_rows] = is_eos(tok, eos_ids)
                alive[act] = ~eos[turn_rows] & (limit[turn_rows] > t + 1)
                n_alive = int(alive.sum())
                if n_alive == 0:
                    break
                feed = torch.full((live.shape[0], 1), self.pad_id, dtype=torch.long, device=device)
                feed[act, 0] = tok
                if n_alive <= COMPACT_AT * live.shape[0]:
                    keep, drop = alive.nonzero().squeeze(-1), (~alive).nonzero().squeeze(-1)
                    if not own:
                        self.cache.put(index[live[drop]], work, drop, start)
                    work, own = work.take(keep), False
                    live, alive, fill, low, feed = live[keep], alive[keep], fill[keep], low[keep], feed[keep]
                logits = self.decoder.extend(self.weights, feed, alive.long(), fill, low, work, self.table)
                fill = fill + alive.long()
        if not own:
            self.cache.put(index[live], work, torch.arange(live.shape[0], device=device), start)
        self.fill[index] = first_fill + lengths - 1  # every token but each row's last is fed
        turns = collect_turns(tokens, logprobs, lengths, eos)
        for r, turn in zip(rows, turns):
            self.pending[r] = turn.tokens[-1]
        return turns
