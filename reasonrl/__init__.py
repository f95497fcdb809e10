"""reasonrl: reinforcement-learning post-training of language models on verifiable reasoning tasks.

The Python API (:mod:`reasonrl.api`), loaded on first use so that ``import reasonrl`` imports
neither torch nor the config loader:

    cfg = reasonrl.Config.load("dapo", ["train.total_steps=20"])   # reasonrl.config.Config
    summary = reasonrl.train(cfg, on_step=print)                    # reasonrl.api.train
    results = reasonrl.evaluate(cfg, model=cfg.run.dir)             # reasonrl.api.evaluate
"""

import importlib as _importlib
from importlib.metadata import PackageNotFoundError as _NotInstalled, version as _version

try:
    __version__ = _version("reasonrl")
    """The installed distribution's version (pyproject.toml's ``version``)."""
except _NotInstalled:  # imported from a source tree that was never installed
    __version__ = "unknown (not installed)"

_LAZY = {"Config": "reasonrl.config", "train": "reasonrl.api", "evaluate": "reasonrl.api"}
"""{name: the module it is read from on first use}."""

__all__ = ["Config", "__version__", "evaluate", "train"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
