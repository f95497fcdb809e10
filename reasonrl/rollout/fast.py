"""A fast rollout backend: one batched decode loop over a preallocated key/value cache.

Same output contract as :class:`~reasonrl.rollout.hf.HFGenerator` and, under greedy
decoding, the same tokens. Each distinct prompt is encoded once (one prefill of the
left-padded prompts, its cache then copied to its ``n`` samples); each step then feeds one
token per live row, never re-encoding the prefix; rows that emitted EOS are dropped from
the work by compacting the batch and the cache.

Threads: ``generate`` never changes torch's thread settings; set them in the caller. On
CPU, use ``torch.set_num_threads`` = the cores the process has to itself: when other busy
processes share those cores, fewer threads are faster (spinning threads wait on each other).
"""

from __future__ import annotations

import torch

from reasonrl.rollout.hf import assemble, draw_seed, pad_prompts
from reasonrl.types import RolloutBatch, SamplingParams

# Compact the batch once at most this fraction of its rows is still live.
COMPACT_AT = 0.75


class KVCache:
    """Per-layer key/value buffers ``[B, H_kv, L, D]``, allocated once per batch.

    Duck-types the part of ``transformers.Cache`` that decoder layers use: ``update``
    writes the new keys/values at the current length and returns views of everything
    cached so far (no concatenation, no copy of the prefix).
    """

    def __init__(
        self, layers: int, batch: int, heads: int, length: int, head_dim: int, dtype, device
    ) -> None:
        shape = (batch, heads, length, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Store ``[B, H_kv, q, D]`` new states; return ``[B, H_kv, length + q, D]`` views."""
        end = self.length + key_states.shape[2]
        self.keys[layer_idx][:, :, self.length : end] = key_states
        self.values[layer_idx][:, :, self.length : end] = value_states
        if layer_idx == len(self.keys) - 1:
            self.length = end
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of positions cached so far."""
        return self.length

    def select(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` (a [K] long tensor, repeats allowed): new buffers
        with room for the same length, the cached prefix copied, the tail left empty."""
        self.keys = [self._gather(k, rows) for k in self.keys]
        self.values = [self._gather(v, rows) for v in self.values]

    def _gather(self, buffer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = buffer.new_empty((rows.shape[0], *buffer.shape[1:]))
        torch.index_select(buffer[:, :, : self.length], 0, rows, out=out[:, :, : self.length])
        return out


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row from ``[b, V]`` raw logits; return ``(tokens [b], logprobs [b])``.

    Log-probs are ``log_softmax(logits / temperature)`` of the chosen token (temperature 1
    for greedy), before truncation. Sampling applies temperature, then top-k, then top-p
    (the smallest set of most likely tokens whose mass reaches ``top_p``), as
    ``transformers`` does, and draws by an exponential race seeded by ``generator``.
    """
    logits = logits.float()
    if params.temperature <= 0:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
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
        scaled = scaled.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(scaled, -1)
    noise = torch.empty(probs.shape, device=generator.device).exponential_(generator=generator)
    tokens = (probs / noise.to(probs.device)).argmax(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def attention_masks(
    prompt_mask: torch.Tensor, length: int, implementation: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prefill [B, 1, P, P], keys [B, 1, 1, length])`` masks in the format ``implementation``
    takes: boolean (True = attend) for ``sdpa``, additive ``dtype`` for ``eager``.

    Prefill: causal and key padding, plus the diagonal so that padding queries attend to
    themselves (finite garbage, never read) instead of to nothing (NaN). Decode: the
    prompt's padding masked, every generated position visible; a step at cache length
    ``k`` uses ``keys[..., :k]``.
    """
    B, P = prompt_mask.shape
    device = prompt_mask.device
    keep = torch.ones((B, length), dtype=torch.bool, device=device)
    keep[:, :P] = prompt_mask.bool()
    causal = torch.ones((P, P), dtype=torch.bool, device=device).tril()
    prefill = (causal & keep[:, None, None, :P]) | torch.eye(P, dtype=torch.bool, device=device)
    decode = keep[:, None, None, :]
    if implementation == "sdpa":
        return prefill, decode
    if implementation == "eager":
        neg = torch.finfo(dtype).min
        return (~prefill).to(dtype) * neg, (~decode).to(dtype) * neg
    raise ValueError(
        f"config._attn_implementation: FastGenerator supports 'sdpa' and 'eager', got {implementation!r}"
    )


class FastGenerator:
    """Rollouts with a hand-written batched decode loop over a ``transformers`` decoder.

    Works with models whose decoder layers call ``past_key_values.update(k, v, layer_idx)``
    and accept a prepared ``{"full_attention": mask}`` attention mask (Llama/Qwen2-style,
    full attention only, ``sdpa`` or ``eager``). It shares the trainer's module, so
    :meth:`sync_weights` does nothing. The returned tensors live on the model's device.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int) -> None:
        layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(
                f"config.layer_types: FastGenerator supports full attention only, got {sorted(layer_types)}"
            )
        self.model = model
        self.pad_id = pad_id
        self.eos_id = eos_id

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> RolloutBatch:
        """Sample ``n`` responses per prompt; see :class:`~reasonrl.rollout.base.Generator`.

        All randomness comes from a private generator seeded from ``generator`` (on the
        same device as ``generator``): reproducible, and the global RNG is untouched.
        """
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)
        rng = torch.Generator(device=generator.device).manual_seed(draw_seed(generator))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                response_ids, logprobs = self._decode(prompt_ids, prompt_mask, n, params, rng)
        finally:
            self.model.train(was_training)
        return assemble(prompt_ids, prompt_mask, response_ids, logprobs, n, self.pad_id, self.eos_id)

    def _prefill(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, n: int, length: int
    ) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
        """Encode each distinct prompt (every ``n``-th row) once into a cache of ``length``
        positions, then copy it to the prompt's ``n`` rows.

        Returns ``(cache, logits [B, V] of the first response token, decode key mask)``.
        """
        config = self.model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dtype = next(self.model.parameters()).dtype
        ids, mask = prompt_ids[::n], prompt_mask[::n]
        cache = KVCache(
            config.num_hidden_layers, ids.shape[0], config.num_key_value_heads, length, head_dim, dtype,
            ids.device,
        )
        prefill_mask, key_mask = attention_masks(mask, length, config._attn_implementation, dtype)
        logits = self.model(
            input_ids=ids,
            attention_mask={"full_attention": prefill_mask},
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        parent = torch.arange(prompt_ids.shape[0], device=ids.device) // n
        cache.select(parent)
        return cache, logits[parent], key_mask[parent]

    def _decode(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
        params: SamplingParams,
        rng: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens [B, S], logprobs [B, S])`` for ``[B, P]`` prompts, each repeated ``n`` times
        in a row; anything after a row's first EOS is garbage."""
        B, P = prompt_ids.shape
        steps = params.max_new_tokens
        device = prompt_ids.device
        tokens_out = torch.full((B, steps), self.pad_id, dtype=torch.long, device=device)
        logprobs_out = torch.zeros((B, steps), device=device)
        if steps == 0:
            return tokens_out, logprobs_out
        cache, logits, key_mask = self._prefill(prompt_ids, prompt_mask, n, P + steps)
        rows = torch.arange(B, device=device)  # original row of each batch row
        position = prompt_mask.sum(-1, keepdim=True)  # next position id of each batch row
        alive = torch.ones(B, dtype=torch.bool, device=device)  # no EOS yet
        for t in range(steps):
            tokens, logprobs = sample(logits, params, rng)
            tokens_out[rows, t] = tokens
            logprobs_out[rows, t] = logprobs
            alive &= tokens != self.eos_id
            n_alive = int(alive.sum())
            if n_alive == 0 or t == steps - 1:
                break
            if n_alive <= COMPACT_AT * alive.shape[0]:
                keep = alive.nonzero().squeeze(-1)
                cache.select(keep)
                rows, tokens, position, alive = rows[keep], tokens[keep], position[keep], alive[keep]
                key_mask = key_mask[keep]
            logits = self.model(
                input_ids=tokens[:, None],
                attention_mask={"full_attention": key_mask[..., : P + t + 1]},
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            position = position + 1
        return tokens_out, logprobs_out

    def sync_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """No-op: this backend samples from the trainer's own module."""
