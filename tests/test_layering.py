"""Imports between the project's packages run one way (ARCHITECTURE.md), at module level and inside functions alike."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each layer and the layers of this project it may import (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "rnb": set(),            # rnb/__init__.py: a docstring
    "rnb.core": set(),
    "rnb.pipeline": {"rnb.core", "episodes"},
    "rnb.engines": {"rnb.core", "rnb.pipeline", "selector"},
    "rnb.engines.local": {"rnb.core", "rnb.pipeline", "rnb.engines"},
    "rnb.engines.ray": {"rnb.core", "rnb.pipeline", "rnb.engines"},
    "rnb.analysis": {"rnb.core", "rnb.console", "rnb.flags"},
    "rnb.tune": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.engines.local", "rnb.engines.ray", "rnb.analysis",
                 "rnb.console", "rnb.flags", "rnb.cli"},
    "rnb.cli": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.engines.local", "rnb.engines.ray", "rnb.analysis",
                "rnb.console", "rnb.flags"},
    "rnb.console": set(),
    "rnb.flags": set(),
    "rnb.make_dataset": {"rnb.console", "episodes"},
    "models": {"rnb.core", "rnb.pipeline", "episodes"},
    "selector": {"rnb.core"},
}
LAYERS = sorted(ALLOWED, key=len, reverse=True)  # the longest prefix names a module's layer


def layer_of(module: str) -> str | None:
    for layer in LAYERS:
        if module == layer or module.startswith(layer + "."):
            return layer
    if module.split(".")[0] in ("episodes", "bench"):
        return module.split(".")[0]
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module a file imports, wherever in the file the import statement sits."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sources() -> list[Path]:
    return sorted([*ROOT.glob("rnb/**/*.py"), *ROOT.glob("models/*.py"), ROOT / "selector.py"])


def test_every_import_between_layers_is_one_the_architecture_allows():
    wrong = []
    for path in sources():
        mine = layer_of(module_name(path))
        assert mine is not None, path
        for name in imported(path):
            theirs = layer_of(name)
            if theirs is None or theirs == mine or theirs in ALLOWED[mine]:
                continue
            wrong.append(f"{path.relative_to(ROOT)} ({mine}) imports {name} ({theirs})")
    assert wrong == []


def test_no_package_reaches_another_through_a_lazy_module_getattr():
    lazy = [str(path.relative_to(ROOT)) for path in sources()
            if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                   for node in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert lazy == []


def test_the_layer_table_names_every_package_of_rnb():
    packages = {module_name(path) for path in ROOT.glob("rnb/*/__init__.py")} | {
        module_name(path) for path in ROOT.glob("rnb/*/*/__init__.py")}
    assert packages - set(ALLOWED) == set()
