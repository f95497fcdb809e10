"""The package's layering: a module imports only from its own layer or the layers before it.

    types, config, errors, plugins <- algo <- models, precision, memory, data, env, warmstart, rollout, reward, train, checkpoint,
    metrics, loggers, samples
    <- workers <- runtime <- resilience, evaluation, report <- controller, preflight <- cli

Every import counts, also one inside a function (a lazy import still ties the layers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import reasonrl

PACKAGE = Path(reasonrl.__file__).parent

LAYERS: list[set[str]] = [
    {"types", "config", "errors", "plugins", "__version__"},  # __version__: the package root's, read by the CLI
    {"algo"},
    {"models", "precision", "memory", "data", "env", "warmstart", "rollout", "reward", "train", "checkpoint", "metrics", "loggers",
     "samples"},
    {"workers"},
    {"runtime"},
    {"resilience", "evaluation", "report"},
    {"controller", "preflight"},
    {"cli"},
]


def layer_of(module: str) -> int:
    """The layer of ``reasonrl.<top>[...]`` by its first component below the package."""
    top = module.split(".")[1] if "." in module else ""
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module}: not in any layer of tests/unit/test_layering.py; add it to LAYERS")


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reasonrl.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reasonrl"):
            found.add(node.module if node.module != "reasonrl" else f"reasonrl.{node.names[0].name}")
    return found


def test_no_module_imports_from_a_layer_to_its_right():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = "reasonrl." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        if name == "reasonrl":
            continue
        own = layer_of(name)
        for target in imports(path):
            if layer_of(target) > own:
                violations.append(f"{name} (layer {own}) imports {target} (layer {layer_of(target)})")
    assert not violations, "\n".join(violations)


def test_the_check_sees_lazy_imports_and_orders_the_layers(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import torch\nfrom reasonrl.types import Prompt\n\ndef f():\n    from reasonrl.runtime import LocalGroup\n"
                      "    import reasonrl.controller\n")
    assert imports(module) == {"reasonrl.types", "reasonrl.runtime", "reasonrl.controller"}
    assert layer_of("reasonrl.workers.policy") > layer_of("reasonrl.rollout.source")
    assert layer_of("reasonrl.controller") > layer_of("reasonrl.runtime.process") > layer_of("reasonrl.workers")
