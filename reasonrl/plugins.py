"""Loading a user's object named in the config: ``module:Name`` or ``path/to/file.py:Name``.

    load_object("my_envs:Guess", "env.name")              # import my_envs, take Guess
    load_object("plugins/guess.py:Guess", "env.name")      # run that file as a module, take Guess

A spec whose module part ends in ``.py`` or holds a path separator is a file, relative to the
working directory or absolute; it is loaded once per process (as the module
``reasonrl_plugin_<stem>_<hash of its path>``) and the same module object is returned for it
afterwards. Any other spec is a dotted module name, imported with the working directory on
``sys.path`` as ``python -m`` puts it there, so ``mymod:Fn`` finds ./mymod.py without
``PYTHONPATH=.``. Errors are :class:`~reasonrl.errors.InputError` naming the config key, the
module or file, and the name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from reasonrl.errors import InputError, error_line

SPEC_FORMS = "module:Name or path/to/file.py:Name"
"""How a plugin spec is written, for error messages."""


def is_plugin_spec(spec: str) -> bool:
    """Whether ``spec`` has the form of a plugin spec (a non-empty module or file, a colon, a
    non-empty name) rather than a registry name."""
    module, sep, name = spec.rpartition(":")
    return bool(sep and module and name)


def load_object(spec: str, key: str) -> Any:
    """The object ``spec`` names (``module:Name`` or ``path/to/file.py:Name``; ``Name`` may be
    dotted, ``Outer.Inner``), for the config key ``key`` that the error messages name.

    Raises InputError when the spec has neither form, the module cannot be imported, the file
    does not exist or fails to run, or the module has no such attribute.
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise InputError(f"{key} = {spec!r}: not a plugin spec; expected {SPEC_FORMS}")
    if _is_file(where):
        module, what = _load_file(spec, key, where), f"file {where!r}"
    else:
        module, what = _import(spec, key, where), f"module {where!r}"
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise InputError(f"{key} = {spec!r}: {what} has no attribute {name!r}")
        obj = getattr(obj, part)
    return obj


def _is_file(where: str) -> bool:
    """Whether the module part of a spec names a file: it ends in .py or holds a path separator."""
    return where.endswith(".py") or "/" in where or os.sep in where


def _import(spec: str, key: str, module_name: str) -> ModuleType:
    """Import ``module_name`` with the working directory on sys.path (appended, so it never
    shadows an installed package)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        if getattr(e, "name", None) == module_name or (e.name and module_name.startswith(e.name + ".")):
            raise InputError(f"{key} = {spec!r}: cannot import module {module_name!r}: no such module on sys.path "
                             f"or in the working directory {cwd}; expected {SPEC_FORMS}") from e
        raise InputError(f"{key} = {spec!r}: importing module {module_name!r} failed: {error_line(e)}") from e
    except Exception as e:  # noqa: BLE001 - the user's module raised while it was imported
        raise InputError(f"{key} = {spec!r}: importing module {module_name!r} failed: {error_line(e)}") from e


def _load_file(spec: str, key: str, where: str) -> ModuleType:
    """Run the file ``where`` (relative to the working directory, or absolute) as a module,
    once per process; its directory is not put on sys.path."""
    path = Path(where).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.is_file():
        raise InputError(f"{key} = {spec!r}: file {where!r} does not exist (looked at {path})")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    module_name = f"reasonrl_plugin_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"{key} = {spec!r}: file {where!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # before running it: dataclasses and pickling look it up
    try:
        loader_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[module_name]
        if not isinstance(e, Exception):
            raise
        raise InputError(f"{key} = {spec!r}: running file {where!r} failed: {error_line(e)}") from e
    return module
