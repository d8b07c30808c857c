"""Imports between the project's packages run one way (ARCHITECTURE.md), at module level and inside functions alike."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import imported, imported_by, module_name

ROOT = Path(__file__).resolve().parents[2]

# Each layer and the layers of this project it may import (itself always allowed).
ALLOWED: dict[str, set[str]] = {
    "rnb": set(),            # rnb/__init__.py: a docstring
    "rnb.core": set(),
    # rnb.flags: the run keys' spellings; rnb.engines.registry: the engines' names.
    "rnb.pipeline": {"rnb.core", "rnb.load", "rnb.flags", "episodes", "rnb.engines.registry"},
    # The engines declared: the standard library only, so that the config check and the launcher may ask it.
    "rnb.engines.registry": set(),
    "rnb.engines": {"rnb.core", "rnb.pipeline", "rnb.load", "selector", "rnb.engines.registry"},
    "rnb.engines.local": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.engines.loadgen", "rnb.load",
                          "rnb.engines.registry"},
    "rnb.engines.loadgen": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.load", "rnb.engines.registry"},
    "rnb.engines.ray": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.load", "rnb.engines.registry"},
    "rnb.analysis": {"rnb.core", "rnb.console", "rnb.flags", "rnb.load"},
    "rnb.tune": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.engines.local", "rnb.engines.loadgen", "rnb.engines.ray",
                 "rnb.analysis", "rnb.console", "rnb.flags", "rnb.load", "rnb.cli", "rnb.engines.registry"},
    # The command reaches an engine's package only through its registry entry (rnb.engines.drivers).
    "rnb.cli": {"rnb.core", "rnb.pipeline", "rnb.engines", "rnb.engines.loadgen", "rnb.analysis", "rnb.console",
                "rnb.flags", "rnb.load", "rnb.engines.registry"},
    "rnb.launch": {"rnb.engines", "rnb.engines.local", "rnb.cli", "rnb.engines.registry", "rnb.flags", "rnb.pipeline"},
    "rnb.console": set(),
    "rnb.flags": set(),
    "rnb.load": {"rnb.flags"},
    "rnb.make_dataset": {"rnb.console", "episodes"},
    "models": {"rnb.core", "episodes"},     # a model imports the model contract and the episodes library only
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


def sources() -> list[Path]:
    return sorted([*ROOT.glob("rnb/**/*.py"), *ROOT.glob("models/*.py"), ROOT / "selector.py"])


def crossings(module: str, names: set[str]) -> list[str]:
    """The imports of `module` that cross from its layer to one it may not import."""
    mine = layer_of(module)
    assert mine is not None, module
    wrong = []
    for name in sorted(names):
        theirs = layer_of(name)
        if theirs is not None and theirs != mine and theirs not in ALLOWED[mine]:
            wrong.append(f"{module} ({mine}) imports {name} ({theirs})")
    return wrong


def test_every_import_between_layers_is_one_the_architecture_allows():
    assert [wrong for path in sources() for wrong in crossings(module_name(path), imported(path))] == []


def test_no_package_reaches_another_through_a_lazy_module_getattr():
    lazy = [str(path.relative_to(ROOT)) for path in sources()
            if any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                   for node in ast.parse(path.read_text(encoding="utf-8")).body)]
    assert lazy == []


def test_the_layer_table_names_every_package_of_rnb():
    packages = {module_name(path) for path in ROOT.glob("rnb/*/__init__.py")} | {
        module_name(path) for path in ROOT.glob("rnb/*/*/__init__.py")}
    assert packages - set(ALLOWED) == set()


BAD_MODULE = """
import importlib
from importlib import import_module

from . import model                        # rnb.core.model: its own layer
from ..engines import runner               # rnb.engines and rnb.engines.runner
from ..pipeline.config import ConfigError  # rnb.pipeline.config and its ConfigError


def late():
    from ..analysis.jobs import read_job    # inside a function, relative
    importlib.import_module("rnb.tune.search")
    import_module("models.toy")
    __import__("rnb.cli")
    importlib.import_module(".engines.ray", package="rnb")
    importlib.import_module(f"rnb.{'console'}")   # not a literal: known only at run time
"""


def test_relative_imports_and_imports_by_literal_name_cross_layers_as_plain_ones_do():
    found = crossings("rnb.core.bad", imported_by(BAD_MODULE, "rnb.core.bad", is_package=False))
    assert found == [f"rnb.core.bad (rnb.core) imports {name}" for name in (
        "models.toy (models)", "rnb.analysis.jobs (rnb.analysis)", "rnb.analysis.jobs.read_job (rnb.analysis)",
        "rnb.cli (rnb.cli)", "rnb.engines (rnb.engines)", "rnb.engines.ray (rnb.engines.ray)",
        "rnb.engines.runner (rnb.engines)", "rnb.pipeline.config (rnb.pipeline)",
        "rnb.pipeline.config.ConfigError (rnb.pipeline)", "rnb.tune.search (rnb.tune)")]
    # In a package's __init__ the package itself is where a relative import starts.
    assert imported_by("from .plan import Placement\nfrom ..core import model\n", "rnb.pipeline", is_package=True) == {
        "rnb.pipeline.plan", "rnb.pipeline.plan.Placement", "rnb.core", "rnb.core.model"}
