"""Where warm starts are cached: ``$REASONRL_CACHE/warmstart/`` (default cache: ``~/.cache/reasonrl``),
and the directory of the embedded task's warm start, read without torch or ``transformers`` (the
checks before a run ask whether it is there; :mod:`reasonrl.warmstart.sft` trains it)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

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
