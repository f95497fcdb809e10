"""Compute precision: ``train.precision`` for the trainer, the reference, the critic and the sampler.

``fp32``: everything in the parameters' dtype (``model.dtype``). ``bf16-mixed``: the parameters,
their gradients and the AdamW state stay fp32 (``model.dtype=float32``), and the forward passes run
under ``torch.autocast(dtype=bfloat16)``: matrix products and attention in bf16, the residual
stream, norms, log-softmax and losses in fp32 (:mod:`reasonrl.models.decoder` casts the fused weights
once per pass; ``transformers`` modules follow autocast's op lists). A pure-bf16 model
(``model.dtype=bfloat16``) instead keeps the parameters themselves in bf16, where an AdamW step
smaller than half a bf16 spacing (2^-8 relative) is rounded away.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("fp32", "bf16-mixed")
"""The values of ``train.precision``."""


def compute_context(precision: str, device: str) -> contextlib.AbstractContextManager:
    """A fresh context for one forward (or forward + backward) region: ``torch.autocast`` on
    ``device``'s type in bf16 for ``bf16-mixed`` (its weight-cast cache off: the lean decoder
    casts its fused weights itself, and a cached cast would outlive an optimizer step inside a
    region), nothing for ``fp32``."""
    if precision == "bf16-mixed":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def enable_checkpointing(module: torch.nn.Module) -> None:
    """Activation checkpointing on every decoder layer of a ``transformers`` model (non-reentrant
    ``torch.utils.checkpoint``; :mod:`reasonrl.models.decoder` honours the same per-layer flag):
    ``activation_checkpointing_enable``, which transformers 5.23 names what older releases in
    our range call ``gradient_checkpointing_enable``."""
    enable = getattr(module, "activation_checkpointing_enable", None) or module.gradient_checkpointing_enable
    enable({"use_reentrant": False})
