"""The prompts of a multi-turn run: an environment's initial states.

A prompt is one initial state: the first observation of ``reset(seed)``, as a user message
(the chat template renders it), with the seed in ``extra["seed"]`` so that the rollout
worker resets its ``rollout.n`` episodes of the group to that very state::

    train:    seeds 0 .. data.train_size - 1
    held out: seeds HELD_OUT_SEED .. HELD_OUT_SEED + data.test_size - 1   (never trained)
"""

from __future__ import annotations

from reasonrl.config import Config
from reasonrl.data.splits import Splits, read_splits
from reasonrl.env.base import check_reset
from reasonrl.env.registry import make_env
from reasonrl.types import Prompt

HELD_OUT_SEED = 10**9
"""The first reset seed of the held-out initial states."""


def initial_states(cfg: Config, seeds: range, split: str) -> list[Prompt]:
    """One prompt per seed: ``env.name``'s first observation after ``reset(seed)``."""
    e = cfg.env
    env = make_env(e.name, e.args, e.tools, e.tool_call_pattern, e.tool_response_format)
    try:
        prompts = []
        for seed in seeds:
            observation, _ = check_reset(env.reset(seed))
            prompts.append(Prompt(f"{e.name}:{seed}", [{"role": "user", "content": observation}], "",
                                  f"env:{e.name}", {"seed": seed, "split": split}))
        return prompts
    finally:
        close = getattr(env, "close", None)
        if close is not None:
            close()


def env_splits(cfg: Config) -> Splits:
    """The training and held-out initial states of ``env.name`` (see the module docstring)."""
    d, name = cfg.data, cfg.env.name
    train = initial_states(cfg, range(d.train_size), "train")
    test = initial_states(cfg, range(HELD_OUT_SEED, HELD_OUT_SEED + d.test_size), "test")
    line = (f"{len(train)} training initial states of env {name} (seeds 0..{d.train_size - 1}), {len(test)} held out "
            f"(seeds from {HELD_OUT_SEED}, never trained)")
    return Splits(train, test, f"env:{name}", f"env:{name}", line)


def run_splits(cfg: Config) -> Splits:
    """A run's prompts: the initial states of ``env.name`` when set, else ``data.*``
    (:func:`~reasonrl.data.splits.read_splits`)."""
    return env_splits(cfg) if cfg.env.name else read_splits(cfg)
