"""Prompt files: JSONL (ROLL layout, or verl layout one object a line) and verl/DAPO parquet.

Every row becomes a ``Prompt``:

- ``text``: the value under ``prompt_key``; a list of chat messages, or a string that
  parses as a JSON list of messages (ROLL's ``messages`` column), stays a message list,
  any other string is the prompt text.
- ``ground_truth``: the value under ``answer_key`` (a dotted path such as
  ``reward_model.ground_truth``), falling back to ``reward_model.ground_truth`` (verl
  layout); numbers become strings (an integral float ``3.0`` becomes ``"3"``).
- ``id``: the row's ``id``, else ``extra_info.index`` (verl), else the 0-based row number.
- ``data_source``: ``data_source``, else ``source``, else ``tag``, else the file's stem.
- ``extra``: every other top-level field (pandas index columns are dropped).

Errors name the file, the 1-based line (JSONL) or row (parquet), the field and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from reasonrl.errors import InputError, InputNotFound
from reasonrl.types import Prompt

SUFFIXES = (".jsonl", ".parquet")
VERL_ANSWER_KEY = "reward_model.ground_truth"
_SOURCE_KEYS = ("data_source", "source", "tag")
_MISSING = object()


def load_prompts(path: str, prompt_key: str = "prompt", answer_key: str = "ground_truth") -> list[Prompt]:
    """All prompts of a ``.jsonl`` or ``.parquet`` file, in file order."""
    file = Path(path)
    if file.suffix not in SUFFIXES:
        raise InputError(f"{file}: unsupported file type {file.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    if not file.is_file():
        raise InputNotFound(f"{file}: no such prompt file")
    rows = _jsonl_rows(file) if file.suffix == ".jsonl" else _parquet_rows(file)
    prompts = [
        _to_prompt(row, index, f"{file} {where}", prompt_key, answer_key, file.stem)
        for index, (where, row) in enumerate(rows)
    ]
    if not prompts:
        raise InputError(f"{file}: the file has no rows; expected at least one prompt")
    return prompts


def render_prompt(prompt: Prompt, tokenizer: Any) -> str:
    """The text to feed the model for ``prompt``.

    A plain-text prompt is returned as is. Messages go through the tokenizer's chat
    template (with the generation prompt) when it has one, else become ``role: content``
    lines followed by ``assistant: ``.
    """
    if isinstance(prompt.text, str):
        return prompt.text
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt.text, tokenize=False, add_generation_prompt=True)
    lines = [f"{m['role']}: {m['content']}" for m in prompt.text]
    return "\n".join(lines + ["assistant: "])


def _jsonl_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """``("line N", object)`` for each non-blank line."""
    with file.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"line {lineno}"
            try:
                yield where, json.loads(raw)
            except ValueError as e:
                message = f"{file} {where}: invalid JSON ({e}); expected one JSON object per line"
                raise InputError(message) from None


def _parquet_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """``("row N", dict)`` for each row, 1-based, without pandas index columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{file}: cannot read as parquet ({e})") from None
    keep = [name for name in table.column_names if not name.startswith("__index_level_")]
    for number, row in enumerate(table.select(keep).to_pylist(), start=1):
        yield f"row {number}", row


def _to_prompt(row: Any, index: int, where: str, prompt_key: str, answer_key: str, stem: str) -> Prompt:
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    text = _prompt_text(_field(row, prompt_key, where, ()), where, prompt_key)
    answer_keys = (answer_key,) if answer_key == VERL_ANSWER_KEY else (answer_key, VERL_ANSWER_KEY)
    used_key, answer = _first_field(row, answer_keys, where)
    ground_truth = _ground_truth(answer, where, used_key)
    source_key = next((k for k in _SOURCE_KEYS if isinstance(row.get(k), str)), None)
    consumed = {prompt_key, used_key, "id", source_key}
    return Prompt(
        id=str(_row_id(row, index)),
        text=text,
        ground_truth=ground_truth,
        data_source=row[source_key] if source_key else stem,
        extra={k: v for k, v in row.items() if k not in consumed},
    )


def _field(row: dict, key: str, where: str, also_tried: tuple[str, ...]) -> Any:
    """The value at dotted ``key``; ValueError listing the row's fields when absent or null."""
    value = _lookup(row, key)
    if value is _MISSING or value is None:
        tried = "".join(f" (also tried {k!r})" for k in also_tried)
        state = "is null" if value is None else "is missing"
        raise InputError(f"{where}: field {key!r} {state}{tried}; the row has fields {sorted(row)}")
    return value


def _first_field(row: dict, keys: tuple[str, ...], where: str) -> tuple[str, Any]:
    """``(key, value)`` for the first of ``keys`` present in ``row``."""
    for key in keys:
        value = _lookup(row, key)
        if value is not _MISSING and value is not None:
            return key, value
    return keys[0], _field(row, keys[0], where, keys[1:])


def _lookup(row: dict, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _prompt_text(value: Any, where: str, key: str) -> str | list[dict[str, str]]:
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return _messages(parsed, where, key) if isinstance(parsed, list) else value
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _messages(value, where, key)
    raise InputError(
        f"{where}: field {key!r} is a {type(value).__name__}; expected a string or a list of chat messages"
    )


def _messages(items: list, where: str, key: str) -> list[dict[str, str]]:
    """Validated copies ``{"role", "content"}`` of chat messages."""
    if not items:
        raise InputError(f"{where}: field {key!r} is an empty message list; expected at least one message")
    out = []
    for i, m in enumerate(items):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InputError(
                f"{where}: field {key!r} message {i} is {_short(m)}; "
                'expected a list of {"role": str, "content": str} objects'
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _ground_truth(value: Any, where: str, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    raise InputError(
        f"{where}: field {key!r} is a {type(value).__name__} ({_short(value)}); expected a string or a number"
    )


def _row_id(row: dict, index: int) -> Any:
    for key in ("id", "extra_info.index"):
        value = _lookup(row, key)
        if value is not _MISSING and value is not None:
            return value
    return index


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
