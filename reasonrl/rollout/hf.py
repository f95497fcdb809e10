"""The reference rollout backend: the ``transformers`` forward of any causal LM, decoding
over its key/value cache and sampling with :func:`sample` (per-row uniforms,
:mod:`reasonrl.rollout.seeds`); for multi-turn rollouts, :meth:`HFGenerator.start` opens an
:class:`HFContinuation` (the ``transformers`` forward over the whole token sequence each turn).

Also holds the helpers every backend shares: :func:`pad_prompts` (repeat and
left-pad the prompts), :func:`assemble` (turn generated tokens and their raw
logits into a :class:`~reasonrl.types.RolloutBatch`), :func:`eos_tuple` / :func:`is_eos`
(a sample ends on any of the model's EOS ids, :func:`~reasonrl.models.loading.load_eos_ids`),
:func:`sample` (one token per row from logits) and the :class:`Continuation` protocol of
multi-turn continuation (token ids in, token ids out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Iterator, NamedTuple, Sequence

import torch

from reasonrl.models.lora import load_adapters
from reasonrl.rollout.base import copy_weights, declares
from reasonrl.rollout.seeds import check_seeds, row_seeds, uniforms
from reasonrl.types import RolloutBatch, SamplingParams


def pad_prompts(
    prompts: list[list[int]], n: int, pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat each prompt ``n`` times (row ``i * n + j``) and left-pad with ``pad_id``.

    Returns ``(prompt_ids [B, P] long, prompt_mask [B, P] long)`` with ``B = len(prompts) * n``
    and ``P`` the longest prompt; the mask is 1 on real prompt tokens.
    """
    if n < 1:
        raise ValueError(f"n: expected a number of samples per prompt >= 1, got {n}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token id lists")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p) :] = 1
    return (
        ids.repeat_interleave(n, dim=0).to(device),
        mask.repeat_interleave(n, dim=0).to(device),
    )


def eos_tuple(eos_ids: int | Sequence[int]) -> tuple[int, ...]:
    """The EOS ids a backend stops on, as a non-empty tuple (one id may be given as an int)."""
    ids = (int(eos_ids),) if isinstance(eos_ids, int) else tuple(int(i) for i in eos_ids)
    if not ids:
        raise ValueError("eos_ids: expected at least one EOS token id")
    return ids


def is_eos(tokens: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """Bool tensor of ``tokens``' shape: the token is one of ``eos_ids`` (a 1-D long tensor on
    the tokens' device; no host sync, so a CUDA graph may hold it)."""
    return (tokens.unsqueeze(-1) == eos_ids).any(-1)


def response_mask(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask [B, T] float, eos [B] bool)``: 1 up to and including the first token that is
    one of ``eos_ids``."""
    ended = is_eos(response_ids, torch.tensor(eos_ids, dtype=torch.long, device=response_ids.device))
    eos = ended.any(-1)
    # Number of EOS tokens strictly before each position: 0 means still live (or the EOS itself).
    before = torch.cumsum(ended.long(), -1) - ended.long()
    return (before == 0).float(), eos


def assemble(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    logprobs: torch.Tensor,
    n: int,
    pad_id: int,
    eos_ids: Sequence[int],
) -> RolloutBatch:
    """Build the RolloutBatch from raw generated tokens and their log-probs.

    ``response_ids`` [B, S] may hold anything after a row's first EOS (any of ``eos_ids``); those positions
    are set to ``pad_id`` (log-prob 0), and the responses are trimmed to the longest one.
    ``versions`` are 0: the rollout worker stamps the version of the weights it sampled with.
    """
    mask, eos = response_mask(response_ids, eos_ids)
    T = int(mask.sum(-1).max().item()) if mask.numel() else 0
    mask = mask[:, :T]
    B = prompt_ids.shape[0]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=torch.where(mask.bool(), response_ids[:, :T], pad_id),
        response_mask=mask,
        logprobs=logprobs[:, :T].float() * mask,
        eos=eos,
        truncated=~eos,
        group_ids=torch.arange(B, device=prompt_ids.device) // n,
        versions=torch.zeros_like(mask, dtype=torch.long),
    )


def sample(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row from ``[b, V]`` raw logits; return ``(tokens [b], logprobs [b])``.

    Log-probs are ``log_softmax(logits / temperature)`` of the chosen token (temperature 1
    for greedy), before truncation. Sampling applies temperature, then top-k, then top-p
    (the smallest set of most likely tokens whose mass reaches ``top_p``), as
    ``transformers`` does, and draws by inverting the CDF: token = the first ``i`` with
    ``cumsum(p)_i > u * sum(p)`` with ``u`` the row's entry of ``uniforms [b, 1]`` in [0, 1)
    (:func:`~reasonrl.rollout.seeds.uniforms`; tokens of zero mass are never chosen).
    Greedy decoding reads no uniforms.
    """
    logits = logits.float()
    if params.temperature <= 0:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    logp = torch.log_softmax(scaled, -1)
    V = logits.shape[-1]
    if params.top_p < 1.0 or 0 < params.top_k < V:
        sorted_logits, order = scaled.sort(-1, descending=True)
        drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if 0 < params.top_k < V:
            drop[:, params.top_k :] = True
        if params.top_p < 1.0:
            probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), -1)
            drop |= probs.cumsum(-1) - probs >= params.top_p  # the mass before reaches top_p
            drop[:, 0] = False
        probs = torch.softmax(scaled.masked_fill(drop.scatter(-1, order, drop), float("-inf")), -1)
    else:
        probs = logp.exp()
    if uniforms is None:
        raise ValueError("uniforms: sampling at temperature > 0 needs one uniform per row, got None")
    cdf = probs.cumsum(-1)
    tokens = torch.searchsorted(cdf, uniforms.to(cdf.device) * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=V - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class Turn(NamedTuple):
    """One policy turn of one row of a continuation (:class:`Continuation`)."""

    tokens: list[int]
    """The sampled ids, the EOS included when the turn ended on one."""
    logprobs: list[float]
    """Their sampling log-probs (:func:`sample`)."""
    eos: bool
    """The turn ended on an EOS id (else on its token limit)."""


def collect_turns(tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor, eos: torch.Tensor) -> list[Turn]:
    """Row ``r``'s :class:`Turn`: its first ``lengths[r]`` of ``tokens [b, S]`` and ``logprobs [b, S]``."""
    rows = zip(tokens.tolist(), logprobs.tolist(), lengths.tolist(), eos.tolist())
    return [Turn(t[:k], p[:k], e) for t, p, k, e in rows]


def turn_buffers(limits: list[int], eos_ids: Sequence[int], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """The state of one turn of ``b = len(limits)`` rows, ``S = max(limits)`` steps at most:
    (limit [b], eos ids, tokens [b, S] pad-filled, logprobs [b, S], lengths [b], ended on EOS
    [b], alive [b])."""
    b, steps = len(limits), max(limits)
    return (torch.tensor(limits, device=device), torch.tensor(eos_ids, device=device),
            torch.full((b, steps), pad_id, dtype=torch.long, device=device), torch.zeros((b, steps), device=device),
            torch.zeros(b, dtype=torch.long, device=device), torch.zeros(b, dtype=torch.bool, device=device),
            torch.ones(b, dtype=torch.bool, device=device))


@contextmanager
def inference(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode without gradients (its mode restored after)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


class Continuation(ABC):
    """Token sequences continued turn by turn, token ids in and out (multi-turn rollouts).

    Row ``i * n + j`` starts as prompt ``i``; ``rows`` (LongTensor ``[len(prompts) * n]``) holds
    each row's seed (:func:`~reasonrl.rollout.seeds.row_seeds`). :meth:`generate_turn` samples one turn for
    some rows (each ends on any of ``eos_ids`` or its own token limit) and appends it to
    them; :meth:`extend` appends given tokens (an environment's) to some rows. Nothing is
    ever re-tokenised. A row's ``t``-th sampled token (counted over all its turns) is drawn
    with ``uniforms(its seed, t)``. A row's trajectory after its prompt (its turns and what it was
    extended with) holds at most ``capacity`` tokens: a turn limit or an extension past it
    is a ValueError. A continuation samples with the weights it started with. Subclasses
    implement ``_turn`` and ``_extend``.
    """

    def __init__(self, prompts: list[list[int]], n: int, capacity: int, rows: torch.Tensor, eos_ids: Sequence[int],
                 pad_id: int, device: torch.device) -> None:
        if capacity < 0:
            raise ValueError(f"capacity: expected a number of tokens >= 0, got {capacity}")
        self.size = len(prompts) * n
        if tuple(rows.shape) != (self.size,) or rows.dtype != torch.long:
            raise ValueError(f"rows: expected {self.size} row seeds (int64), got {rows.dtype} of shape {tuple(rows.shape)}")
        self.seeds = rows.to(device)
        self.sampled = torch.zeros(self.size, dtype=torch.long, device=device)
        """Tokens each row has sampled so far (its next token's counter ``t``)."""
        self.capacity = capacity
        self.eos_ids = eos_tuple(eos_ids)
        self.pad_id = pad_id
        self.device = device
        self.used = [0] * self.size
        """Tokens of each row's trajectory after its prompt."""

    def generate_turn(
        self, rows: Sequence[int], params: SamplingParams, max_new_tokens: int | Sequence[int]
    ) -> list[Turn]:
        """Sample one turn for each of ``rows`` (distinct) and append it to the row: at most
        ``max_new_tokens`` tokens (one limit for all, or one per row; a limit of 0 gives an
        empty turn), ending at the first EOS id. Each token is drawn with its row's own
        uniform (:meth:`draws`): the same draws in every backend and whatever other rows take
        part, so tokens agree wherever logits do. ``params.max_new_tokens`` is not read."""
        limits = [max_new_tokens] * len(rows) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        self._check(rows, limits, "max_new_tokens")
        turns = [Turn([], [], False)] * len(rows)
        active = [i for i, limit in enumerate(limits) if limit > 0]
        if active:
            sampled = self._turn([rows[i] for i in active], [limits[i] for i in active], params)
            for i, turn in zip(active, sampled):
                turns[i] = turn
                self.used[rows[i]] += len(turn.tokens)
            index = torch.tensor([rows[i] for i in active], dtype=torch.long, device=self.device)
            self.sampled[index] += torch.tensor([len(t.tokens) for t in sampled], dtype=torch.long, device=self.device)
        return turns

    def draws(self, index: torch.Tensor, t: int, params: SamplingParams) -> torch.Tensor | None:
        """The uniforms ``[len(index), 1]`` of step ``t`` of a turn for rows ``index`` (LongTensor on
        the device): ``uniforms(seed, tokens sampled before the turn + t)``; None when greedy."""
        if params.temperature <= 0:
            return None
        return uniforms(self.seeds[index], self.sampled[index] + t)

    def extend(self, rows: Sequence[int], token_lists: Sequence[Sequence[int]]) -> None:
        """Append ``token_lists[k]`` to row ``rows[k]`` (distinct rows)."""
        if len(token_lists) != len(rows):
            raise ValueError(f"extend: {len(rows)} rows but {len(token_lists)} token lists")
        self._check(rows, [len(t) for t in token_lists], "token_lists")
        self._extend(list(rows), [list(t) for t in token_lists])
        for r, tokens in zip(rows, token_lists):
            self.used[r] += len(tokens)

    def _check(self, rows: Sequence[int], added: list[int], name: str) -> None:
        """ValueError unless ``rows`` are distinct rows of the continuation, one count each, within capacity."""
        if len(added) != len(rows) or len(set(rows)) != len(rows) or any(not 0 <= r < self.size for r in rows):
            raise ValueError(f"rows: expected distinct rows in 0..{self.size - 1}, one {name} each; got {list(rows)}")
        over = [r for r, k in zip(rows, added) if k < 0 or self.used[r] + k > self.capacity]
        if over:
            r = over[0]
            raise ValueError(f"{name}: row {r} holds {self.used[r]} tokens after its prompt; adding "
                             f"{added[rows.index(r)]} exceeds the continuation's capacity of {self.capacity}")

    @abstractmethod
    def _turn(self, rows: list[int], limits: list[int], params: SamplingParams) -> list[Turn]:
        """Sample a turn of at most ``limits[k] >= 1`` tokens for each of ``rows`` (checked) and append it."""

    @abstractmethod
    def _extend(self, rows: list[int], token_lists: list[list[int]]) -> None:
        """Append ``token_lists[k]`` to row ``rows[k]`` (checked)."""


class HFContinuation(Continuation):
    """The reference :class:`Continuation`: each turn runs the ``transformers`` forward over each
    row's whole token sequence (left-padded, position ids counted from the first real
    token), then decodes with that forward's key/value cache; sampling is :func:`sample`'s."""

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], n: int, capacity: int, rows: torch.Tensor,
                 eos_ids: Sequence[int], pad_id: int) -> None:
        super().__init__(prompts, n, capacity, rows, eos_ids, pad_id, next(model.parameters()).device)
        self.model = model
        self.sequences = [list(p) for p in prompts for _ in range(n)]

    def _turn(self, rows: list[int], limits: list[int], params: SamplingParams) -> list[Turn]:
        device, b, steps = self.device, len(rows), max(limits)
        index = torch.tensor(rows, dtype=torch.long, device=device)
        ids, mask = pad_prompts([self.sequences[r] for r in rows], 1, self.pad_id, device)
        limit, eos_ids, tokens, logprobs, lengths, eos, alive = turn_buffers(limits, self.eos_ids, self.pad_id, device)
        with inference(self.model):
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                             use_cache=True)
            position = mask.sum(-1)
            for t in range(steps):
                act = alive.nonzero().squeeze(-1)
                tok, logp = sample(out.logits[act, -1], params, self.draws(index[act], t, params))
                tokens[act, t], logprobs[act, t], lengths[act] = tok, logp, t + 1
                eos[act] = is_eos(tok, eos_ids)
                alive[act] = ~eos[act] & (limit[act] > t + 1)
                if not alive.any():
                    break
                feed = torch.full((b,), self.pad_id, dtype=torch.long, device=device)
                feed[act] = tok
                mask = torch.cat([mask, alive.long()[:, None]], 1)  # an ended row's feed is masked out
                out = self.model(input_ids=feed[:, None], attention_mask=mask, position_ids=position[:, None],
                                 past_key_values=out.past_key_values, use_cache=True)
                position = position + alive.long()
        turns = collect_turns(tokens, logprobs, lengths, eos)
        for r, turn in zip(rows, turns):
            self.sequences[r] += turn.tokens
        return turns

    def _extend(self, rows: list[int], token_lists: list[list[int]]) -> None:
        for r, tokens in zip(rows, token_lists):
            self.sequences[r] += tokens


@declares("hf")
class HFGenerator:
    """Rollouts with any ``transformers`` causal LM (CPU or GPU): its forward over the
    left-padded prompts, then one token per live row and step over its key/value cache (an
    :class:`HFContinuation` of one turn), sampling with :func:`sample`, so that it draws the
    same tokens as the fast backend wherever their logits agree.

    It samples with ``model``: the trainer's own module when colocated with the policy (it
    then sees every update at once), or a copy that :meth:`load_weights` refreshes. The
    returned tensors live on the model's device. A sample ends on any of ``eos_ids``.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_ids: int | Sequence[int]) -> None:
        self.model = model
        self.pad_id = pad_id
        self.eos_ids = eos_tuple(eos_ids)

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

        Log-probs are ``log_softmax(raw logits / temperature)`` of the chosen tokens
        (temperature 1 for greedy), before top-k / top-p truncation. The global RNG is not used.
        """
        check_seeds(seeds, prompts)
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)
        steps = params.max_new_tokens
        continuation = self.start(prompts, n, steps, row_seeds(seeds, n, device))
        turns = continuation.generate_turn(list(range(continuation.size)), params, steps)
        response_ids = torch.full((continuation.size, steps), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((continuation.size, steps))
        for r, turn in enumerate(turns):
            response_ids[r, : len(turn.tokens)] = torch.tensor(turn.tokens, dtype=torch.long)
            logprobs[r, : len(turn.tokens)] = torch.tensor(turn.logprobs)
        return assemble(prompt_ids, prompt_mask, response_ids.to(device), logprobs.to(device), n, self.pad_id,
                        self.eos_ids)

    def start(self, prompts: list[list[int]], n: int, capacity: int, rows: torch.Tensor,
              eos_ids: Sequence[int] | None = None) -> HFContinuation:
        """A :class:`HFContinuation` of ``n`` rows per prompt with row seeds ``rows``
        (:func:`~reasonrl.rollout.seeds.row_seeds`), at most ``capacity`` tokens after each
        prompt, turns ending on any of ``eos_ids`` (default: the backend's)."""
        return HFContinuation(self.model, prompts, n, capacity, rows, self.eos_ids if eos_ids is None else eos_ids,
                              self.pad_id)
