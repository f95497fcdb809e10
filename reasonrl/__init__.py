"""reasonrl: reinforcement-learning post-training of language models on verifiable reasoning tasks."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("reasonrl")
    """The installed distribution's version (pyproject.toml's ``version``)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown (not installed)"
