"""Supervised warm starts of the embedded model: of the embedded task (:mod:`reasonrl.warmstart.sft`)
and of the shipped environments (:mod:`reasonrl.warmstart.env`), and :func:`resolve_model_dir`,
which picks between them (here, above both, so that ``sft`` never imports ``env``). Both train
with torch, imported only when a warm start is resolved: where they are cached
(:mod:`reasonrl.warmstart.cache`) is read without it."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from reasonrl.config import Config


def resolve_model_dir(cfg: Config, log: Callable[[str], None] = print) -> Path:
    """The policy's model directory, model.path unless that is ``embedded``: then the cached warm
    start, of the environment ``env.name`` when it is a shipped one with a warm start (grid,
    tool_arith: :mod:`reasonrl.warmstart.env`), else of the embedded task."""
    if cfg.model.path == "embedded":
        from reasonrl.warmstart.env import ensure_env_warm_start, has_warm_start
        from reasonrl.warmstart.sft import ensure_warm_start

        if cfg.env.name and has_warm_start(cfg.env.name):
            return ensure_env_warm_start(cfg, log)
        return ensure_warm_start(cfg.sft, cfg.data.families, log)
    return Path(cfg.model.path)
