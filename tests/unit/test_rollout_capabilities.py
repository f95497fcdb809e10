"""Every rollout backend class declares the capabilities of its row of the one table the config
rules read (``reasonrl.config.capabilities.BACKENDS``), so the two cannot drift apart."""

from __future__ import annotations

import dataclasses

import pytest

from reasonrl.config.capabilities import BACKENDS, Capabilities
from reasonrl.rollout.base import declares
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.rollout.sim import SimGenerator
from reasonrl.rollout.vllm import VLLMGenerator

CLASSES = {"fast": FastGenerator, "hf": HFGenerator, "vllm": VLLMGenerator, "sim": SimGenerator}
CAPABILITIES = [f.name for f in dataclasses.fields(Capabilities)]


def test_every_backend_of_the_table_has_a_class():
    assert CLASSES.keys() == BACKENDS.keys()


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_backend_class_declares_its_row_of_the_table(name):
    cls = CLASSES[name]
    assert {c: getattr(cls, c) for c in CAPABILITIES} == dataclasses.asdict(BACKENDS[name])


def test_the_capabilities_match_what_the_classes_implement():
    """continues: a ``start`` (a continuation); streams: a ``generate_stream``; interrupts: the
    fast decode loop that PartialRollouts drives (it wraps a FastGenerator only); adapters: a
    ``load_adapters``."""
    for name, cls in CLASSES.items():
        assert BACKENDS[name].continues == hasattr(cls, "start"), name
        assert BACKENDS[name].streams == hasattr(cls, "generate_stream"), name
        assert BACKENDS[name].interrupts == issubclass(cls, FastGenerator), name
        assert BACKENDS[name].adapters == hasattr(cls, "load_adapters"), name
    assert [name for name, caps in BACKENDS.items() if caps.trainer_numerics] == ["fast", "hf"]


def test_partial_rollouts_interrupt_and_stream_but_do_not_continue():
    assert (PartialRollouts.interrupts, PartialRollouts.streams, PartialRollouts.continues) == (True, True, False)
    assert PartialRollouts.trainer_numerics == BACKENDS["fast"].trainer_numerics
    assert not hasattr(PartialRollouts, "start")


def test_declares_copies_a_row_and_refuses_an_unknown_backend():
    @declares("hf")
    class Backend:
        pass

    assert {c: getattr(Backend, c) for c in CAPABILITIES} == dataclasses.asdict(BACKENDS["hf"])
    with pytest.raises(KeyError):
        declares("sglang")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_trainer_numerics_of_a_config_reads_the_table(backend, monkeypatch):
    from reasonrl.config import load
    from reasonrl.config import capabilities as C
    from reasonrl.workers.rollout import trainer_numerics

    fp32 = load(None, [f"rollout.backend={backend}"])
    assert trainer_numerics(fp32) == BACKENDS[backend].trainer_numerics
    assert not trainer_numerics(load(None, [f"rollout.backend={backend}", "model.dtype=bfloat16"]))
    flipped = dataclasses.replace(BACKENDS[backend], trainer_numerics=not BACKENDS[backend].trainer_numerics)
    monkeypatch.setitem(C.BACKENDS, backend, flipped)
    assert trainer_numerics(fp32) == flipped.trainer_numerics
