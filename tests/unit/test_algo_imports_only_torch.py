"""reasonrl.algo imports with transformers, ray, vllm, tokenizers and yaml absent.

It must pull in nothing else of the project either.
"""

import subprocess
import sys

SCRIPT = """
import sys
for name in ("transformers", "ray", "vllm", "tokenizers", "yaml"):
    sys.modules[name] = None  # any import of these now raises ImportError
import reasonrl.algo
project = sorted(m for m in sys.modules if m.startswith("reasonrl"))
outside = [m for m in project if m not in ("reasonrl", "reasonrl.algo") and not m.startswith("reasonrl.algo.")]
assert not outside, outside
assert "reasonrl.config" not in sys.modules and "reasonrl.types" not in sys.modules
for name in ("transformers", "ray", "vllm", "tokenizers", "yaml"):
    assert sys.modules[name] is None, name
print("ok")
"""


def test_algo_imports_only_torch():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
