"""The vLLM backend is lazy: choosing it without vllm says how to install it (vllm made
unimportable here, installed or not; the rest of the suite imports the trainer without it)."""

import sys

import pytest

from reasonrl.errors import InputError
from reasonrl.rollout.vllm import VLLMGenerator


def test_vllm_backend_without_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # any import of vllm now raises ImportError
    with pytest.raises(InputError) as err:  # exit 2 in a run: a restart would not install it
        VLLMGenerator("model-dir", "cpu", 0, 1)
    assert str(err.value).startswith("rollout.backend=vllm needs the vllm package: pip install 'reasonrl[vllm]'"), err.value
