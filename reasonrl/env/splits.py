"""The prompts of a multi-turn run: an environment's initial states.

A prompt is one initial state: the first observation of ``reset(seed)``, as a user message
(the chat template renders it), with the seed in ``extra["seed"]`` so that the rollout
worker resets its ``rollout.n`` episodes of the group to that very state::

    train:    seeds 0 .. data.train_size - 1
    held out: seeds HELD_OUT_SEED .. HELD_OUT_SEED + data.test_size - 1   (never trained)

The environment is user code: each reset runs in a worker process killed at
``runtime.roles.env.timeout_s`` (:func:`reasonrl.runtime.topology.reset_start`, wherever the
states are read: the pre-start check, the trainer, ``reasonrl eval``), and a reset that fails, hangs past that, or returns an
observation longer than :data:`MAX_OBSERVATION_CHARS` is an InputError naming the
environment, the seed and what it exceeded.
"""

from __future__ import annotations

from typing import Any, Callable

from reasonrl.config import Config
from reasonrl.data.splits import Splits, read_splits
from reasonrl.env.pool import EnvFailure, EnvPool
from reasonrl.errors import InputError
from reasonrl.types import Prompt

HELD_OUT_SEED = 10**9
"""The first reset seed of the held-out initial states."""

MAX_OBSERVATION_CHARS = 100_000
"""The longest first observation an initial state may have, in characters (some 25k tokens at
four characters a token, past any data.max_prompt_len a prompt is kept at): a longer one is an
environment fault, refused before the run starts rather than tokenised."""


def initial_states(cfg: Config, pool: EnvPool, seeds: range, split: str) -> list[Prompt]:
    """One prompt per seed: ``env.name``'s first observation after ``reset(seed)`` in slot 0
    of ``pool``."""
    name = cfg.env.name
    prompts = []
    for seed in seeds:
        (first,) = pool.reset_many([seed])
        where = f"env.name = {name!r}: reset({seed}), the first observation of a {split} prompt"
        if isinstance(first, EnvFailure):
            raise InputError(f"{where}: {first.message}")
        observation = first[0]
        if len(observation) > MAX_OBSERVATION_CHARS:
            raise InputError(f"{where}: {len(observation):,} characters, more than the {MAX_OBSERVATION_CHARS:,} "
                             "an initial state may have (MAX_OBSERVATION_CHARS of reasonrl/env/splits.py)")
        prompts.append(Prompt(f"{name}:{seed}", [{"role": "user", "content": observation}], "",
                              f"env:{name}", {"seed": seed, "split": split}))
    return prompts


def env_splits(cfg: Config, workers: Callable[..., Any] | None) -> Splits:
    """The training and held-out initial states of ``env.name`` (see the module docstring),
    each reset in the pool ``workers`` starts (None: in this process, without a time limit)."""
    d, name = cfg.data, cfg.env.name
    with EnvPool.from_config(cfg.env, 1, workers) as pool:
        train = initial_states(cfg, pool, range(d.train_size), "train")
        test = initial_states(cfg, pool, range(HELD_OUT_SEED, HELD_OUT_SEED + d.test_size), "test")
    line = (f"{len(train)} training initial states of env {name} (seeds 0..{d.train_size - 1}), {len(test)} held out "
            f"(seeds from {HELD_OUT_SEED}, never trained)")
    return Splits(train, test, f"env:{name}", f"env:{name}", line)


def run_splits(cfg: Config, resets: Callable[..., Any] | None) -> Splits:
    """A run's prompts: the initial states of ``env.name`` when set, each reset in the pool
    ``resets`` starts (:func:`reasonrl.runtime.topology.reset_start`, wherever they are read:
    the pre-start check, the trainer, ``reasonrl eval``), else ``data.*``
    (:func:`~reasonrl.data.splits.read_splits`)."""
    return env_splits(cfg, resets) if cfg.env.name else read_splits(cfg)
