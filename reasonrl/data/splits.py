"""The training and held-out prompts of a run, and their token ids."""

from __future__ import annotations

from reasonrl.config import Config
from reasonrl.data import tasks
from reasonrl.data.datasets import load_prompts, render_prompt
from reasonrl.errors import InputError
from reasonrl.types import Prompt


def load_splits(cfg: Config) -> tuple[list[Prompt], list[Prompt]]:
    """(train prompts, held-out prompts) for data.source."""
    d = cfg.data
    if d.source == "embedded":
        train = tasks.to_prompts(tasks.generate(d.families, d.train_size, d.seed, "train"), "train")
        test = tasks.to_prompts(tasks.generate(d.families, d.test_size, d.seed, "test"), "test")
        return train, test
    train = load_prompts(d.source, d.prompt_key, d.answer_key)
    if d.test_source:
        return train, load_prompts(d.test_source, d.prompt_key, d.answer_key)
    held = cfg.eval.n_prompts
    if len(train) <= held:
        raise InputError(f"data.source: {d.source} has {len(train)} rows, too few to hold out eval.n_prompts={held}; give data.test_source")
    return train[held:], train[:held]


def tokenize_prompts(prompts: list[Prompt], tokenizer, max_len: int, source: str) -> list[list[int]]:
    """Token ids of each prompt as the model sees it (chat template applied); a prompt longer
    than ``max_len`` tokens (``data.max_prompt_len``) is an InputError naming it and ``source``."""
    ids = tokenizer([render_prompt(p, tokenizer) for p in prompts])["input_ids"]
    for p, row in zip(prompts, ids):
        if len(row) > max_len:
            raise InputError(f"data.max_prompt_len: prompt {p.id} of {source} has {len(row)} tokens, more than {max_len}")
    return ids
