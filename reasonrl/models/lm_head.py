"""Log-probs and entropy of response tokens from last-layer hidden states, over chunks of the
vocabulary, without the full ``[tokens, vocab]`` logits (at a 151,936-wide vocabulary they
are a step's largest activation: 1,792 response tokens hold 1.1 GB of fp32 logits, and the
log-softmax, the entropy's probabilities and their gradients several times that).

For hidden states ``h [N, d]``, the head ``W [V, d]`` (bias ``b``), the temperature ``tau``
and the tokens ``t [N]``, per row (``z`` computed in the products' dtype, then fp32)::

    z    = (h W^T + b) / tau
    logZ = log sum_v exp(z_v)            online over chunks of columns: a running maximum m
                                         and s = sum_v exp(z_v - m), rescaled as m grows
    logp = z_t - logZ
    H    = logZ - sum_v p_v z_v          p = exp(z - logZ), sum_v p_v z_v = u / s with
                                         u = sum_v exp(z_v - m) z_v (rescaled like s)

Backward computes each chunk's ``z`` again (nothing of size ``N x V`` is kept) and uses

    d logp / d z_v = 1[v = t] - p_v,        d H / d z_v = -p_v (z_v - sum_w p_w z_w)

so memory holds one ``N x chunk`` block at a time; the products cost one more pass over the
head than autograd's (the recomputation).

Mixed precision: where autocast is on for the hidden states' device, each product runs in the
autocast dtype (``h`` and ``W`` cast, as autocast casts ``F.linear``), the sums in fp32, and
the gradients reach ``h``, ``W`` and ``b`` in their own dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunked_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp [...], H [...] or None)`` of ``tokens [...]`` under ``softmax((hidden W^T + b) / tau)``
    for ``hidden [..., d]``, computed over ``chunk`` vocabulary columns at a time (module docstring)."""
    if chunk <= 0:
        raise ValueError(f"chunked_head_logprobs: chunk must be > 0, got {chunk}")
    shape = tokens.shape
    dtype = _products_dtype(hidden)
    logp, entropy = _ChunkedHead.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias, tokens.reshape(-1),
                                       float(temperature), int(chunk), bool(with_entropy), dtype)
    return logp.view(shape), entropy.view(shape) if with_entropy else None


def _products_dtype(hidden: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype of ``hidden``'s device where autocast is on there, else None (the operands' own)."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def _block(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int, stop: int,
           dtype: torch.dtype | None, temperature: float) -> torch.Tensor:
    """``z`` of columns ``start:stop`` in fp32 for ``h`` already in ``dtype``: the product in
    ``dtype`` (None: the operands'), as autocast runs ``F.linear``, then divided by the temperature."""
    w = weight[start:stop]
    b = None if bias is None else bias[start:stop]
    if dtype is not None:
        w, b = w.to(dtype), None if b is None else b.to(dtype)
    with torch.autocast(h.device.type, enabled=False):
        return F.linear(h, w, b).float() / temperature


class _ChunkedHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, temperature, chunk, with_entropy, dtype):
        N, V = hidden.shape[0], weight.shape[0]
        m = torch.full((N,), float("-inf"), device=hidden.device)
        s = torch.zeros(N, device=hidden.device)
        u = torch.zeros(N, device=hidden.device) if with_entropy else None
        picked = torch.zeros(N, device=hidden.device)
        h = hidden if dtype is None else hidden.to(dtype)  # cast once for every chunk's product
        for start in range(0, V, chunk):
            stop = min(start + chunk, V)
            z = _block(h, weight, bias, start, stop, dtype, temperature)
            new_m = torch.maximum(m, z.max(-1).values)
            scale = torch.exp(m - new_m)
            e = torch.exp(z - new_m[:, None])
            s = s * scale + e.sum(-1)
            if with_entropy:
                u = u * scale + (e * z).sum(-1)
            m = new_m
            inside = (tokens >= start) & (tokens < stop)
            rows = inside.nonzero().squeeze(-1)
            picked[rows] = z[rows, tokens[rows] - start]
        log_z = m + torch.log(s)
        mean_z = u / s if with_entropy else None
        ctx.save_for_backward(hidden, weight, bias, tokens, log_z, mean_z)
        ctx.temperature, ctx.chunk, ctx.with_entropy, ctx.dtype = temperature, chunk, with_entropy, dtype
        return picked - log_z, (log_z - mean_z) if with_entropy else torch.zeros_like(log_z)

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, tokens, log_z, mean_z = ctx.saved_tensors
        tau, chunk, dtype = ctx.temperature, ctx.chunk, ctx.dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if need_b else None
        h = hidden if dtype is None else hidden.to(dtype)
        entropy_grad = ctx.with_entropy and grad_entropy is not None
        for start in range(0, weight.shape[0], chunk):
            stop = min(start + chunk, weight.shape[0])
            z = _block(h, weight, bias, start, stop, dtype, tau)
            p = torch.exp(z - log_z[:, None])
            if grad_logp is None:
                g = torch.zeros_like(p)
            else:
                g = -p * grad_logp[:, None]
                rows = ((tokens >= start) & (tokens < stop)).nonzero().squeeze(-1)
                g[rows, tokens[rows] - start] += grad_logp[rows]
            if entropy_grad:
                g -= p * (z - mean_z[:, None]) * grad_entropy[:, None]
            g = g / tau
            w = weight[start:stop]
            if dtype is not None:
                g, w = g.to(dtype), w.to(dtype)
            with torch.autocast(hidden.device.type, enabled=False):
                if need_h:
                    grad_h += (g @ w).float()
                if need_w:
                    grad_w[start:stop] = (g.t() @ h).to(weight.dtype)
            if need_b:
                grad_b[start:stop] = g.sum(0).to(bias.dtype)
        return (None if grad_h is None else grad_h.to(hidden.dtype)), grad_w, grad_b, None, None, None, None, None
