"""LoRA adapters on a causal LM, with the ``peft`` library (the ``lora`` extra).

    apply_lora(module, cfg.model.lora, seed)   peft LoRA layers on the target projections; only they train
    adapter_tensors(module)                    name -> adapter parameter (lora_A, lora_B), the trained state
    load_adapters(module, tensors)             copy adapter tensors in by name (every adapter, nothing else)
    merged_tensors(module)                     the plain model's parameters, each LoRA projection merged
    lora_weight(linear)                        one projection's effective weight (the lean decoder fuses it)
    load_policy(model_dir, cfg, device)        the policy's module: the model, with adapters when model.lora.rank > 0
    ships_adapters(cfg)                        whether rollout workers are sent the adapters alone

A LoRA projection with rank ``r``, ``A [r, in]``, ``B [out, r]`` (``B = 0`` at the start, so
the adapted model starts as the base model) computes::

    y = x W^T + b + s * dropout(x) A^T B^T,      s = alpha / r

which, without dropout (evaluation, or ``model.lora.dropout = 0``), is the projection with the
merged weight ``W' = W + s B A``. The base weights ``W`` (and every parameter outside the
adapters) are frozen. Adapters are injected in place (``peft.inject_adapter_in_model``): the
module keeps its class and config, and a projection's base weight is named
``....q_proj.base_layer.weight``, its adapters ``....q_proj.lora_A.default.weight`` and
``....q_proj.lora_B.default.weight``; :func:`merged_tensors` gives the plain names back.

``peft`` is imported only by :func:`apply_lora`; the other functions read the layers' own
attributes (``base_layer``, ``lora_A``, ``lora_B``, ``scaling``), so a module without adapters
needs no ``peft``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch

from reasonrl.errors import InputError, error_line

if TYPE_CHECKING:
    from pathlib import Path

    from reasonrl.config.schema import Config, LoraConfig

ADAPTER = "default"
"""The one adapter's name (peft's default)."""

BASE = ".base_layer"
"""What peft inserts in the name of a wrapped projection's own parameters."""


def apply_lora(module: torch.nn.Module, lora: LoraConfig, seed: int) -> torch.nn.Module:
    """Inject LoRA layers (rank ``lora.rank``, ``lora.alpha``, ``lora.dropout``) on the
    projections named in ``lora.target_modules`` of ``module``, in place, and freeze every
    other parameter; returns ``module``. ``A`` is initialised from ``seed`` (torch's global RNG
    is left as it was), ``B`` with zeros. InputError naming the key when ``peft`` is missing or a
    target matches no module."""
    try:
        from peft import LoraConfig as PeftLoraConfig, inject_adapter_in_model
    except ImportError as err:
        raise InputError(f"model.lora.rank = {lora.rank}: LoRA needs the peft package "
                         f"({error_line(err)}); install it with pip install 'reasonrl[lora]'") from None
    config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            inject_adapter_in_model(config, module)
        except ValueError as err:
            raise InputError(f"model.lora.target_modules = {list(lora.target_modules)}: {error_line(err)}") from None
    for name, p in module.named_parameters():
        p.requires_grad_(is_adapter(name))
    return module


def load_policy(model_dir: str | Path, cfg: Config, device: str = "cpu") -> torch.nn.Module:
    """The model in ``model_dir`` (``model.dtype``, on ``device``) with LoRA adapters when
    ``model.lora.rank > 0`` (``A`` initialised from ``run.seed``): the same module, adapters
    and all, wherever the policy is built (the trainer, a rollout worker, an export)."""
    from reasonrl.models.loading import load_model

    module = load_model(model_dir, cfg.model.dtype, device)
    return apply_lora(module, cfg.model.lora, cfg.run.seed) if cfg.model.lora.rank > 0 else module


def ships_adapters(cfg: Config) -> bool:
    """Whether a LoRA run's rollout workers are sent the adapters alone: ``model.lora.rank > 0``
    and a ``rollout.backend`` with the ``adapters`` capability (the others get merged weights)."""
    from reasonrl.config.capabilities import can

    return cfg.model.lora.rank > 0 and can(cfg.rollout.backend, "adapters")


def lora_config_of(module: torch.nn.Module):
    """The ``peft.LoraConfig`` the adapters of ``module`` were injected with."""
    return module.peft_config[ADAPTER]


def is_adapter(name: str) -> bool:
    """Whether the parameter ``name`` is a LoRA adapter's (``lora_A`` or ``lora_B``)."""
    return ".lora_A." in name or ".lora_B." in name


def has_lora(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds LoRA layers."""
    return any(True for _ in lora_layers(module))


def lora_layers(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """(name, layer) of every LoRA-wrapped projection in ``module``."""
    for name, sub in module.named_modules():
        if _is_lora(sub):
            yield name, sub


def _is_lora(sub: torch.nn.Module) -> bool:
    return hasattr(sub, "base_layer") and hasattr(sub, "lora_A") and hasattr(sub, "scaling")


def lora_weight(linear: torch.nn.Module) -> torch.Tensor:
    """The weight ``linear`` applies without dropout: ``W + s B A`` for a LoRA layer (its adapter
    active and not merged into ``W``), else its own ``weight``. Gradients flow to ``A`` and ``B``."""
    if not _is_lora(linear):
        return linear.weight
    base = linear.base_layer.weight
    if getattr(linear, "merged", False) or getattr(linear, "disable_adapters", False):
        return base
    a, b = linear.lora_A[ADAPTER].weight, linear.lora_B[ADAPTER].weight
    return torch.addmm(base, b, a, alpha=linear.scaling[ADAPTER])


def dropout_active(module: torch.nn.Module) -> bool:
    """Whether a forward of ``module`` applies LoRA dropout now (training mode and a dropout
    above 0): the merged weight of :func:`lora_weight` is then not what the layer computes."""
    if not module.training:
        return False
    for _, layer in lora_layers(module):
        drop = layer.lora_dropout[ADAPTER]
        if isinstance(drop, torch.nn.Dropout) and drop.p > 0:
            return True
    return False


def adapter_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> the adapter parameters of ``module`` (detached views), in parameter order."""
    return {name: p.detach() for name, p in module.named_parameters() if is_adapter(name)}


@torch.no_grad()
def load_adapters(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy ``tensors`` into the adapter parameters of ``module`` by name; they must be exactly
    its adapters (a KeyError names what is missing or unknown)."""
    params = {name: p for name, p in module.named_parameters() if is_adapter(name)}
    if params.keys() != tensors.keys():
        missing, extra = sorted(params.keys() - tensors.keys()), sorted(tensors.keys() - params.keys())
        raise KeyError(f"load_adapters: adapters missing {missing[:5]}, unknown {extra[:5]}")
    for name, p in params.items():
        p.copy_(tensors[name])


@torch.no_grad()
def merged_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of the plain model (``named_parameters`` names of the model without
    adapters) with each LoRA projection's weight merged, ``W + s B A`` (new tensors); every
    other parameter is a detached view."""
    merged = {f"{name}.weight": lora_weight(layer).detach().clone() for name, layer in lora_layers(module)}
    out: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        if is_adapter(name):
            continue
        plain = name.replace(BASE, "")
        out[plain] = merged.get(plain, p.detach())
    return out
