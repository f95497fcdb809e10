"""The package's layering: a module imports only from its own layer or the layers before it,
no two modules import each other, and processes are created in a few places only.

The layers are the ones docs/architecture.md draws under "## Layering" (its first backticked
line, ``a, b <- c <- ...``): the page and the check cannot disagree, and a module the page does
not place fails the check with a message saying where to add it.

Every import counts for the layers, also one inside a function (a lazy import still ties the
layers). Import cycles are checked over the imports a module runs when it is imported (its
module-level ones, ``if TYPE_CHECKING:`` blocks included).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import reasonrl

PACKAGE = Path(reasonrl.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def drawn_layers(text: str) -> list[set[str]]:
    """The layers of the first backticked span after ``## Layering``, left (lowest) to right."""
    section = text.split("\n## Layering\n", 1)[1]
    line = re.search(r"`([^`]+<-[^`]+)`", section, re.S).group(1)
    return [{name.strip() for name in layer.split(",")} for layer in " ".join(line.split()).split("<-")]


LAYERS: list[set[str]] = drawn_layers(ARCHITECTURE.read_text(encoding="utf-8"))

ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # (importing module, imported module): why it stays until a code change removes it. Empty: every import of
    # today's code follows the layers (the moves to config/, models/, warmstart/ and env/registry.py fixed the rest).
}


def module_name(path: Path) -> str:
    name = "reasonrl." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    """The layer of ``reasonrl.<top>[...]`` by its first component below the package."""
    if module == "reasonrl":
        return 0  # the package root: its version, read from the installed metadata
    top = module.split(".")[1]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module}: not in any layer docs/architecture.md draws under '## Layering'; add it there")


def imports(path: Path) -> set[str]:
    """Every ``reasonrl.*`` module ``path`` imports, lazily or not (``from reasonrl import x``: ``reasonrl.x``
    for a module x, ``reasonrl`` for a name of the package root such as ``__version__``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reasonrl.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reasonrl"):
            if node.module != "reasonrl":
                found.add(node.module)
            for alias in node.names if node.module == "reasonrl" else ():  # a module, or a name of the root
                is_module = (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").is_file()
                found.add(f"reasonrl.{alias.name}" if is_module else "reasonrl")
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_imports(path: Path, modules: dict[str, Path] | None = None) -> dict[str, int]:
    """{``reasonrl.*`` module: line} of the imports ``path`` runs at module level (not inside a function or
    class; ``if TYPE_CHECKING:`` counts), ``from package import submodule`` naming the submodule."""
    modules = MODULES if modules is None else modules
    found: dict[str, int] = {}

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("reasonrl."):
                        found.setdefault(a.name, node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "reasonrl" or node.module.startswith("reasonrl.")):
                for a in node.names:
                    target = f"{node.module}.{a.name}"
                    found.setdefault(target if target in modules else node.module, node.lineno)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_module_imports_from_a_layer_to_its_right():
    violations = []
    seen_allowed = set()
    for name, path in MODULES.items():
        if name == "reasonrl":
            continue
        own = layer_of(name)
        for target in sorted(imports(path)):
            if layer_of(target) > own:
                if (name, target) in ALLOWED_UPWARD:
                    seen_allowed.add((name, target))
                    continue
                violations.append(f"{name} (layer {own}) imports {target} (layer {layer_of(target)})")
    assert not violations, "\n".join(violations)
    stale = set(ALLOWED_UPWARD) - seen_allowed
    assert not stale, f"no longer imported, remove from ALLOWED_UPWARD: {sorted(stale)}"


def test_no_import_cycle():
    graph = {name: {t: line for t, line in import_time_imports(path).items() if t in MODULES and t != name}
             for name, path in MODULES.items()}
    found = cycles(graph)
    lines = []
    for component in found:
        lines.append(" <-> ".join(component))
        lines += [f"    {MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {t}"
                  for m in component for t, line in sorted(graph[m].items()) if t in component]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_the_config_schema_imports_neither_the_loader_nor_the_rules():
    assert not {t for t in imports(MODULES["reasonrl.config.schema"]) if t.startswith("reasonrl.config")}


def test_the_check_sees_lazy_imports_and_orders_the_layers(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import torch\nfrom reasonrl.types import Prompt\n\ndef f():\n    from reasonrl.runtime import LocalGroup\n"
                      "    import reasonrl.controller\n")
    assert imports(module) == {"reasonrl.types", "reasonrl.runtime", "reasonrl.controller"}
    assert import_time_imports(module) == {"reasonrl.types": 2}
    assert layer_of("reasonrl.workers.policy") > layer_of("reasonrl.rollout.source")
    assert layer_of("reasonrl.controller") > layer_of("reasonrl.runtime.process") > layer_of("reasonrl.workers")
    order = ["types", "config", "algo", "models", "data", "rollout", "checkpoint", "workers", "runtime", "resilience",
             "controller", "cli"]
    assert [layer_of(f"reasonrl.{top}") for top in order] == sorted({layer_of(f"reasonrl.{top}") for top in order})
    assert layer_of("reasonrl.errors") == layer_of("reasonrl.types")
    assert layer_of("reasonrl.data") == layer_of("reasonrl.reward") == layer_of("reasonrl.env")
    assert layer_of("reasonrl.rollout") == layer_of("reasonrl.trainer")
    assert layer_of("reasonrl.build") == layer_of("reasonrl.controller") == layer_of("reasonrl.experiments")


def test_the_cycle_check_finds_cycles_and_names_submodules(tmp_path):
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nfrom reasonrl import warmstart, __version__\n"
                      "if TYPE_CHECKING:\n    from reasonrl.env.base import Env\n"
                      "def f():\n    from reasonrl import cli\n")
    assert import_time_imports(module) == {"reasonrl.warmstart": 2, "reasonrl": 2, "reasonrl.env.base": 4}


def test_every_module_of_the_package_has_a_layer_and_every_layer_a_module():
    tops = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in PACKAGE.rglob("*.py")} - {"__init__"}
    drawn = set().union(*LAYERS)
    assert tops - drawn == set(), "add these to the layers of docs/architecture.md"
    assert drawn - tops == set(), "docs/architecture.md draws layers for modules that do not exist"


def test_the_layers_are_read_from_the_drawing():
    page = "# A\n\n## Layering\n\nSome words `types, errors <-\n config <- cli`, more.\n\n## Next\n`x <- y`\n"
    assert drawn_layers(page) == [{"types", "errors"}, {"config"}, {"cli"}]
