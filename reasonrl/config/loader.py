"""Reading and writing the config tree: ``load`` (a YAML recipe plus dotted overrides, checked
by ``reasonrl.config.rules.validate``), ``dump``, ``config_hash`` and the key help."""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import inspect
import json
import os
import re
import textwrap
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Callable, Iterator, Literal, Sequence, Union, get_args, get_origin, get_type_hints

import yaml

from reasonrl.config.rules import validate
from reasonrl.config.schema import Config, ConfigError
from reasonrl.errors import WriteError


RECIPES = Path(__file__).resolve().parents[1] / "recipes"
"""The packaged recipes (reasonrl/recipes/*.yaml): ``dapo`` names reasonrl/recipes/dapo.yaml."""


def recipe_path(name: str | Path | None) -> Path | None:
    """A recipe path: a file at ``name``, else for a bare name like 'dapo' (or 'dapo.yaml') the
    packaged reasonrl/recipes/dapo.yaml, from any working directory; neither is a ConfigError
    that lists the recipe names. None stays None (the defaults)."""
    if name is None:
        return None
    name = str(name)
    path = Path(name)
    packaged = RECIPES / (name if name.endswith(".yaml") else f"{name}.yaml")
    if path.is_file():
        return path
    if path.name == name and packaged.is_file():  # a bare name, not a path
        return packaged
    if path.exists():
        return path  # a directory: load() says it cannot read it
    names = ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))
    raise ConfigError(f"{name}: no such recipe file, and no packaged recipe of that name (recipes: {names})")


def load_recipe(recipe: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """The Config of a recipe file or packaged recipe name (:func:`recipe_path`; None: the
    defaults) plus ``dotted.key=value`` overrides: what ``reasonrl train RECIPE k=v ...`` trains,
    checked by the same rules and refused with the same ConfigError messages (:func:`load`).
    Also ``Config.load``."""
    if isinstance(overrides, (str, bytes)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError(f"overrides: expected a list of 'dotted.key=value' strings, got {overrides!r}")
    return load(recipe_path(recipe), list(overrides))


Config.load = staticmethod(load_recipe)  # the schema may not import the loader, so the loader gives Config its load


def load(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """The validated Config of a YAML recipe (None: defaults only) plus ``dotted.key=value``
    overrides, applied in order after the recipe.

    The recipe holds sections of the tree (``algo:`` with ``eps_high: 0.28`` under it) or
    dotted keys (``algo.eps_high: 0.28``). An override value is YAML (``train.lr=3e-4``,
    ``algo.dual_clip=null``, ``data.families=[add,mul]``; a tuple also takes
    ``data.families=add,mul``); an override of a section (``algo={eps_high: 0.28}``) sets
    only the keys it names. Raises ConfigError.
    """
    leaves: dict[str, tuple[Any, str]] = {}
    if path is not None:
        _read_recipe(Path(path), leaves)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"command line: {item!r} is not an override of the form dotted.key=value")
        try:
            value = yaml.load(text, Loader=_Loader)
        except yaml.YAMLError as err:
            raise ConfigError(f"command line: {key} = {text!r}: not a YAML value ({_problem(err)})", key) from None
        _collect({key: value}, Config, "", lambda _: "command line", leaves)
    cfg = _build(Config, leaves, "")
    try:
        validate(cfg)
    except ConfigError as err:
        if err.key in leaves:
            raise ConfigError(f"{leaves[err.key][1]}: {err}", err.key) from None
        raise
    return cfg


def flatten(tree: dict[Any, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of a nested mapping (``to_dict``'s or config.yaml's shape:
    ``{"algo": {"eps_high": 0.28}}`` -> ``{"algo.eps_high": 0.28}``); an empty mapping is a leaf."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def to_dict(cfg: Any) -> dict[str, Any]:
    """The tree as nested plain dicts, tuples as lists (what ``dump`` writes)."""
    return {f.name: _plain(getattr(cfg, f.name)) for f in fields(cfg)}


@dataclass(frozen=True)
class KeyHelp:
    """One leaf key of the tree, as ``reasonrl config --keys`` lists it."""

    key: str
    """The dotted key (``algo.eps_high``)."""
    type: str
    """Its type in short (``float``, ``int | null``, ``grpo | dr_grpo | ...``, ``list[str]``)."""
    default: Any
    """The value when no recipe or override sets it (tuples as lists)."""
    help: str
    """The docstring written under the field."""
    value: Any
    """Its value in the config that was described (the default for the defaults)."""


def keys_help(cfg: Config | None = None) -> list[KeyHelp]:
    """Every leaf key of the tree in declaration order, with its type, default, help (the
    docstring under the field; empty only for a field that lacks one, which a test forbids)
    and its value in ``cfg`` (default: the defaults)."""
    return list(_keys_help(Config(), cfg or Config(), ""))


def _keys_help(defaults: Any, cfg: Any, prefix: str) -> Iterator[KeyHelp]:
    docs = field_docs(type(defaults))
    for name, tp in _field_types(type(defaults)).items():
        default, value = getattr(defaults, name), getattr(cfg, name)
        if is_dataclass(tp):
            yield from _keys_help(default, value, f"{prefix}{name}.")
        else:
            yield KeyHelp(prefix + name, _type_name(tp), _plain(default), docs.get(name, ""), _plain(value))


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal written right under the field} of a dataclass, read
    from its source (attribute docstrings, as Sphinx reads them)."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if is_dataclass(k)]):  # a subclass's help replaces its base's
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def read_yaml(text: str) -> Any:
    """``text`` parsed as recipes are (YAML 1.2 booleans and floats: ``3e-4`` is a number,
    ``yes`` a string); yaml.YAMLError when it is not YAML."""
    return yaml.load(text, Loader=_Loader)


def dump(cfg: Config, path: str | Path) -> None:
    """Write cfg as a YAML recipe that ``load`` reads back to an equal Config. The file is
    replaced atomically, so a crash never leaves half of it; WriteError naming it when it
    cannot be written (a full disk)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(dump_text(cfg), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        raise WriteError.of(path, err) from err


def dump_text(cfg: Config) -> str:
    """cfg as the YAML recipe ``dump`` writes (sections in declaration order)."""
    return yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=False, allow_unicode=True)


LOGGING_KEYS = ("run.dir", "run.progress", "run.log_every", "run.loggers", "run.log_samples", "run.keep_samples",
                "run.wandb_project", "run.wandb_mode", "eval.target")
"""Keys that change where and how a run logs, never what it trains (a resume may change them;
the report folds them away in a config diff)."""


RESUME_MAY_CHANGE = (*LOGGING_KEYS, "train.total_steps", "eval.every_steps", "checkpoint.every_steps",
                     "checkpoint.every_minutes", "checkpoint.keep", "checkpoint.final_retries", "resume", "run.threads",
                     "faults", "resilience", "runtime.roles")
"""The dotted keys (and sections) a resumed run may change: more total steps, another schedule,
another place to log; :func:`config_hash` leaves them out by default."""


def config_hash(cfg: Config, ignore: Sequence[str] = RESUME_MAY_CHANGE) -> str:
    """sha256 (hex) of the canonical JSON of ``to_dict(cfg)`` without the dotted keys in
    ``ignore``. A resume refuses a run directory whose hash differs; the default ``ignore``
    lists the keys a resumed run may change (more total steps, another schedule)."""
    tree = to_dict(cfg)
    for key in ignore:
        *sections, name = key.split(".")
        del functools.reduce(dict.__getitem__, sections, tree)[name]
    return hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- YAML with YAML 1.2 booleans and floats -----------------------------------------

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` with YAML 1.2 booleans (only true/false) and floats (``3e-4``)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL_TAG, _BOOL, list("tTfF"))
_Loader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """``yaml.safe_dump`` that also quotes the strings ``_Loader`` would read as floats, so
    both ``_Loader`` and plain ``yaml.safe_load`` read the file back unchanged."""


_Dumper.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


# --- loading ------------------------------------------------------------------------


def _read_recipe(path: Path, leaves: dict[str, tuple[Any, str]]) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the recipe ({err.strerror})") from None
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
                          f"{err.start}); a recipe is a UTF-8 YAML file") from None
    try:
        data = yaml.load(text, Loader=_Loader)
        lines = _key_lines(yaml.compose(text, Loader=_Loader), "", path, {})
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {_problem(err)}") from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of sections ({', '.join(_field_types(Config))}), "
                          f"got {type(data).__name__} {data!r}")
    _collect(data, Config, "", lambda key: f"{path}, line {lines[key]}" if key in lines else str(path), leaves)


def _problem(err: yaml.YAMLError) -> str:
    """The gist of a YAML error, without PyYAML's multi-line excerpt."""
    return getattr(err, "problem", None) or str(err)


def _key_lines(node: yaml.Node | None, prefix: str, path: Path, lines: dict[str, int]) -> dict[str, int]:
    """{dotted key: 1-based line} for every mapping key under node. A key given twice is an
    error (PyYAML would keep the last silently)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            line = key_node.start_mark.line + 1
            if key in lines:
                raise ConfigError(f"{path}, line {line}: {key} is given twice (first on line {lines[key]})", key)
            lines[key] = line
            _key_lines(value_node, key + ".", path, lines)
    return lines


def _collect(
    mapping: dict[Any, Any],
    cls: type,
    prefix: str,
    where: Callable[[str], str],
    leaves: dict[str, tuple[Any, str]],
) -> None:
    """Record each leaf of ``mapping`` (the keys of the section ``cls`` at dotted ``prefix``,
    or dotted paths below it) in ``leaves`` as {dotted key: (value, source)}, later ones
    replacing earlier ones. Unknown keys and sections given as non-mappings are errors."""
    types = _field_types(cls)
    for name, value in mapping.items():
        key = f"{prefix}{name}"
        head, _, rest = str(name).partition(".")
        tp = types.get(head)
        if tp is not None and rest and get_origin(tp) is dict:  # a key inside a mapping field
            field_key = prefix + head
            mapping_value = leaves[field_key][0] if isinstance(leaves.get(field_key, (None,))[0], dict) else {}
            leaves[field_key] = (_set_path(mapping_value, rest.split("."), value), where(key))
            continue
        if prefix + head in REPLACED_KEYS:
            raise ConfigError(f"{where(key)}: {key} is now {_replacement(key, prefix + head)}", key)
        if tp is None or (rest and not is_dataclass(tp)):
            match = difflib.get_close_matches(key, _dotted_keys(Config, ""), n=1)
            hint = f"did you mean {match[0]}?" if match else f"valid keys: {', '.join(prefix + n for n in types)}"
            raise ConfigError(f"{where(key)}: unknown key {key}; {hint}", key)
        if rest:
            _collect({rest: value}, tp, f"{prefix}{head}.", where, leaves)
        elif is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{where(key)}: {key} = {value!r}: {key} is a section and needs a mapping "
                                  f"of its keys ({', '.join(_field_types(tp))})", key)
            _collect(value, tp, key + ".", where, leaves)
        else:
            leaves[key] = (value, where(key))


REPLACED_KEYS: dict[str, str] = {
    "resilience.rollout_workers": "runtime.roles.rollout.count",
    "resilience.reward_workers": "runtime.roles.reward.count",
    "resilience.rollout_timeout_s": "runtime.roles.rollout.timeout_s",
    "resilience.reward_timeout_s": "runtime.roles.reward.timeout_s",
    "env.workers": "runtime.roles.env.count",
    "env.step_timeout_s": "runtime.roles.env.timeout_s",
    "rollout.threads": "runtime.roles.rollout.threads",
    "runtime.placement": "runtime.roles.<role>.cpus, .gpus, .count and .colocate",
}
"""Keys that moved under ``runtime.roles``: naming one is an error that names its new key."""


def _replacement(key: str, replaced: str) -> str:
    """The new key of ``key``, which is or lies under the replaced key ``replaced``
    (``runtime.placement.rollout.cpus`` -> ``runtime.roles.rollout.cpus``)."""
    if replaced == "runtime.placement" and key != replaced:
        return "runtime.roles." + key.removeprefix("runtime.placement.")
    return REPLACED_KEYS[replaced]


def _set_path(mapping: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``mapping`` with the nested key ``path`` set to ``value``."""
    head, *rest = path
    out = dict(mapping)
    out[head] = _set_path(out[head] if isinstance(out.get(head), dict) else {}, rest, value) if rest else value
    return out


def _build(cls: type, leaves: dict[str, tuple[Any, str]], prefix: str) -> Any:
    """An instance of ``cls`` with the recorded leaves below ``prefix`` type-checked, and the
    defaults elsewhere."""
    kwargs = {}
    for name, tp in _field_types(cls).items():
        key = prefix + name
        if is_dataclass(tp):
            kwargs[name] = _build(tp, leaves, key + ".")
        elif key in leaves:
            value, where = leaves[key]
            try:
                kwargs[name] = _convert(value, tp)
            except _Mismatch:
                raise ConfigError(f"{where}: {key} = {value!r}: expected {_describe(tp)}", key) from None
    return cls(**kwargs)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """{field name: resolved type hint} of a dataclass, in declaration order."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _dotted_keys(cls: type, prefix: str) -> list[str]:
    """Every dotted key of the tree under ``cls``, sections included."""
    keys = []
    for name, tp in _field_types(cls).items():
        keys.append(prefix + name)
        if is_dataclass(tp):
            keys += _dotted_keys(tp, f"{prefix}{name}.")
    return keys


# --- types --------------------------------------------------------------------------

_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


class _Mismatch(Exception):
    """A value that does not fit a field type (turned into a ConfigError by ``_build``)."""


def _convert(value: Any, tp: Any) -> Any:
    """``value`` checked against ``tp``: ints become floats for float fields, lists and
    comma-separated strings become tuples; anything else that does not fit (a bool for an
    int, 3.0 for an int, "yes" for a bool) raises _Mismatch."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        for arg in args:
            try:
                return _convert(value, arg)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value) or not _plain_data(value):
            raise _Mismatch
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            raise _Mismatch
        return tuple(_convert(item, args[0]) for item in value)
    if tp not in _SCALARS:
        raise TypeError(f"config field type {tp!r} is not supported by the loader")
    if tp is float and type(value) is int:
        return float(value)
    if type(value) is not tp:
        raise _Mismatch
    return value


def _plain_data(value: Any) -> bool:
    """Whether ``value`` is YAML data: scalars, lists and mappings with string keys."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_data(v) for k, v in value.items())
    if isinstance(value, list):
        return all(map(_plain_data, value))
    return value is None or type(value) in (bool, int, float, str)


def _describe(tp: Any) -> str:
    """What ``_convert`` accepts for ``tp``, in words."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        return " or ".join(map(_describe, args))
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple:
        return f"a list (or a comma-separated string) of items, each {_describe(args[0])}"
    if origin is dict:
        return "a mapping of names to values (YAML scalars, lists and mappings)"
    return _SCALARS[tp]


def _type_name(tp: Any) -> str:
    """``tp`` in short: ``float``, ``int | null``, ``hf | fast | vllm``, ``list[str]``."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        return " | ".join(map(_type_name, args))
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is tuple:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "mapping"
    return "null" if tp is type(None) else tp.__name__


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
