"""Prompt data in the layouts users bring, read by one loader into ``Prompt`` rows.

    prompts = load_prompts("data/dapo-math-17k.parquet", answer_key="reward_model.ground_truth")

Formats (``reasonrl.data.sources`` says where a path points; pyarrow reads the tables, so
Hugging Face ``datasets`` is not needed):

- ``.jsonl``: one JSON object a line (ROLL's layout, or verl rows);
- ``.json``: a JSON array of row objects, or JSON lines (what ``Dataset.to_json`` writes);
- ``.parquet``: verl/DAPO parquet, nested ``reward_model`` and ``extra_info`` columns included;
- ``.arrow``: an Arrow IPC stream (as ``datasets`` writes its shards) or file;
- a directory written by ``Dataset.save_to_disk`` (its shards in the order state.json lists
  them), or by ``DatasetDict.save_to_disk`` with the split that ``DIR:SPLIT`` names, else the
  first of ``prefer`` it holds, else its only split.

Every row becomes a ``Prompt`` through the column mapping (``data.prompt_key``,
``data.answer_key``, ``data.id_key``, ``data.source_key``):

- ``text``: the value under the prompt key; a list of chat messages, or a string that
  parses as a JSON list of messages (ROLL's ``messages`` column), stays a message list,
  any other string is the prompt text.
- ``ground_truth``: the value under the answer key (a dotted path such as
  ``reward_model.ground_truth``), falling back to ``reward_model.ground_truth`` (verl
  layout); numbers become strings (an integral float ``3.0`` becomes ``"3"``).
- ``id``: the value under the id key; without one, the row's ``id``, else
  ``extra_info.index`` (verl), else the 0-based row number.
- ``data_source``: the value under the source key; without one, ``data_source``, else
  ``source``, else ``tag``, else the file's (or dataset directory's) name.
- ``extra``: every other top-level field (pandas index columns are dropped).

Errors name the file, the 1-based line (JSONL, JSON lines) or row (the other formats; the
shard file for a saved dataset), the field and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from reasonrl.data.sources import TRAIN_SPLITS, Location, locate, pick_split, read_json
from reasonrl.errors import InputError, InputNotFound
from reasonrl.types import Prompt

VERL_ANSWER_KEY = "reward_model.ground_truth"
MAX_PROMPT_CHARS = 1_000_000
"""The longest prompt a row may have, in characters (its messages' contents together): some
250k tokens at four characters a token, past any context a prompt is kept at. A longer one is
refused by row before a tokenizer spends minutes on it."""
_SOURCE_KEYS = ("data_source", "source", "tag")
_PANDAS_INDEX = "__index_level_"
"""The prefix of the index columns pandas writes into parquet, which no row means as data."""
_MISSING = object()


@dataclass(frozen=True)
class _Columns:
    """The column mapping: where a row keeps each part of its Prompt ('' for id and source:
    the defaults of the module docstring)."""

    prompt: str
    answer: str
    id: str
    source: str


def load_prompts(
    path: str,
    prompt_key: str = "prompt",
    answer_key: str = "ground_truth",
    id_key: str = "",
    source_key: str = "",
    prefer: tuple[str, ...] = TRAIN_SPLITS,
) -> list[Prompt]:
    """All prompts at ``path`` (a file, a saved dataset directory or ``DIR:SPLIT``), in order.

    ``prefer``: the DatasetDict splits to read, in order, when the path names none
    (``sources.TRAIN_SPLITS`` or ``sources.TEST_SPLITS``); the keys are the column mapping of
    the module docstring. InputError / InputNotFound naming the file, row and field.
    """
    location = locate(path)
    columns = _Columns(prompt_key, answer_key, id_key, source_key)
    saved = location.kind in ("dataset", "dataset_dict")
    stem = location.path.name if saved else location.path.stem
    prompts = [
        _to_prompt(row, index, where, columns, stem)
        for index, (where, row) in enumerate(_rows(location, prefer))
    ]
    if not prompts:
        raise InputError(f"{location.path}: the {'dataset' if saved else 'file'} has no rows; expected at least one prompt")
    return prompts


def render_prompt(prompt: Prompt, tokenizer: Any) -> str:
    """The text to feed the model for ``prompt``.

    A plain-text prompt is returned as is. Messages go through the tokenizer's chat
    template (with the generation prompt) when it has one, else become ``role: content``
    lines followed by ``assistant: ``. A chat template's text already holds the special
    tokens the model expects (a BOS the template writes): tokenise it with
    ``add_special_tokens=False`` (:func:`reasonrl.data.splits.encode_prompts` does).
    """
    if isinstance(prompt.text, str):
        return prompt.text
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt.text, tokenize=False, add_generation_prompt=True)
    lines = [f"{m['role']}: {m['content']}" for m in prompt.text]
    return "\n".join(lines + ["assistant: "])


def _rows(location: Location, prefer: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each row at ``location``; ``where`` names the file and the line or row."""
    file = location.path
    if location.kind == "jsonl":
        return _json_lines(file, "one JSON object per line")
    if location.kind == "json":
        return _json_rows(file)
    if location.kind == "parquet":
        return _table_rows(file, _read_parquet(file))
    if location.kind == "arrow":
        return _table_rows(file, _read_arrow(file))
    directory = file / pick_split(location, prefer) if location.kind == "dataset_dict" else file
    return _dataset_rows(directory)


def _json_lines(file: Path, expected: str) -> Iterator[tuple[str, Any]]:
    """``("FILE line N", object)`` for each non-blank line."""
    with file.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{file} line {lineno}"
            try:
                yield where, json.loads(raw)
            except ValueError as e:
                raise InputError(f"{where}: invalid JSON ({e}); expected {expected}") from None


def _json_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """A ``.json`` file: ``("FILE row N", item)`` of a JSON array, else its JSON lines."""
    data = file.read_bytes()
    if not data.lstrip().startswith(b"["):
        yield from _json_lines(file, "a JSON array of row objects, or one JSON object per line")
        return
    try:
        items = json.loads(data)
    except json.JSONDecodeError as e:
        raise InputError(f"{file} line {e.lineno}: invalid JSON ({e.msg}); expected a JSON array of row objects") from None
    except ValueError as e:
        raise InputError(f"{file}: invalid JSON ({e}); expected a JSON array of row objects") from None
    for number, item in enumerate(items, start=1):
        yield f"{file} row {number}", item


def _read_parquet(file: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{file}: cannot read as parquet ({e})") from None


def _read_arrow(file: Path):
    """An Arrow IPC stream (what datasets writes) or IPC file, read whole."""
    import pyarrow as pa

    try:
        buffer = pa.py_buffer(file.read_bytes())
        try:
            return pa.ipc.open_stream(buffer).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(buffer).read_all()
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{file}: cannot read as Arrow IPC, stream or file ({e})") from None


def _table_rows(file: Path, table) -> Iterator[tuple[str, dict]]:
    """``("FILE row N", dict)`` for each row, 1-based."""
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{file} row {number}", row


def _dataset_rows(directory: Path) -> Iterator[tuple[str, dict]]:
    """The rows of a saved Dataset directory: its shards in the order its state.json lists them."""
    state_file = directory / "state.json"
    if not state_file.is_file():
        raise InputNotFound(f"{directory}: no state.json; expected a directory written by datasets' save_to_disk")
    state = read_json(state_file)
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not (isinstance(files, list) and all(isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files)):
        raise InputError(f"{state_file}: expected \"_data_files\": [{{\"filename\": ...}}] as datasets' save_to_disk writes it")
    for entry in files:
        shard = directory / entry["filename"]
        if not shard.is_file():
            raise InputNotFound(f"{state_file}: lists {entry['filename']}, which is not there")
        yield from _table_rows(shard, _read_arrow(shard))


def _to_prompt(row: Any, index: int, where: str, columns: _Columns, stem: str) -> Prompt:
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    text = _prompt_text(_field(row, columns.prompt, where, ()), where, columns.prompt)
    chars = len(text) if isinstance(text, str) else sum(len(m["content"]) for m in text)
    if chars > MAX_PROMPT_CHARS:
        raise InputError(f"{where}: field {columns.prompt!r} holds a prompt of {chars:,} characters, more than the "
                         f"{MAX_PROMPT_CHARS:,} a prompt may have (MAX_PROMPT_CHARS of reasonrl/data/datasets.py)")
    answer_keys = (columns.answer,) if columns.answer == VERL_ANSWER_KEY else (columns.answer, VERL_ANSWER_KEY)
    used_key, answer = _first_field(row, answer_keys, where)
    ground_truth = _ground_truth(answer, where, used_key)
    row_id = _field(row, columns.id, where, ()) if columns.id else _row_id(row, index)
    if columns.source:
        source_key, source = columns.source, _field(row, columns.source, where, ())
        if not isinstance(source, str):
            raise InputError(f"{where}: field {source_key!r} is a {type(source).__name__} ({_short(source)}); "
                             "expected a string naming the data source")
    else:
        source_key = next((k for k in _SOURCE_KEYS if isinstance(row.get(k), str)), None)
        source = row[source_key] if source_key else stem
    consumed = {columns.prompt, used_key, columns.id or "id", source_key}
    return Prompt(
        id=str(row_id),
        text=text,
        ground_truth=ground_truth,
        data_source=source,
        extra={k: v for k, v in row.items() if k not in consumed and not k.startswith(_PANDAS_INDEX)},
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
