"""The docs cannot drift from the code: every ``reasonrl ...`` command in a code block of README.md
and docs/*.md parses (a train line also passes ``--dry-run``'s checks, all but a missing file or
plugin of the reader's own that the line names), every config key named in backticks exists, and
the config reference page is written from the schema's docstrings."""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from reasonrl import cli
from reasonrl.config import ConfigError, keys_help, load_recipe
from reasonrl.config import loader as config_loader
from reasonrl.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".py", ".md", ".pt", ".safetensors", ".parquet", ".txt", ".html", ".png")


@dataclass(frozen=True)
class Command:
    """One ``reasonrl`` command line of a doc's code block."""

    where: str  # file:line
    argv: tuple[str, ...]  # after "reasonrl"


def commands(text: str, name: str) -> list[Command]:
    """The ``reasonrl ...`` lines inside fenced code blocks, with ``\\`` continuations joined,
    trailing comments cut, a ``$ `` prompt or ``.venv/bin/`` prefix dropped and shell variables
    (``$S``) read as 0. A line whose subcommand ends with ``:`` is program output, not a command."""
    found, in_block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        stripped = line.strip()
        if not pending:
            stripped = re.sub(r"^(\$ )?(\.venv/bin/)?", "", stripped)
            if not stripped.startswith("reasonrl "):
                continue
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        words = shlex.split(re.sub(r"\$\{?\w+\}?", "0", pending + stripped), comments=True)
        pending = ""
        if len(words) > 1 and not words[1].endswith(":"):
            found.append(Command(f"{name}:{start}", tuple(words[1:])))
    return found


def _own_files(argv: tuple[str, ...]) -> set[str]:
    """The values a line gives that a reader supplies (paths, plugins): a check that fails only on
    one of them is the reader's to satisfy."""
    values = {word.split("=", 1)[1] for word in argv if "=" in word}
    values |= {argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("--model", "--data")}
    return {value.split(":")[0] for value in values} | values


def check_command(command: Command) -> str | None:
    """None when ``command`` parses and its config loads (a train line: and passes ``--dry-run``,
    whose run directory, relative, lies under the working directory); otherwise what is wrong,
    naming the doc's file and line."""
    try:
        args = cli.parse_args(list(command.argv))
    except SystemExit as exit:
        if exit.code == 0:  # --version, --help
            return None
        return f"{command.where}: `reasonrl {' '.join(command.argv)}` does not parse"
    overrides = list(getattr(args, "overrides", []) or [])
    try:
        if args.command in ("train", "eval", "config", "sft"):
            cfg = load_recipe(args.recipe, overrides)
        elif args.command in ("demo", "drill"):
            load_recipe("dapo", overrides)
    except ConfigError as err:
        return f"{command.where}: `reasonrl {' '.join(command.argv)}`: {err}"
    if args.command != "train":
        return None
    from reasonrl.preflight import preflight

    try:
        preflight(cfg)
    except (InputError, ConfigError) as err:
        if any(value and value in str(err) for value in _own_files(command.argv)):
            return None
        return f"{command.where}: `reasonrl {' '.join(command.argv)} --dry-run`: {err}"
    return None


KEY_TOKEN = re.compile(r"(?<![\w./<>*-])([a-z_]+(?:\.(?:[a-z_0-9]+|<\w+>|\*))+)(?=[=\s\]|,)]|$)")


def unknown_keys(text: str, name: str) -> list[str]:
    """Backticked dotted names of a doc whose first part is a config section but that name no
    key: ``<placeholder>`` matches any part, ``x.*`` any key under ``x``, a key of mapping type
    any name below it, and file names (``model.safetensors``) are not keys."""
    helps = keys_help()
    keys = {k.key for k in helps}
    mappings = {k.key for k in helps if k.type == "mapping"}
    sections = {key.split(".")[0] for key in keys}
    bad = []
    for number, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            for token in KEY_TOKEN.findall(span):
                if token.split(".")[0] not in sections or token.endswith(FILE_SUFFIXES):
                    continue
                pattern = re.compile("^" + r"\.".join(
                    r"[^.]+" if part.startswith("<") else r".+" if part == "*" else re.escape(part)
                    for part in token.split(".")) + r"(\..+)?$")
                if any(pattern.match(key) for key in keys):
                    continue
                if any(token.startswith(mapping + ".") for mapping in mappings):
                    continue
                bad.append(f"{name}:{number}: `{token}` is no config key")
    return bad


DOC_COMMANDS = sorted({c.argv: c for path in DOCS for c in commands(path.read_text(encoding="utf-8"),
                                                                      str(path.relative_to(ROOT)))}.values(),
                      key=lambda c: c.where)


def test_the_docs_hold_commands_of_every_kind():
    kinds = {c.argv[0] for c in DOC_COMMANDS}
    assert {"train", "eval", "config", "sweep", "scale", "report"} <= kinds, kinds
    assert len(DOC_COMMANDS) >= 30


@pytest.mark.parametrize("command", DOC_COMMANDS, ids=lambda c: c.where)
def test_every_command_in_the_docs_parses(command, tmp_path, monkeypatch):
    for name in ("recipes", "sweeps"):  # the docs' commands run from a checkout's root
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    assert check_command(command) is None, check_command(command)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_config_key_the_docs_name_exists(path):
    assert unknown_keys(path.read_text(encoding="utf-8"), path.name) == []


DOC_WITH_ERRORS = """\
Set `train.total_steps` and `algo.eps_hgh`; `runtime.roles.<role>.cpus` is a pattern, `env.args.size` a mapping's.

```bash
reasonrl train dapo train.total_steps=5 --dry-run         # fine
reasonrl train dapo train.totl_steps=5                    # a misspelt key
reasonrl trian dapo                                       # a misspelt subcommand
reasonrl eval --model runs/x algo.eps_high=high           # a value of the wrong type
reasonrl train: error: this line is output
```
"""


def test_the_checks_catch_a_misspelt_key_subcommand_and_value(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert unknown_keys(DOC_WITH_ERRORS, "doc.md") == ["doc.md:1: `algo.eps_hgh` is no config key"]
    found = commands(DOC_WITH_ERRORS, "doc.md")
    assert [c.where for c in found] == ["doc.md:4", "doc.md:5", "doc.md:6", "doc.md:7"]
    problems = [check_command(c) for c in found]
    assert problems[0] is None
    assert "train.totl_steps" in problems[1] and problems[1].startswith("doc.md:5")
    assert "does not parse" in problems[2]
    assert "algo.eps_high" in problems[3]


def test_a_missing_file_of_the_readers_own_passes_but_a_missing_packaged_one_does_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = Command("doc.md:1", ("train", "dapo", "data.source=mine.jsonl"))
    assert check_command(own) is None
    missing_recipe = Command("doc.md:2", ("train", "dapo_nonexistent"))
    assert "no such recipe" in check_command(missing_recipe)


def test_the_config_reference_is_written_from_the_field_docstrings(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        gen_ref = importlib.import_module("gen_ref")
    finally:
        sys.path.remove(str(ROOT / "docs"))
    module = tmp_path / "tiny_schema.py"

    def page(help_text: str) -> str:
        module.write_text("from dataclasses import dataclass\n\n\n@dataclass\nclass Tiny:\n"
                          f"    steps: int = 3\n    \"\"\"{help_text}\"\"\"\n")
        sys.modules.pop("tiny_schema", None)
        tiny = importlib.import_module("tiny_schema").Tiny
        return gen_ref.config_page(list(config_loader._keys_help(tiny(), tiny(), "tiny.")))

    first, second = page("Steps to take."), page("How many steps the run takes.")
    assert "| `tiny.steps` | int | `3` |" in first and "Steps to take." in first
    assert "How many steps the run takes." in second and "Steps to take." not in second
    for key in keys_help()[:20]:
        assert key.help.split("\n")[0][:40].replace("|", "\\|") in gen_ref.config_page()


def test_the_readme_is_a_front_door_with_the_reports_picture():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert pictures and all((ROOT / picture).is_file() for picture in pictures), pictures
    assert (ROOT / pictures[0]).read_bytes().startswith(b"\x89PNG")
