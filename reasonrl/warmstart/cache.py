"""Where warm starts are cached: ``$REASONRL_CACHE/warmstart/`` (default cache: ``~/.cache/reasonrl``),
and the directory of the embedded task's warm start, read without torch or ``transformers`` (the
checks before a run ask whether it is there; :mod:`reasonrl.warmstart.sft` trains it)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from reasonrl.config import SFTConfig

FORMAT_VERSION = 2
"""Bump when the task, tokenizer or training code of :mod:`reasonrl.warmstart.sft` changes what a cached model is."""


def cache_root() -> Path:
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl"))


def warm_start_dir(cfg: SFTConfig, families: tuple[str, ...]) -> Path:
    """The embedded task's warm start for ``sft.*`` = ``cfg`` and the task ``families``: a
    directory named by the hash of both and :data:`FORMAT_VERSION`."""
    key = json.dumps({"sft": asdict(cfg), "families": list(families), "v": FORMAT_VERSION}, sort_keys=True)
    return cache_root() / "warmstart" / hashlib.sha256(key.encode()).hexdigest()[:16]


def build_once(out: Path, train: Callable[[Path], dict[str, Any]]) -> Path:
    """``out``, built by ``train(tmp_dir)`` (which returns the summary) unless its
    ``sft_summary.json`` is there already. The build holds an exclusive ``flock`` on
    ``out.lock``, so runs started together on a cold cache (a parallel sweep, a test suite's
    workers) train it once: the others wait and then read it. It is trained in a directory of
    its own and renamed into place, so a reader never sees a half-written model."""
    if (out / "sft_summary.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (out / "sft_summary.json").is_file():  # built while this process waited
            return out
        tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        summary = train(tmp)
        (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out
