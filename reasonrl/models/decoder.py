"""A lean forward pass of Llama-family decoders over the Hugging Face module's own parameters.

At the sizes RL on a CPU uses, a ``transformers`` decoder layer spends more time in Python,
mask building and small-tensor dispatch than in arithmetic. This module computes the same
function with the fewest tensor operations: the q/k/v and gate/up projections fused into
one matrix product each, RMSNorm as one fused op, attention over a preallocated key/value
cache during decoding, and for scoring each distinct prompt encoded once for all its
samples (responses attend to their prompt's keys). The
parameters are the module's own (``model.parameters()``), so gradients, optimizers and
checkpoints see no difference; tests compare logits with ``transformers`` to 1e-5.

Per layer, with ``n(.)`` the RMSNorm and ``rope`` the rotary embedding::

    q, k, v = split(n1(x) @ [Wq; Wk; Wv]^T + [bq; bk; bv])       (biases: Qwen2, Llama's attention_bias)
    q, k    = rope(qn(q)), rope(kn(k))                              (qn, kn: Qwen3 only)
    x       = x + Wo softmax(q k^T / sqrt(d) + causal) v (+ bo)      (grouped-query)
    x       = x + Wd (silu(n2(x) Wg^T) * (n2(x) Wu^T))
    logits  = n(x) Wlm^T (+ blm)

Norms and the attention softmax run in fp32 whatever the model's dtype, as in ``transformers``.

Mixed precision (``train.precision=bf16-mixed``): under ``torch.autocast`` the fused weights
are cast to the autocast dtype once per :meth:`LeanDecoder.fuse` (gradients flow back to the
fp32 parameters through the cast), every matrix product and the attention run in it, and the
residual stream ``x`` stays in the parameters' dtype (fp32): each sub-layer's output is added
to it in fp32, as autocast does for ``transformers`` modules. Generation and scoring thus run
the same products in the same dtype.

Activation checkpointing: a layer whose ``transformers`` module has ``gradient_checkpointing``
set (``model.gradient_checkpointing_enable()``, ``train.grad_checkpointing``) keeps only its
input during a training forward and recomputes the rest in backward.

LoRA adapters (:mod:`reasonrl.models.lora`, peft layers on the projections): each fused
projection is the merged ``W + (alpha / r) B A``, rebuilt by every :meth:`LeanDecoder.fuse`, so
gradients reach ``A`` and ``B`` and generation sees the adapters as they are. LoRA dropout is
not applied (the trainer scores through ``transformers`` while it is active,
:func:`reasonrl.models.lora.dropout_active`).

Supported: ``llama``, ``qwen2`` and ``qwen3`` configurations with full attention, SiLU
MLPs and no dropout (:func:`unsupported_reason` says why another is not); anything else
runs through the ``transformers`` modules (``rollout.backend=hf``, and the generic scoring
path of :mod:`reasonrl.trainer.logprobs`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.nn.attention import SDPBackend, sdpa_kernel

from reasonrl.models import LEAN_MODEL_TYPES
from reasonrl.models.lora import lora_layers, lora_weight

# Attention kernels for prefill and scoring, whose sequence lengths change every batch:
# cuDNN's (the default for bf16 on recent NVIDIA GPUs) is left out because it builds a plan
# for each new shape: scoring 128 responses of a 0.5B model in bf16 on an H200 took
# 0.22-0.92 s with it and 0.08-0.14 s without (bench notes in docs/benchmarks.md).
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

FUSED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The projections :meth:`LeanDecoder.fuse` reads: a LoRA adapter may sit on any of them."""


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``model`` (a config key and its value), or None."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return f"config.model_type = {model_type!r} (supported: {', '.join(LEAN_MODEL_TYPES)})"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"config.layer_types = {sorted(layer_types)} (full attention only)"
    checks = {
        "hidden_act": ("silu", getattr(config, "hidden_act", "silu")),
        "mlp_bias": (False, getattr(config, "mlp_bias", False)),
        "attention_dropout": (0.0, float(getattr(config, "attention_dropout", 0.0) or 0.0)),
        "pretraining_tp": (1, getattr(config, "pretraining_tp", 1)),
    }
    for key, (wanted, got) in checks.items():
        if got != wanted:
            return f"config.{key} = {got!r} (supported: {wanted!r})"
    for name, _ in lora_layers(model):
        if name.rsplit(".", 1)[-1] not in FUSED_PROJECTIONS:
            return f"a LoRA adapter on {name} (model.lora.target_modules: the lean decoder merges adapters on {', '.join(FUSED_PROJECTIONS)})"
    return None


@dataclass
class FusedLayer:
    """One decoder layer's projections, fused (views of concatenations of the parameters)."""

    qkv_weight: torch.Tensor  # [(H + 2 Hkv) D, d]
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor  # [d, H D]
    o_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor  # [2 I, d]
    down_weight: torch.Tensor  # [d, I]
    ln1: torch.Tensor
    ln2: torch.Tensor
    qk_norm: torch.Tensor | None  # [H + Hkv, D]: Qwen3's per-head q and k norm weights

    def __post_init__(self) -> None:
        # [in, out] views for the decode step's addmm/mm (transposed once per batch, not per step)
        self.o_weight_t = self.o_weight.t()
        self.gate_up_weight_t = self.gate_up_weight.t()
        self.down_weight_t = self.down_weight.t()


@dataclass
class FusedWeights:
    """The fused layers and the LM head, in the compute dtype ``dtype`` (the autocast dtype
    under ``torch.autocast``, else the parameters' own); norm weights stay in the parameters'
    dtype (the norms, and the rotary embedding after Qwen3's q/k norm, run in it)."""

    layers: list[FusedLayer]
    head_weight: torch.Tensor | None  # [V, d]; None for a body without an LM head
    head_bias: torch.Tensor | None
    dtype: torch.dtype


def compute_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype matrix products run in: autocast's on ``param``'s device type when autocast is
    on there, else ``param.dtype``."""
    device = param.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return param.dtype


def cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``t`` in ``dtype`` (itself when it already is)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def residual_mm(x: torch.Tensor, a: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``x + a @ weight_t`` with the product in ``a``'s dtype and the sum in ``x``'s: one
    ``addmm`` when they agree, else the product then an add (mixed precision keeps ``x`` in fp32)."""
    if x.dtype == a.dtype:
        return torch.addmm(x, a, weight_t)
    return x + torch.mm(a, weight_t)


class KVCache:
    """Per-layer key/value buffers ``[B, Hkv, L, D]``, allocated once per batch; slot ``s``
    of every row is written at the same decode step (:meth:`LeanDecoder.decode`), or each
    row's slots at its own pace (:meth:`LeanDecoder.extend`: ``length`` is then the longest
    row's)."""

    def __init__(
        self, layers: int, batch: int, kv_heads: int, length: int, head_dim: int, dtype, device, zeroed: bool = False
    ) -> None:
        shape = (batch, kv_heads, length, head_dim)
        new = torch.zeros if zeroed else torch.empty
        self.keys = [new(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [new(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = 0  # slots filled
        self.zeroed = zeroed  # slots not yet filled hold zeros, also after select()

    def select(self, rows: torch.Tensor) -> None:
        """Keep batch rows ``rows`` (a [K] long tensor, repeats allowed), filled slots copied."""
        self.keys = [self._gather(k, rows) for k in self.keys]
        self.values = [self._gather(v, rows) for v in self.values]

    def take(self, rows: torch.Tensor) -> "KVCache":
        """A new cache of batch rows ``rows`` (filled slots copied); this one is left as it is."""
        out = copy.copy(self)
        out.select(rows)
        return out

    def put(self, rows: torch.Tensor, other: "KVCache", other_rows: torch.Tensor, start: int) -> None:
        """Copy slots ``start .. other.length - 1`` of rows ``other_rows`` of ``other`` (a
        cache of :meth:`take`'s making) back into batch rows ``rows`` of this one."""
        for mine, theirs in ((self.keys, other.keys), (self.values, other.values)):
            for buffer, part in zip(mine, theirs):
                buffer[rows, :, start : other.length] = part[other_rows, :, start : other.length]
        self.length = max(self.length, other.length)

    def _gather(self, buffer: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = (buffer.new_zeros if self.zeroed else buffer.new_empty)((rows.shape[0], *buffer.shape[1:]))
        torch.index_select(buffer[:, :, : self.length], 0, rows, out=out[:, :, : self.length])
        return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim (no weight: 1), in fp32 as
    ``transformers`` does."""
    shape = x.shape[-1:]
    if x.dtype == torch.float32:
        return F.rms_norm(x, shape, weight, eps)
    normed = F.rms_norm(x.float(), shape, None, eps).to(x.dtype)
    return normed if weight is None else weight * normed


def split(x: torch.Tensor, sizes: list[int], dim: int) -> list[torch.Tensor]:
    """``x.split(sizes, dim)``; without autograd, basic slicing, which dispatches faster (a
    decode step), while with it one split backward is cheaper than a zero-filled gradient
    per slice (scoring)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return list(x.split(sizes, dim))
    out, start = [], 0
    for size in sizes:
        out.append(x.narrow(dim, start, size))
        start += size
    return out


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: ``x * cos + rotate_half(x) * sin``, ``rotate_half([a, b]) = [-b, a]``."""
    a, b = split(x, [x.shape[-1] // 2] * 2, -1)
    return torch.addcmul(x * cos, torch.cat((-b, a), -1), sin)


class LeanDecoder:
    """The forward pass of a supported decoder (see the module docstring) on ``model``'s parameters.

    :meth:`response_hidden` scores responses (training, reference and old-policy log-probs,
    critic values), each distinct prompt encoded once; :meth:`prefill` and :meth:`decode`
    run generation over a :class:`KVCache`, :meth:`extend` continues its rows each at its own
    pace (multi-turn continuations: ragged chunks of tokens, one token a step). Fused weights are rebuilt by :meth:`fuse` on each
    call of :meth:`response_hidden` (cheap, and the gradients flow back to the parameters)
    and once per batch for generation.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the lean decoder does not support this model: {reason}")
        config = model.config
        self.model = model
        self.body = model.model if hasattr(model, "lm_head") else model  # a causal LM, or its body alone
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5

    # ------------------------------------------------------------------ weights
    def fuse(self, head: bool = True) -> FusedWeights:
        """Each layer's fused projections and (``head``) the LM head, built from the current
        parameters in the compute dtype (:func:`compute_dtype`)."""
        dtype = compute_dtype(self.body.embed_tokens.weight)

        def cat(tensors):
            return torch.cat([cast(t, dtype) for t in tensors])

        layers = []
        w = lora_weight  # a projection's weight, LoRA adapters merged: W + (alpha / r) B A
        for layer in self.body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
            layers.append(
                FusedLayer(
                    qkv_weight=cat([w(attn.q_proj), w(attn.k_proj), w(attn.v_proj)]),
                    qkv_bias=None if biases[0] is None else cat(biases),
                    o_weight=cast(w(attn.o_proj), dtype),
                    o_bias=cast(attn.o_proj.bias, dtype),
                    gate_up_weight=cat([w(mlp.gate_proj), w(mlp.up_proj)]),
                    down_weight=cast(w(mlp.down_proj), dtype),
                    ln1=layer.input_layernorm.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    qk_norm=torch.cat(  # a norm weight: the parameters' dtype
                        [attn.q_norm.weight.expand(self.heads, -1), attn.k_norm.weight.expand(self.kv_heads, -1)]
                    ) if hasattr(attn, "q_norm") else None,
                )
            )
        head = getattr(self.model, "lm_head", None) if head else None
        return FusedWeights(
            layers,
            None if head is None else cast(head.weight, dtype),
            None if head is None else cast(head.bias, dtype),
            dtype,
        )

    @staticmethod
    def checkpointed(layer: torch.nn.Module) -> bool:
        """Whether ``layer``'s activations are recomputed in backward: its ``gradient_checkpointing``
        flag, in a training forward with gradients."""
        return bool(getattr(layer, "gradient_checkpointing", False)) and layer.training and torch.is_grad_enabled()

    def rope_table(self, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[length, D]`` for positions ``0 .. length - 1``, from the model's own
        rotary module (so rope scaling variants match)."""
        positions = torch.arange(length, device=device)[None]
        cos, sin = self.body.rotary_emb(torch.empty(0, device=device, dtype=dtype), positions)
        return cos[0], sin[0]

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden, self.body.norm.weight, self.eps)

    def lm_head(self, hidden: torch.Tensor, weights: FusedWeights) -> torch.Tensor:
        """Logits of last-layer hidden states (before the final norm), in the compute dtype."""
        return F.linear(cast(self.final_norm(hidden), weights.dtype), weights.head_weight, weights.head_bias)

    # ------------------------------------------------------------------ shared layer parts
    def _qkv(self, w: FusedLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """``(q [..., H, D], k [..., Hkv, D], v [..., Hkv, D])`` of hidden states ``x [..., d]``,
        with ``cos``/``sin`` broadcastable to ``[..., 1, D]``."""
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        normed = cast(rms_norm(x, w.ln1, self.eps), w.qkv_weight.dtype)
        qkv = F.linear(normed, w.qkv_weight, w.qkv_bias).unflatten(-1, (H + 2 * Hkv, D))
        qk, v = split(qkv, [H + Hkv, Hkv], -2)
        if w.qk_norm is not None:
            qk = rms_norm(qk, None, self.eps) * w.qk_norm
        # one rotation for the query and key heads, in the table's dtype (the parameters'), as
        # ``transformers`` does under autocast; then back to the products' dtype
        return (*split(cast(rope(qk, cos, sin), v.dtype), [H, Hkv], -2), v)

    def _mlp(self, w: FusedLayer, x: torch.Tensor) -> torch.Tensor:
        """``x + Wd (silu(n2(x) Wg^T) * n2(x) Wu^T)``."""
        normed = cast(rms_norm(x, w.ln2, self.eps), w.gate_up_weight.dtype)
        gate, up = split(F.linear(normed, w.gate_up_weight), 2 * [w.down_weight.shape[1]], -1)
        return x + F.linear(F.silu(gate) * up, w.down_weight)

    # ------------------------------------------------------------------ scoring
    def response_hidden(
        self, prefix_ids: torch.Tensor, prefix_len: torch.Tensor, parent: torch.Tensor, response_ids: torch.Tensor
    ) -> torch.Tensor:
        """Last-layer hidden states ``[b, T, d]`` (before the final norm) whose outputs predict
        each response token, encoding each distinct prompt once.

        ``prefix_ids [U, Pm]``: the distinct prompts, real tokens first (``prefix_len [U]``
        each); ``parent [b]``: the prompt of each row; ``response_ids [b, T]``: right-padded
        responses. Every token goes through the projections and the MLP once (prompt tokens
        and response tokens in one flat batch); attention runs per part: the prompts
        causally among themselves, each response over its prompt's keys (``j < prefix_len``)
        and causally over its own. Response token ``j`` is predicted by the output at
        response position ``j - 1``, the first one by the prompt's last position.
        """
        U, Pm = prefix_ids.shape
        b, T = response_ids.shape
        Hkv, device = self.kv_heads, prefix_ids.device
        weights = self.fuse(head=False)
        x = self.body.embed_tokens(torch.cat([prefix_ids.flatten(), response_ids.flatten()]))  # [U Pm + b T, d]
        row_len = prefix_len[parent]
        positions = torch.cat([torch.arange(Pm, device=device).repeat(U), (row_len[:, None] + torch.arange(T, device=device)).flatten()])
        cos, sin = self.rope_table(int(positions.max()) + 1, device, x.dtype)
        cos, sin = cos[positions][:, None], sin[positions][:, None]  # [N, 1, D]
        keys_ok = torch.cat(
            [
                (torch.arange(Pm, device=device) < row_len[:, None])[:, None, :].expand(b, T, Pm),
                torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(b, T, T),
            ],
            -1,
        )[:, None]  # [b, 1, T, Pm + T]
        gqa = self.heads != Hkv
        split = U * Pm

        def layer_forward(w: FusedLayer, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(w, x, cos, sin)  # [N, heads, D]
            qp, kp, vp = (t[:split].unflatten(0, (U, Pm)).transpose(1, 2) for t in (q, k, v))  # [U, heads, Pm, D]
            qr, kr, vr = (t[split:].unflatten(0, (b, T)).transpose(1, 2) for t in (q, k, v))  # [b, heads, T, D]
            with sdpa_kernel(ATTENTION_BACKENDS):
                attn_p = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=self.scale, enable_gqa=gqa)
                attn_r = F.scaled_dot_product_attention(
                    qr, torch.cat([kp[parent], kr], 2), torch.cat([vp[parent], vr], 2),
                    attn_mask=keys_ok, scale=self.scale, enable_gqa=gqa,
                )
            attn = torch.cat([attn_p.transpose(1, 2).flatten(0, 1), attn_r.transpose(1, 2).flatten(0, 1)]).flatten(1)
            x = x + F.linear(attn, w.o_weight, w.o_bias)
            return self._mlp(w, x)

        for module, w in zip(self.body.layers, weights.layers):
            if self.checkpointed(module):
                x = checkpoint(layer_forward, w, x, use_reentrant=False)
            else:
                x = layer_forward(w, x)
        prompt_out = x[:split].unflatten(0, (U, Pm))[parent, row_len - 1]  # [b, d]
        response_out = x[split:].unflatten(0, (b, T))[:, : T - 1]
        return torch.cat([prompt_out[:, None], response_out], 1)

    # ------------------------------------------------------------------ generation
    def new_cache(self, batch: int, length: int, device, dtype, zeroed: bool = False) -> KVCache:
        return KVCache(len(self.body.layers), batch, self.kv_heads, length, self.head_dim, dtype, device, zeroed)

    @torch.no_grad()
    def prefill(
        self, weights: FusedWeights, ids: torch.Tensor, mask: torch.Tensor, cache: KVCache, table
    ) -> torch.Tensor:
        """Encode left-padded prompts ``ids [G, P]`` (``mask``: 1 = real token) into cache slots
        ``0 .. P-1``; return the logits ``[G, V]`` that follow each prompt.

        Each real query attends to the real keys up to itself; a padding query attends to
        itself only (finite garbage in slots that decoding masks out).
        """
        G, P = ids.shape
        cos, sin = table
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cos, sin = cos[positions][:, :, None], sin[positions][:, :, None]  # [G, P, 1, D]
        keep = mask.bool()
        allowed = torch.ones(P, P, dtype=torch.bool, device=ids.device).tril() & keep[:, None, None, :]
        allowed |= torch.eye(P, dtype=torch.bool, device=ids.device)
        x = self.body.embed_tokens(ids)
        for i, w in enumerate(weights.layers):
            q, k, v = self._qkv(w, x, cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # [G, Hkv, P, D]
            cache.keys[i][:, :, :P] = k
            cache.values[i][:, :, :P] = v
            with sdpa_kernel(ATTENTION_BACKENDS):
                attn = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k, v, attn_mask=allowed, scale=self.scale, enable_gqa=self.heads != self.kv_heads
                )
            x = x + F.linear(attn.transpose(1, 2).flatten(2), w.o_weight, w.o_bias)
            x = self._mlp(w, x)
        cache.length = P
        return self.lm_head(x[:, -1], weights)

    @torch.no_grad()
    def decode(
        self,
        weights: FusedWeights,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        key_bias: torch.Tensor,
        cache: KVCache,
        table,
        slot: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step: feed ``tokens [B]`` at rotary ``positions [B]`` into the next cache slot;
        return the next logits ``[B, V]``. ``key_bias [B, 1, 1, >= slots]`` is 0 for keys to
        attend to and -inf for padding.

        Attention per kv head group: ``softmax(q k^T / sqrt(D) + bias) v`` with the ``H / Hkv``
        query heads of a group as the rows of one small matrix product.

        ``slot`` (a ``[1]`` long tensor) selects static shapes, what a CUDA graph needs: the
        step writes cache slot ``slot``, un-masks it in ``key_bias`` (which must mask every
        slot not yet written, over the whole cache) and attends over the whole cache;
        ``cache.length`` is left alone. The cache must then hold finite values everywhere
        (:meth:`new_cache` with ``zeroed=True``): a masked key still meets ``0 x value``.
        """
        B = tokens.shape[0]
        Hkv, D = self.kv_heads, self.head_dim
        G = self.heads // Hkv
        inner = weights.layers[0].down_weight.shape[1]
        s = cache.length
        cos, sin = table
        cos, sin = cos[positions][:, None], sin[positions][:, None]  # [B, 1, D]
        if slot is None:
            bias = key_bias[..., : s + 1]
        else:
            bias = key_bias.index_fill_(-1, slot, 0.0)
        x = self.body.embed_tokens(tokens)
        for i, w in enumerate(weights.layers):
            q, k, v = self._qkv(w, x, cos, sin)  # [B, heads, D]
            keys, values = cache.keys[i], cache.values[i]
            if slot is None:
                keys[:, :, s] = k
                values[:, :, s] = v
                keys, values = keys[:, :, : s + 1], values[:, :, : s + 1]
            else:
                keys.index_copy_(2, slot, k[:, :, None])
                values.index_copy_(2, slot, v[:, :, None])
            scores = torch.matmul(q.view(B, Hkv, G, D), keys.transpose(-1, -2))
            probs = torch.softmax(torch.add(bias, scores, alpha=self.scale), -1, dtype=torch.float32)
            if probs.dtype != scores.dtype:
                probs = probs.to(scores.dtype)
            attn = torch.matmul(probs, values)  # [B, Hkv, G, D]
            x = residual_mm(x if w.o_bias is None else x + w.o_bias, attn.view(B, Hkv * G * D), w.o_weight_t)
            gate_up = torch.mm(cast(rms_norm(x, w.ln2, self.eps), weights.dtype), w.gate_up_weight_t)
            x = residual_mm(x, F.silu(gate_up[:, :inner]) * gate_up[:, inner:], w.down_weight_t)
        if slot is None:
            cache.length = s + 1
        return self.lm_head(x, weights)

    @torch.no_grad()
    def extend(
        self,
        weights: FusedWeights,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        starts: torch.Tensor,
        lows: torch.Tensor,
        cache: KVCache,
        table,
    ) -> torch.Tensor:
        """Feed a ragged chunk, each row at its own place in the cache: row ``r``'s first
        ``lengths[r]`` tokens of ``ids [b, c]`` (right-padded) go into cache slots
        ``starts[r] ..`` at rotary positions ``starts[r] - lows[r] ..``; return the logits
        ``[b, V]`` after each row's last token (garbage for a row of length 0, which is fed
        nothing and whose cache is left as it is). One step of decoding is a chunk of one.

        Row ``r``'s keys are packed: its left-padded prompt's real tokens from slot
        ``lows[r]``, then every token fed since. Query ``j`` of row ``r`` attends to slots
        ``lows[r] <= s <= starts[r] + min(j, lengths[r] - 1)``: the prefix, never encoded
        again, and the chunk causally; a padding query repeats the row's last real one and
        is never written. Attention reads the slots up to the longest row's, masked past
        each row's own: the cache must hold finite values there (``new_cache(zeroed=True)``).
        """
        b, c = ids.shape
        device = ids.device
        step = torch.arange(c, device=device)
        offset = torch.minimum(step, (lengths - 1)[:, None])  # [b, c]
        slots = starts[:, None] + offset
        S = int(slots.max()) + 1
        keys_at = torch.arange(S, device=device)
        allowed = ((keys_at >= lows[:, None, None]) & (keys_at <= slots[:, :, None]))[:, None]  # [b, 1, c, S]
        row, col = (step < lengths[:, None]).nonzero(as_tuple=True)  # the real tokens
        slot = slots[row, col]
        cos, sin = table
        positions = (slots - lows[:, None]).clamp(min=0)
        cos, sin = cos[positions][:, :, None], sin[positions][:, :, None]  # [b, c, 1, D]
        x = self.body.embed_tokens(ids)
        for i, w in enumerate(weights.layers):
            q, k, v = self._qkv(w, x, cos, sin)  # [b, c, heads, D]
            cache.keys[i][row, :, slot] = k[row, col]
            cache.values[i][row, :, slot] = v[row, col]
            with sdpa_kernel(ATTENTION_BACKENDS):
                attn = F.scaled_dot_product_attention(
                    q.transpose(1, 2), cache.keys[i][:, :, :S], cache.values[i][:, :, :S], attn_mask=allowed,
                    scale=self.scale, enable_gqa=self.heads != self.kv_heads,
                )
            x = x + F.linear(attn.transpose(1, 2).flatten(2), w.o_weight, w.o_bias)
            x = self._mlp(w, x)
        cache.length = max(cache.length, S)
        return self.lm_head(x[torch.arange(b, device=device), (lengths - 1).clamp(min=0)], weights)
