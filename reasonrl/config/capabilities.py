"""What each rollout backend can do: the one table that the backends' classes and the config rules read.

The rules (``validate``) refuse a config that needs a capability its ``rollout.backend`` lacks,
and every backend class (``reasonrl.rollout``) takes its capability attributes from its row here
(:func:`reasonrl.rollout.base.declares`), so the two cannot drift apart. This module imports
only the standard library: the config package stays importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a rollout backend can do."""

    continues: bool
    """A multi-turn session continues a sequence with an environment's tokens (its ``start``
    returns a continuation), as ``env.name`` needs."""
    interrupts: bool
    """A generation can be interrupted by new weights and go on with them (``rollout.interrupt``:
    :class:`~reasonrl.rollout.partial.PartialRollouts` wraps it)."""
    streams: bool
    """Groups are reported as they complete (``generate_stream``: dynamic sampling stops early)."""
    trainer_numerics: bool
    """Sampling runs the trainer's own forward code over the weights, so in fp32 the sampling
    log-probs are the trainer's (``train.old_logprobs=auto`` reuses them)."""
    adapters: bool
    """It samples with a torch module of its own that holds the LoRA layers (``load_adapters``),
    so weight sync of a LoRA run (``model.lora.rank > 0``) ships the adapters only; a backend
    without it is sent the merged weights (W + (alpha / r) B A)."""


BACKENDS: dict[str, Capabilities] = {
    "fast": Capabilities(continues=True, interrupts=True, streams=True, trainer_numerics=True, adapters=True),
    "hf": Capabilities(continues=True, interrupts=False, streams=False, trainer_numerics=True, adapters=True),
    "vllm": Capabilities(continues=False, interrupts=False, streams=False, trainer_numerics=False, adapters=False),
    # sim: a latency model. It does not stream: the fleet polls streaming workers with waits of
    # real seconds, which a time-scaled simulation would stretch by 1 / rollout.sim_time_scale.
    "sim": Capabilities(continues=False, interrupts=False, streams=False, trainer_numerics=False, adapters=False),
}
"""``rollout.backend`` -> what it can do (the keys are ``RolloutConfig.backend``'s choices)."""

CAPABILITIES: dict[str, str] = {
    "continues": "continue a sequence with an environment's tokens",
    "interrupts": "be interrupted by new weights and go on with them",
    "streams": "report groups as they complete",
    "trainer_numerics": "sample with the trainer's own forward code",
    "adapters": "load LoRA adapters into a module of its own",
}
"""Capability -> what a backend that has it can do (the wording of every refusal)."""


def backends_that(capability: str) -> list[str]:
    """The names of the backends that have ``capability``, in the table's order."""
    return [name for name, caps in BACKENDS.items() if getattr(caps, capability)]


def can(backend: str, capability: str) -> bool:
    """Whether ``backend`` (a key of :data:`BACKENDS`) has ``capability``."""
    return bool(getattr(BACKENDS[backend], capability))


def cannot(capability: str, needed_by: str) -> str:
    """A refusal's reason, after ``rollout.backend = 'X': ``: ``cannot <what> (<needed_by> needs
    a backend that can: <those that can>)``."""
    return f"cannot {CAPABILITIES[capability]} ({needed_by} needs a backend that can: {', '.join(backends_that(capability))})"
