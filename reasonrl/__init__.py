"""reasonrl: reinforcement-learning post-training of language models on verifiable reasoning tasks.

The Python API (:mod:`reasonrl.api`), loaded on first use so that ``import reasonrl`` imports
neither torch nor the config loader:

    cfg = reasonrl.Config.load("dapo", ["train.total_steps=20"])   # reasonrl.config.Config
    summary = reasonrl.train(cfg, on_step=print)                    # reasonrl.api.train
    results = reasonrl.evaluate(cfg, model=cfg.run.dir)             # reasonrl.api.evaluate
"""

import importlib as _importlib
from importlib.metadata import PackageNotFoundError as _NotInstalled, version as _version
from types import ModuleType as _ModuleType

from reasonrl import train as _train_package

try:
    __version__ = _version("reasonrl")
    """The installed distribution's version (pyproject.toml's ``version``)."""
except _NotInstalled:  # imported from a source tree that was never installed
    __version__ = "unknown (not installed)"

_LAZY = {"Config": "reasonrl.config", "evaluate": "reasonrl.api"}
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


class _TrainPackage(_ModuleType):
    """``reasonrl.train`` is the package of the training code (reasonrl/train/: log-probs,
    updates, ranks), and calling it trains: the import system binds the package to that name
    whenever one of its modules is imported, so the API's ``train`` is the package's call."""

    def __call__(self, cfg, on_step=None, *, supervise: bool = False) -> dict:
        """:func:`reasonrl.api.train`: train ``cfg`` in this process (``supervise=True``: under
        the supervisor) and return the run's summary; ``on_step(step, metrics)`` is called with
        each row of ``metrics.jsonl``."""
        from reasonrl.api import train

        return train(cfg, on_step, supervise=supervise)


_train_package.__class__ = _TrainPackage
