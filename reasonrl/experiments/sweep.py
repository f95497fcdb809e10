"""The sweep file: a recipe, settings for every run, the cells, the seeds, a baseline and a target.

    sweep = read_sweep("sweeps/clip.yaml", ["sweep.parallel=2"])    # ConfigError naming the file and key
    for run in sweep.runs("runs/clip"):                             # seed-major: every cell's seed 0 first
        cfg = sweep.config(run)                                     # recipe + set + cell + run.seed + run.dir

The file (``docs/sweeps.md``)::

    recipe: dapo                          # a packaged recipe name, or a path relative to this file
    set: {train.total_steps: 30}          # settings of every run: dotted keys or sections
    grid: {algo.eps_high: [0.2, 0.28]}    # the cells: every combination of the values ...
    cells: [{algo.eps_high: 0.2}, ...]    # ... or a list of settings (neither: one cell, no settings)
    seeds: [0, 1, 2]                      # run.seed of each cell's runs (a number n: 0 .. n-1)
    baseline: {algo.eps_high: 0.2}        # the cell the others are compared with (default: the first)
    target: 0.5                           # a held-out accuracy (val/acc): steps, samples, time to reach it
    expect: better                        # what a paper reports for the other cells, stated before the runs
    margin: 0.03                          # with expect: no difference, the largest difference that counts as none
    sweep: {parallel: 2}                  # how the sweep runs (SWEEP_OPTIONS)

Each run is ``load(recipe, [defaults, *set, *cell, run.seed=S, run.dir=DIR/<cell>/seed_S])``:
later settings win, and the sweep owns ``run.seed`` and ``run.dir``. The defaults
(:meth:`Sweep.overrides`) turn off each run's own progress bar and console lines, and with
``sweep.parallel`` N > 1 give each run ``run.threads`` = cores / N; ``set`` may override them.
Values are YAML as in recipes (``3e-4`` is a number).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from reasonrl.config import Config, ConfigError, flatten, load
from reasonrl.config.loader import read_yaml
from reasonrl.experiments.stats import EXPECTATIONS

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
"""The packaged recipes (reasonrl/recipes/*.yaml), which a bare ``recipe: NAME`` names."""

KEYS = ("recipe", "set", "grid", "cells", "seeds", "baseline", "target", "expect", "margin", "sweep")
"""The keys of a sweep file."""

OWNED = ("run.dir", "run.seed")
"""Keys the sweep sets for each run (a cell or ``set`` naming one is an error)."""


@dataclass(frozen=True)
class SweepOptions:
    """The ``sweep:`` section of a sweep file (``sweep.parallel=2`` on the command line)."""

    parallel: int = 1
    """Runs trained at once. 1: one after another, in the sweep's own process; N > 1: N worker
    processes, or with runtime.engine=ray N Ray actors on the cluster, each run with
    run.threads = this machine's cores / N (unless ``set`` gives run.threads)."""
    run_timeout_h: float = 24.0
    """With parallel > 1: a run whose worker has not answered after this many hours is
    stopped (its worker process or actor killed and replaced) and counts as failed. A stuck stage is
    caught much sooner by the run's own watchdog (resilience.hang_timeout_s)."""


@dataclass(frozen=True)
class Cell:
    """One cell: its settings ({dotted key: value}) and its directory name under the sweep's."""

    settings: dict[str, Any]
    name: str


@dataclass(frozen=True)
class SweepRun:
    """One cell's run with one seed, in its own run directory."""

    cell: Cell
    seed: int
    dir: Path

    @property
    def label(self) -> str:
        return f"{self.cell.name}/seed_{self.seed}"


@dataclass(frozen=True)
class Sweep:
    """A read sweep file (:func:`read_sweep`); ``source`` names it in messages."""

    source: str
    recipe: Path
    settings: dict[str, Any]
    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    baseline: Cell
    target: float | None
    options: SweepOptions = field(default_factory=SweepOptions)
    expect: str | None = None
    """``better`` or ``worse``: the direction a finding under test reports for every other cell
    against the baseline (final val/acc), or ``no difference`` (within ``margin``), stated before
    the runs; each cell's summary then says whether the sweep reproduced it
    (:func:`reasonrl.experiments.stats.finding`). None: no claim."""
    margin: float | None = None
    """With ``expect: no difference``: the largest difference of final val/acc that counts as
    none; the cell reproduces the claim when its whole interval lies within ±margin."""

    def runs(self, root: str | Path) -> list[SweepRun]:
        """Every cell x seed, seed-major (each cell's seed 0, then each cell's seed 1, ...), so
        a slow stretch of the machine falls on every cell alike; run directories
        ``root/<cell name>/seed_<seed>``."""
        root = Path(root)
        return [SweepRun(cell, seed, root / cell.name / f"seed_{seed}") for seed in self.seeds for cell in self.cells]

    def overrides(self, run: SweepRun, cores: int) -> list[str]:
        """The dotted overrides of ``run`` on the recipe: the sweep's defaults, ``set``, the
        cell's settings, then run.seed and run.dir. ``cores``: this machine's, split among
        ``parallel`` runs."""
        defaults: dict[str, Any] = {"run.progress": False, "run.log_every": 0}
        if self.options.parallel > 1:
            defaults["run.threads"] = max(1, cores // self.options.parallel)
        settings = {**defaults, **self.settings, **run.cell.settings, "run.seed": run.seed, "run.dir": str(run.dir)}
        return [f"{key}={json.dumps(value)}" for key, value in settings.items()]

    def config(self, run: SweepRun, cores: int = 1) -> Config:
        """The validated config of ``run``; ConfigError naming the sweep file and the cell, or
        eval.every_steps when the runs would measure no held-out accuracy."""
        try:
            cfg = load(self.recipe, self.overrides(run, cores))
        except ConfigError as err:
            raise ConfigError(f"{self.source}, cell {run.cell.name}: {err}", err.key) from None
        if cfg.eval.every_steps <= 0:
            raise ConfigError(f"{self.source}, cell {run.cell.name}: eval.every_steps = {cfg.eval.every_steps}: a "
                              "sweep compares held-out accuracy (val/acc), so its runs need eval.every_steps >= 1",
                              "eval.every_steps")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """The sweep as a sweep file that :func:`read_sweep` reads back to an equal Sweep (cells
        as a list, the recipe as an absolute path)."""
        return {"recipe": str(self.recipe), "set": self.settings, "cells": [c.settings for c in self.cells],
                "seeds": list(self.seeds), "baseline": self.baseline.settings, "target": self.target,
                "expect": self.expect,
                "margin": self.margin,
                "sweep": {"parallel": self.options.parallel, "run_timeout_h": self.options.run_timeout_h}}


def read_sweep(path: str | Path, overrides: Sequence[str] = ()) -> Sweep:
    """The sweep file at ``path`` with command-line ``overrides``: ``sweep.<option>=value``
    sets an option, any other ``dotted.key=value`` is added to ``set``. ConfigError naming the
    file (or the command line) and the key for anything no sweep can use."""
    path = Path(path)
    try:
        data = read_yaml(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the sweep file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {getattr(err, 'problem', None) or err}") from None
    return parse_sweep(data, str(path), path.parent, overrides)


def parse_sweep(data: Any, source: str, base: Path, overrides: Sequence[str] = ()) -> Sweep:
    """The Sweep of the parsed sweep file ``data`` (see the module docstring); ``source`` names
    it in messages, a recipe path is relative to ``base``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a sweep file is a mapping with the keys {', '.join(KEYS)}; got "
                          f"{type(data).__name__}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]}; a sweep file has {', '.join(KEYS)}", str(unknown[0]))
    settings = _settings(data.get("set") or {}, source, "set")
    options = _options(data.get("sweep") or {}, source)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"command line: {item!r} is not an override of the form dotted.key=value")
        try:
            value = read_yaml(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"command line: {key} = {text!r}: not a YAML value ({err})", key) from None
        if key.startswith("sweep."):
            options = _options({**vars(options), key.removeprefix("sweep."): value}, "command line")
        else:
            settings |= _settings({key.strip(): value}, "command line", "set")
    if "recipe" not in data:
        raise ConfigError(f"{source}: recipe: missing; expected a packaged recipe name ({_recipe_names()}) or a "
                          "recipe file", "recipe")
    if "grid" in data and "cells" in data:
        raise ConfigError(f"{source}: grid and cells are both given; the cells are either a grid or a list", "cells")
    cells = _cells(data, source)
    baseline = cells[0]
    if data.get("baseline") is not None:
        wanted = _settings(data["baseline"], source, "baseline")
        baseline = next((c for c in cells if c.settings == wanted), None)
        if baseline is None:
            raise ConfigError(f"{source}: baseline {wanted} is none of the cells ({', '.join(c.name for c in cells)})",
                              "baseline")
    return Sweep(source, _recipe(data["recipe"], source, base), settings, cells, _seeds(data.get("seeds"), source),
                 baseline, _target(data.get("target"), source), options, _expect(data.get("expect"), source),
                 _margin(data.get("margin"), data.get("expect"), source))


def _recipe(name: Any, source: str, base: Path) -> Path:
    """A recipe file relative to the sweep file's directory (or absolute), else the packaged
    recipe of a bare name (``dapo`` or ``dapo.yaml``)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: recipe = {name!r}: expected a recipe name or file", "recipe")
    path = base / name
    if path.is_file():
        return path.resolve()
    packaged = RECIPES / (name if name.endswith(".yaml") else f"{name}.yaml")
    if Path(name).name == name and packaged.is_file():
        return packaged
    raise ConfigError(f"{source}: recipe = {name!r}: no file {path}, and no packaged recipe of that name "
                      f"({_recipe_names()})", "recipe")


def _recipe_names() -> str:
    return ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))


def _settings(value: Any, source: str, key: str) -> dict[str, Any]:
    """{dotted key: value} of a mapping of dotted keys or sections; the keys the sweep owns
    are an error."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{source}: {key} = {value!r}: expected a mapping of dotted config keys to values", key)
    flat = flatten(value)
    owned = [k for k in flat if k in OWNED]
    if owned:
        raise ConfigError(f"{source}: {key} sets {owned[0]}, which the sweep sets for each run (run.dir: "
                          "<DIR>/<cell>/seed_<seed>; run.seed: from seeds)", owned[0])
    return flat


def _options(value: Any, source: str) -> SweepOptions:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: sweep = {value!r}: expected a mapping of {', '.join(vars(SweepOptions()))}",
                          "sweep")
    for name, given in value.items():
        if name == "parallel" and (type(given) is not int or given < 1):
            raise ConfigError(f"{source}: sweep.parallel = {given!r}: expected an integer >= 1 (runs at once)",
                              "sweep.parallel")
        if name == "run_timeout_h" and (type(given) not in (int, float) or not given > 0):
            raise ConfigError(f"{source}: sweep.run_timeout_h = {given!r}: expected a number of hours > 0",
                              "sweep.run_timeout_h")
        if name not in vars(SweepOptions()):
            raise ConfigError(f"{source}: unknown key sweep.{name}; valid: "
                              f"{', '.join('sweep.' + k for k in vars(SweepOptions()))}", f"sweep.{name}")
    return SweepOptions(**{k: float(v) if k == "run_timeout_h" else v for k, v in value.items()})


def _cells(data: dict[str, Any], source: str) -> tuple[Cell, ...]:
    """The cells of ``grid`` (every combination, the first key slowest) or ``cells``, or one
    empty cell; equal cells are an error."""
    if "grid" in data:
        grid = _settings(data["grid"], source, "grid")
        if not grid:
            raise ConfigError(f"{source}: grid is empty; expected {{dotted.key: [value, ...]}}", "grid")
        for key, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: grid: {key} = {values!r}: expected a non-empty list of values", key)
        combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    elif "cells" in data:
        if not isinstance(data["cells"], list) or not data["cells"]:
            raise ConfigError(f"{source}: cells = {data['cells']!r}: expected a non-empty list of settings", "cells")
        combos = [_settings(c, source, f"cells[{i}]") for i, c in enumerate(data["cells"])]
    else:
        combos = [{}]
    cells = tuple(Cell(settings, cell_name(settings)) for settings in combos)
    for i, cell in enumerate(cells):
        if any(cell.settings == other.settings for other in cells[:i]):
            raise ConfigError(f"{source}: cell {cell.settings} is given twice", "cells")
    return cells


def _seeds(value: Any, source: str) -> tuple[int, ...]:
    if type(value) is int and value >= 1:
        return tuple(range(value))
    if (not isinstance(value, list) or not value or any(type(s) is not int for s in value)
            or len(set(value)) != len(value)):
        raise ConfigError(f"{source}: seeds = {value!r}: expected a list of distinct integers (run.seed of each "
                          "cell's runs), or a number n for seeds 0 .. n-1", "seeds")
    return tuple(value)


def _target(value: Any, source: str) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= 1:
        raise ConfigError(f"{source}: target = {value!r}: expected a held-out accuracy in [0, 1], or null", "target")
    return float(value)


def _expect(value: Any, source: str) -> str | None:
    if value is None or value in EXPECTATIONS:
        return value
    raise ConfigError(f"{source}: expect = {value!r}: expected {', '.join(EXPECTATIONS)} (what the finding under test "
                      "reports for the other cells against the baseline), or null", "expect")


def _margin(value: Any, expect: Any, source: str) -> float | None:
    """The equivalence margin: required with ``expect: no difference``, refused otherwise."""
    if expect != "no difference":
        if value is not None:
            raise ConfigError(f"{source}: margin = {value!r}: a margin belongs to expect: no difference "
                              f"(expect is {expect!r}); remove it", "margin")
        return None
    if type(value) not in (int, float) or not 0 < value <= 1:
        raise ConfigError(f"{source}: margin = {value!r}: expect: no difference needs a margin, the largest "
                          "difference of final held-out accuracy that counts as none, in (0, 1]", "margin")
    return float(value)


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+,-]")
_NAME_CHARS = 100


def cell_name(settings: dict[str, Any]) -> str:
    """The directory name of a cell: ``key=value`` pairs joined by ``__`` (``default`` for no
    settings); when that text holds characters unsafe in a file name (replaced by ``_``) or is
    longer than 100 characters, a short hash of the settings follows, so names stay distinct."""
    if not settings:
        return "default"
    text = "__".join(f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in settings.items())
    safe = _UNSAFE.sub("_", text)
    if safe == text and len(text) <= _NAME_CHARS:
        return text
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{safe[:_NAME_CHARS - 9]}-{digest}"
