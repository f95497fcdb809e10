"""The training and held-out prompts of a run, how the held-out ones were chosen, and their token ids.

    splits = read_splits(cfg)      # .train, .test, .description (one line for the console)
    train, test = load_splits(cfg)

The held-out prompts are, in this order of precedence:

1. ``data.test_source``, for every ``data.source``, ``embedded`` included;
2. with ``data.source=embedded``, the embedded test split (disjoint from training by a hash
   of each question);
3. with ``data.source`` one saved DatasetDict holding a 'train' split, its 'test' (else
   'validation') split;
4. else a split of ``data.source`` by prompt: its distinct prompts (:func:`prompt_identity`:
   the text, whitespace collapsed) are ordered by a hash seeded by ``data.seed`` and the first
   ``data.holdout`` (0: ``eval.n_prompts``) are held out, one row each; every copy of them is
   left out of training, so no prompt is in both splits (the DAPO AIME file repeats each of
   its 30 problems 32 times).

``data.dedupe`` first drops the rows of data files whose prompt repeats an earlier row's. A
held-out set that shares prompts with the training rows (1, 3) is reported, not altered.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass

from reasonrl.config import Config, DataConfig
from reasonrl.data import tasks
from reasonrl.data.datasets import load_prompts, render_prompt
from reasonrl.data.sources import TEST_SPLITS, TRAIN_SPLITS, entries, locate, source_name
from reasonrl.errors import InputError
from reasonrl.types import Prompt


@dataclass(frozen=True)
class Splits:
    """The prompts of a run and how they were chosen."""

    train: list[Prompt]
    test: list[Prompt]
    train_from: str
    """Where the training prompts come from, for messages: 'embedded' or the paths."""
    test_from: str
    """Where the held-out prompts come from, for messages."""
    description: str
    """One line: the sources, the counts and how the held-out split was made (printed at the
    start of a run and in the dry-run plan)."""


def load_splits(cfg: Config) -> tuple[list[Prompt], list[Prompt]]:
    """(train prompts, held-out prompts) of :func:`read_splits`."""
    splits = read_splits(cfg)
    return splits.train, splits.test


def read_splits(cfg: Config) -> Splits:
    """The training and held-out prompts of ``cfg.data`` as the module docstring says;
    InputError naming the key, file, row or field that cannot be used."""
    d = cfg.data
    sources = entries(d.source, "data.source")
    tests = entries(d.test_source, "data.test_source")
    if not sources:
        raise InputError("data.source is empty; expected embedded or a data path")
    if "embedded" in sources and len(sources) > 1:
        raise InputError(f"data.source = {source_name(d.source)!r}: embedded cannot be listed with data files")
    name = source_name(d.source)
    if sources == ["embedded"]:
        train, dropped = tasks.to_prompts(tasks.generate(d.families, d.train_size, d.seed, "train", d.difficulty), "train"), None
        if not tests:
            test = tasks.to_prompts(tasks.generate(d.families, d.test_size, d.seed, "test", d.difficulty), "test")
            how = "the embedded test split, disjoint from training by a hash of each question"
            return Splits(train, test, name, name, _line(name, train, test, how))
    else:
        train, dropped = read_prompts(sources, d, TRAIN_SPLITS)
    if tests:
        test, test_dropped = read_prompts(tests, d, TEST_SPLITS)
        test_name = source_name(d.test_source)
        how = f"data.test_source {test_name}{_shared(train, test)}"
        notes = _dedupe_note(d, dropped, test_dropped, "data.test_source")
        return Splits(train, test, name, test_name, _line(name, train, test, how) + notes)
    split = _test_split(sources)
    if split:
        test_name = f"{sources[0]}:{split}"
        test, test_dropped = read_prompts([test_name], d, ())
        how = f"its {split!r} split{_shared(train, test)}"
        notes = _dedupe_note(d, dropped, test_dropped, f"the {split!r} split")
        return Splits(train, test, f"{sources[0]}:train", test_name, _line(f"{name}:train", train, test, how) + notes)
    return _hold_out(train, cfg, name, dropped)


def prompt_identity(prompt: Prompt) -> str:
    """What makes two prompts the same for de-duplication and the held-out split: the text
    (of a message list, each message's role and content), Unicode NFC, whitespace collapsed."""
    if isinstance(prompt.text, str):
        text = prompt.text
    else:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in prompt.text)
    return " ".join(unicodedata.normalize("NFC", text).split())


def dedupe(prompts: list[Prompt]) -> list[Prompt]:
    """``prompts`` without the rows whose :func:`prompt_identity` an earlier row has (the
    first copy is kept, in order)."""
    seen: set[str] = set()
    kept = []
    for p in prompts:
        key = prompt_identity(p)
        if key not in seen:
            seen.add(key)
            kept.append(p)
    return kept


def read_prompts(paths: list[str], d: DataConfig, prefer: tuple[str, ...]) -> tuple[list[Prompt], int]:
    """The prompts of ``paths`` in order, de-duplicated with data.dedupe; (prompts, rows dropped)."""
    prompts = [p for path in paths for p in load_prompts(path, d.prompt_key, d.answer_key, d.id_key, d.source_key, prefer)]
    if not d.dedupe:
        return prompts, 0
    kept = dedupe(prompts)
    return kept, len(prompts) - len(kept)


def _test_split(sources: list[str]) -> str:
    """The held-out split of a data.source that is one DatasetDict holding a 'train' split
    and a 'test' or 'validation' one, named by no split; else ''."""
    if len(sources) != 1:
        return ""
    location = locate(sources[0], "data.source")
    if location.kind != "dataset_dict" or location.split or TRAIN_SPLITS[0] not in location.splits:
        return ""
    return next((s for s in TEST_SPLITS if s in location.splits), "")


def _hold_out(rows: list[Prompt], cfg: Config, name: str, dropped: int) -> Splits:
    """data.holdout distinct prompts of ``rows`` held out (one row each, the first copy) by a
    hash of their identity seeded by data.seed; the training rows are those of every other prompt."""
    d = cfg.data
    if d.holdout < 0:
        raise InputError(f"data.holdout = {d.holdout}: must be >= 0 (0: eval.n_prompts)")
    wanted = d.holdout or cfg.eval.n_prompts
    said = f"data.holdout = {d.holdout}" if d.holdout else f"eval.n_prompts = {wanted} (data.holdout = 0)"
    keys = [prompt_identity(p) for p in rows]
    first: dict[str, Prompt] = {}
    for key, p in zip(keys, rows):
        first.setdefault(key, p)
    distinct = len(first)
    if 2 * wanted > distinct:
        raise InputError(
            f"data.source = {name!r} has {distinct} distinct prompts ({len(rows)} rows): holding out {said} "
            f"would leave {max(distinct - wanted, 0)} to train on, fewer than it holds out; "
            "lower data.holdout or give data.test_source")
    order = sorted(first, key=lambda key: hashlib.sha256(f"{d.seed}\n{key}".encode()).digest())
    held = set(order[:wanted])
    test = [p for key, p in first.items() if key in held]
    train = [p for key, p in zip(keys, rows) if key not in held]
    copies = len(rows) - len(train) - len(test)
    how = (f"{wanted} of its {distinct} distinct prompts, picked by a hash of the prompt text with data.seed = {d.seed}"
           + (f"; their {copies} other rows are not trained on" if copies else "")
           + ": no prompt is in both splits")
    notes = f"; data.dedupe dropped {dropped} repeated rows" if d.dedupe else ""
    return Splits(train, test, name, f"the held-out prompts of {name}", _line(name, train, test, how) + notes)


def _line(name: str, train: list[Prompt], test: list[Prompt], how: str) -> str:
    return f"{name}: {len(train)} training prompts, {len(test)} held out ({how})"


def _shared(train: list[Prompt], test: list[Prompt]) -> str:
    """What to know of a held-out set given whole: how many of its distinct prompts also occur
    among the training rows, and whether it repeats prompts (eval.n_prompts counts rows)."""
    seen = {prompt_identity(p) for p in train}
    keys = {prompt_identity(p) for p in test}
    shared = len(keys & seen)
    notes = f"; {shared} of its distinct prompts also occur in the training rows" if shared else ""
    if len(keys) < len(test):
        notes += f"; its {len(test)} rows hold {len(keys)} distinct prompts (data.dedupe=true keeps one row of each)"
    return notes


def _dedupe_note(d: DataConfig, dropped: int | None, test_dropped: int, test_name: str) -> str:
    """What data.dedupe dropped ('' without it); ``dropped`` None: data.source is embedded."""
    if not d.dedupe:
        return ""
    if dropped is None:
        return f"; data.dedupe dropped {test_dropped} repeated rows of {test_name}"
    return f"; data.dedupe dropped {dropped} repeated rows of data.source and {test_dropped} of {test_name}"


@dataclass(frozen=True)
class PromptTokens:
    """The token ids of a list of prompts, after ``data.truncation`` (:func:`tokenize_prompts`)."""

    prompts: list[Prompt]
    """The prompts kept, in order (``drop`` leaves some out): ``ids[i]`` is ``prompts[i]``'s."""
    ids: list[list[int]]
    """Token ids of each kept prompt, as the model sees it."""
    limit: int
    """The most tokens a prompt may have: data.max_prompt_len, or the model's context less
    the response limit when that is smaller."""
    truncated: int = 0
    """Prompts cut to their last ``limit`` tokens (``data.truncation=left``)."""
    dropped: int = 0
    """Prompts left out (``data.truncation=drop``)."""

    @property
    def longest(self) -> int:
        """Tokens of the longest kept prompt."""
        return max(map(len, self.ids), default=0)

    def note(self, source: str) -> str:
        """What data.truncation did to the prompts of ``source``, in one line; '' when nothing."""
        total = len(self.prompts) + self.dropped
        if self.truncated:
            return (f"data.truncation=left: {self.truncated} of {total} prompts of {source} were longer than "
                    f"{self.limit} tokens and are cut to {self.limit}, keeping their end")
        if self.dropped:
            return (f"data.truncation=drop: {self.dropped} of {total} prompts of {source} were longer than "
                    f"{self.limit} tokens and are left out")
        return ""


def tokenize_prompts(prompts: list[Prompt], tokenizer, cfg: Config, context: int, source: str,
                     held_out: bool = False) -> PromptTokens:
    """Token ids of each prompt as the model sees it (:func:`encode_prompts`), each within the
    longest prompt the run allows: ``data.max_prompt_len`` tokens, and no more than the model's
    ``context`` (its max_position_embeddings) less the response limit, ``rollout.max_new_tokens``
    (``held_out``: the held-out prompts, whose limit is ``eval.max_new_tokens`` when set).

    A longer prompt is handled by ``data.truncation``: ``error``, an InputError naming the
    prompt, ``source`` (where the prompts come from), its length, the limit and the key to
    change; ``left``, its last tokens are kept, and its first one too when that is the
    tokenizer's BOS (the start of every sequence the model has seen, and of every chat
    template that writes one); ``drop``, it is left out. The result counts both.
    """
    d = cfg.data
    key, max_new = response_limit(cfg, held_out)
    room = context - max_new
    if room < 1:
        raise InputError(f"{key} = {max_new}: leaves no room for a prompt in the model's context of {context} tokens "
                         f"(max_position_embeddings); lower {key}")
    limit = min(d.max_prompt_len, room)
    bos = getattr(tokenizer, "bos_token_id", None)
    kept, ids, truncated = [], [], 0
    for p, row in zip(prompts, encode_prompts(prompts, tokenizer)):
        if len(row) > limit:
            if d.truncation == "error":
                raise InputError(_too_long(p, source, len(row), cfg, key, max_new, context))
            if d.truncation == "drop":
                continue
            row = [bos] + row[len(row) - limit + 1:] if bos is not None and row[0] == bos and limit > 1 else row[-limit:]
            truncated += 1
        kept.append(p)
        ids.append(row)
    if prompts and not kept:
        raise InputError(f"data.truncation=drop: all {len(prompts)} prompts of {source} are longer than {limit} tokens "
                         f"(data.max_prompt_len = {d.max_prompt_len}, {key} = {max_new}, context {context}); "
                         f"raise data.max_prompt_len or lower {key}")
    return PromptTokens(kept, ids, limit, truncated, len(prompts) - len(kept))


def encode_prompts(prompts: list[Prompt], tokenizer) -> list[list[int]]:
    """Token ids of the text of each prompt (:func:`~reasonrl.data.datasets.render_prompt`).

    A chat template is applied once: its text already holds every special token the model
    expects (Llama 3's ``<|begin_of_text|>``), so it is tokenised with
    ``add_special_tokens=False``, as ``apply_chat_template(tokenize=True)`` does. A plain-text
    prompt, and the ``role: content`` lines of messages without a template, get the
    tokenizer's own special tokens (a BOS where the tokenizer adds one), as any text the model
    was trained on."""
    templated = [isinstance(p.text, list) and bool(getattr(tokenizer, "chat_template", None)) for p in prompts]
    texts = [render_prompt(p, tokenizer) for p in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    for special in (False, True):
        rows = [i for i, t in enumerate(templated) if t != special]
        if rows:
            encoded = tokenizer([texts[i] for i in rows], add_special_tokens=special, return_attention_mask=False,
                                return_token_type_ids=False)["input_ids"]  # ids only: a quarter less time
            for i, row in zip(rows, encoded):
                ids[i] = list(row)
    return ids


def response_limit(cfg: Config, held_out: bool = False) -> tuple[str, int]:
    """(key, tokens) of the longest response sampled for a prompt: ``rollout.max_new_tokens``;
    for held-out prompts ``eval.max_new_tokens`` when set."""
    if held_out and cfg.eval.max_new_tokens:
        return "eval.max_new_tokens", cfg.eval.max_new_tokens
    return "rollout.max_new_tokens", cfg.rollout.max_new_tokens


def _too_long(p: Prompt, source: str, length: int, cfg: Config, key: str, max_new: int, context: int) -> str:
    """The InputError message for a prompt of ``length`` tokens over the limit (data.truncation=error)."""
    where = f"prompt {p.id} of {source} has {length} tokens"
    fix = "or set data.truncation=left (keep its last tokens) or drop (leave it out)"
    if length > cfg.data.max_prompt_len:
        return f"data.max_prompt_len = {cfg.data.max_prompt_len}: {where}, more than that; raise data.max_prompt_len, {fix}"
    return (f"{key} = {max_new}: {where}, and {length} + {max_new} exceeds the model's context of {context} tokens "
            f"(max_position_embeddings); lower {key}, {fix}")
