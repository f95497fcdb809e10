"""Resolving a user's object in a process of its own, within a time limit.

    check_importable("my_rewards:score", "reward function", timeout_s=60, need_callable=True)

A user's module runs its top level when imported: it may hang, loop or exit the interpreter.
The pre-start check resolves such specs (``module:Name``, ``path/to/file.py:Name``,
:func:`reasonrl.plugins.load_object`) in a fresh interpreter with this process's working
directory, environment and ``sys.path`` (as the worker processes that import it later have
them), killed at ``timeout_s``, so that a bad spec is an InputError at once and a
hanging import is an InputError naming the limit, never a check that does not end. The object
is not brought back: whoever uses it imports it where it runs (a reward worker, an
environment worker), each of those bounded too.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

from reasonrl.errors import InputError

_PROBE = """
import json
import sys

sys.path[:] = json.loads(sys.argv[5])
from reasonrl.errors import InputError
from reasonrl.plugins import load_object

spec, key, need_callable, done = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
try:
    obj = load_object(spec, key)
except InputError as err:
    sys.stderr.write(str(err))
    sys.exit(2)
if need_callable and not callable(obj):
    sys.stderr.write(f"{key} = {spec!r}: {spec.rpartition(':')[2]!r} is a {type(obj).__name__}, not a callable")
    sys.exit(2)
sys.stdout.write(done)
"""


def check_importable(spec: str, key: str, timeout_s: float, need_callable: bool = False) -> None:
    """InputError naming ``key`` and ``spec`` unless ``spec`` resolves (to a callable, with
    ``need_callable``) in a process of its own within ``timeout_s`` seconds."""
    marker = f"reasonrl-resolved-{secrets.token_hex(8)}"  # an import that ends the interpreter never prints it
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, spec, key, "1" if need_callable else "0", marker,
                               json.dumps(sys.path)],
                              capture_output=True, text=True, errors="replace", timeout=timeout_s, cwd=os.getcwd(),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InputError(f"{key} = {spec!r}: importing it did not end within {timeout_s:g} s (a module that hangs "
                         "or loops at import?)") from None
    if done.returncode == 2 and done.stderr and "Traceback" not in done.stderr:
        raise InputError(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0 or not done.stdout.endswith(marker):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise InputError(f"{key} = {spec!r}: importing it ended the interpreter ({last})")
