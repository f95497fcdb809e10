"""The vLLM backend is lazy: the trainer imports without vllm, and choosing the backend
without it says how to install it (run with vllm made unimportable, installed or not)."""

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["vllm"] = None  # any import of vllm now raises ImportError
import reasonrl.controller
from reasonrl.rollout.vllm import VLLMGenerator
try:
    VLLMGenerator("model-dir", "cpu", 0, 1)
except ImportError as err:
    print(err)
"""


def test_vllm_backend_without_vllm_says_how_to_install():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("rollout.backend=vllm needs the vllm package: pip install 'reasonrl[vllm]'"), result.stdout
