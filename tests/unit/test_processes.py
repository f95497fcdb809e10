"""No process is created outside runtime/, the supervisor and the sandbox (DESIGN.md).

The source of every reasonrl module is scanned (``ast``) for the calls that start a process or
prepare a start method: ``subprocess.*``, ``os.fork``/``os.spawn*``/``os.system``,
``multiprocessing.Process``/``Pool``/``get_context``, a context's ``.Process``/``.Pool``,
``ProcessPoolExecutor`` and ``ray.remote`` (an actor is a process), by whatever name they were
imported under.
"""

from __future__ import annotations

import ast
from pathlib import Path

import reasonrl

PACKAGE = Path(reasonrl.__file__).parent

CREATORS = (
    "reasonrl/runtime/",  # the one process pool, process groups, Ray actors, trainer ranks, import checks
    "reasonrl/resilience/supervisor.py",  # owns the driver process
    "reasonrl/reward/sandbox.py",  # runs untrusted code
)
"""Where processes may be created: a folder (ending in /) or a file, relative to the repository."""

ALLOWED: dict[tuple[str, str], str] = {
    # (file, call as written): why it is still there. Empty: the reward and environment pools start their workers
    # through runtime/pool.py; an entry added here needs a reason, and one the code no longer has must go.
}

MODULE_CALLS = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnl", "spawnle", "spawnlp",
           "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"},
    "multiprocessing": {"Process", "Pool", "get_context"},
    "torch.multiprocessing": {"Process", "Pool", "get_context", "spawn", "start_processes"},
    "concurrent.futures": {"ProcessPoolExecutor"},
    "ray": {"remote"},
}
"""{module: the functions and classes of it that start a process or choose how one starts}."""

ANY_OBJECT = {"Process", "Pool", "get_context", "ProcessPoolExecutor"}
"""Attributes that count on any object (``ctx.Process``, ``mp.get_context``, ``futures.ProcessPoolExecutor``)."""


def process_calls(source: str) -> list[tuple[int, str, str]]:
    """(line, call as written, what it resolves to) of every process-creating call in ``source``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> dotted module or module.attribute
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        written = ast.unparse(node.func)
        parts = written.split(".")
        resolved = ".".join([aliases.get(parts[0], parts[0]), *parts[1:]])
        module, _, name = resolved.rpartition(".")
        if name in MODULE_CALLS.get(module, ()) or (isinstance(node.func, ast.Attribute) and name in ANY_OBJECT):
            found.append((node.lineno, node.col_offset, written, resolved))
    return [(line, written, resolved) for line, _, written, resolved in sorted(found, key=lambda f: f[:2])]


def test_processes_are_created_only_in_runtime_the_supervisor_and_the_sandbox():
    offenders, seen = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if any(rel == c or (c.endswith("/") and rel.startswith(c)) for c in CREATORS):
            continue
        for line, written, resolved in process_calls(path.read_text(encoding="utf-8")):
            if (rel, written) in ALLOWED:
                seen.add((rel, written))
            else:
                offenders.append(f"{rel}:{line}: {written}() ({resolved}) creates a process outside "
                                 f"runtime/, the supervisor and the sandbox")
    assert not offenders, "\n".join(offenders)
    stale = set(ALLOWED) - seen
    assert not stale, f"gone from the code, remove from ALLOWED: {sorted(stale)}"


def test_the_scan_sees_each_way_of_starting_a_process():
    source = """
import os, subprocess as sp, multiprocessing
import concurrent.futures
from multiprocessing import get_context, Process
from concurrent.futures import ProcessPoolExecutor
import ray

def f(ctx):
    sp.run(["true"])
    subprocess_like = os.fork()
    os.spawnv(os.P_WAIT, "/bin/true", ["true"])
    multiprocessing.get_context("spawn").Process(target=print)
    get_context("fork")
    Process(target=print)
    ctx.Process(target=print)
    ProcessPoolExecutor(2)
    concurrent.futures.ProcessPoolExecutor(2)
    ray.remote(object)
    os.path.join("a", "b")
    sp.TimeoutExpired
    run = print; run("not a process")
"""
    assert [(written, resolved) for _, written, resolved in process_calls(source)] == [
        ("sp.run", "subprocess.run"),
        ("os.fork", "os.fork"),
        ("os.spawnv", "os.spawnv"),
        ("multiprocessing.get_context('spawn').Process", "multiprocessing.get_context('spawn').Process"),
        ("multiprocessing.get_context", "multiprocessing.get_context"),
        ("get_context", "multiprocessing.get_context"),
        ("Process", "multiprocessing.Process"),
        ("ctx.Process", "ctx.Process"),
        ("ProcessPoolExecutor", "concurrent.futures.ProcessPoolExecutor"),
        ("concurrent.futures.ProcessPoolExecutor", "concurrent.futures.ProcessPoolExecutor"),
        ("ray.remote", "ray.remote"),
    ]
