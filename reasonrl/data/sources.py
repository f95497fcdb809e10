"""Where prompt data is: a config value (``data.source``, ``data.test_source``) to checked paths.

    for text in entries(cfg.data.source, "data.source"):   # a glob becomes its matches
        location = locate(text, "data.source")              # InputError / InputNotFound naming the key

A value is one path or a list of them; each is a ``.jsonl``, ``.json``, ``.parquet`` or
``.arrow`` file, a directory written by Hugging Face ``datasets``' ``save_to_disk`` (a
``Dataset``: ``state.json`` and its ``data-*.arrow`` shards; a ``DatasetDict``:
``dataset_dict.json`` and a directory per split), ``DIR:SPLIT`` for one split of a
``DatasetDict``, or a glob pattern. Nothing is read but the directories' small JSON metadata,
and nothing heavy is imported, so a mistyped path fails at once.
"""

from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from reasonrl.errors import InputError, InputNotFound

SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")
EXPECTED = "a .jsonl, .json, .parquet or .arrow file, or a directory written by datasets' save_to_disk"
"""What a data path may be, in words, for messages."""
TRAIN_SPLITS = ("train",)
"""The split of a DatasetDict that training data comes from when the path names none."""
TEST_SPLITS = ("test", "validation")
"""The splits of a DatasetDict that held-out data comes from when the path names none, in order."""
_GLOB = re.compile(r"[*?[]")


@dataclass(frozen=True)
class Location:
    """One checked place that prompts come from."""

    path: Path
    kind: str
    """'jsonl', 'json', 'parquet', 'arrow' (a file of that type), 'dataset' (a saved Dataset
    directory) or 'dataset_dict' (a saved DatasetDict directory)."""
    split: str = ""
    """'dataset_dict': the split that ``DIR:SPLIT`` named; empty: chosen by :func:`pick_split`."""
    splits: tuple[str, ...] = ()
    """'dataset_dict': the splits it holds, as dataset_dict.json lists them."""


def entries(value: str | tuple[str, ...], key: str) -> list[str]:
    """The paths of a config value: a string is one path ('' none), a tuple several; a glob
    pattern that is not itself a path becomes its matches, sorted (InputNotFound naming ``key``
    when it matches nothing)."""
    out: list[str] = []
    for text in (value,) if isinstance(value, str) else value:
        if not text:
            continue
        if _GLOB.search(text) and not Path(text).exists():
            matches = sorted(glob.glob(text))
            if not matches:
                raise InputNotFound(f"{key} = {text!r}: no file matches this pattern (expected {EXPECTED})")
            out += matches
        else:
            out.append(text)
    return out


def source_name(value: str | tuple[str, ...]) -> str:
    """A config value for messages: the path as given, or the first paths of a list."""
    items = [value] if isinstance(value, str) else list(value)
    if len(items) <= 3:
        return ", ".join(items)
    return f"{items[0]}, {items[1]} and {len(items) - 2} more"


def locate(text: str, key: str = "") -> Location:
    """The Location of one path (``DIR:SPLIT`` included); InputNotFound when it does not
    exist, InputError when it is not something prompts can be read from. Messages start with
    ``key = 'text'`` when a key is given, else with the path."""
    name = f"{key} = {text!r}" if key else text
    path = Path(text)
    if path.is_dir():
        return _saved_dataset(path, name)
    if path.is_file():
        _check_suffix(path, name)
        return Location(path, path.suffix[1:])
    head, colon, split = text.rpartition(":")
    if colon and split and Path(head).is_dir():
        location = _saved_dataset(Path(head), name)
        if location.kind != "dataset_dict":
            raise InputError(f"{name}: {head} is a saved Dataset, which has no splits; give the directory alone")
        if split not in location.splits:
            raise InputError(f"{name}: {head} has no split {split!r}; its splits are {list(location.splits)}")
        return replace(location, split=split)
    if path.suffix:
        _check_suffix(path, name)
        raise InputNotFound(f"{name}: no such file (expected {EXPECTED})")
    raise InputNotFound(f"{name}: no such file or directory (expected {EXPECTED})")


def pick_split(location: Location, prefer: tuple[str, ...]) -> str:
    """The split of a 'dataset_dict' Location to read: the one its path named, else the first
    of ``prefer`` it holds, else its only split; InputError when none of these is there."""
    if location.split:
        return location.split
    for split in prefer:
        if split in location.splits:
            return split
    if len(location.splits) == 1:
        return location.splits[0]
    wanted = " or ".join(repr(s) for s in prefer)
    raise InputError(f"{location.path}: a DatasetDict with splits {list(location.splits)} and no {wanted} split; "
                     f"name one as {location.path}:SPLIT")


def _check_suffix(path: Path, name: str) -> None:
    if path.suffix not in SUFFIXES:
        raise InputError(f"{name}: unsupported file type {path.suffix!r}; expected {EXPECTED}")


def _saved_dataset(path: Path, name: str) -> Location:
    """A directory written by save_to_disk: a DatasetDict (dataset_dict.json) or a Dataset (state.json)."""
    index = path / "dataset_dict.json"
    if index.is_file():
        meta = read_json(index)
        splits = meta.get("splits") if isinstance(meta, dict) else None
        if not (isinstance(splits, list) and splits and all(isinstance(s, str) and s for s in splits)):
            raise InputError(f"{index}: expected {{\"splits\": [names...]}} as datasets' save_to_disk writes it")
        return Location(path, "dataset_dict", splits=tuple(splits))
    if (path / "state.json").is_file():
        return Location(path, "dataset")
    raise InputError(f"{name}: a directory without the dataset_dict.json or state.json that datasets' save_to_disk "
                     f"writes; expected {EXPECTED} (for a directory of data files, give a glob such as "
                     f"{str(path / '*.parquet')!r})")


def read_json(file: Path) -> object:
    """The JSON value of a metadata file; InputError naming it when it is not JSON."""
    try:
        return json.loads(file.read_bytes())
    except (OSError, ValueError) as err:
        raise InputError(f"{file}: cannot read it as JSON ({err})") from None
