"""pyproject.toml's dependency ranges and requirements.txt's pins describe one set of packages.

`pip install .` reads the ranges; scripts/setup.sh installs the pins, which
the tests ran with.  Every pin must lie inside its range, and every pinned
package must be declared, or the two installs would differ in what they hold.
"""
from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def declared() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return {canonicalize_name(r.name): r for r in map(Requirement, [*project["dependencies"], *extras])}


def pinned() -> dict[str, Requirement]:
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    return {canonicalize_name(r.name): r for r in map(Requirement, filter(None, lines))}


def test_every_pin_of_requirements_txt_is_declared_and_inside_its_range():
    ranges, pins = declared(), pinned()
    assert set(pins) == set(ranges)
    outside = []
    for name, pin in pins.items():
        (exact,) = pin.specifier
        assert exact.operator == "==", f"requirements.txt pins {name} exactly, found {pin}"
        if not ranges[name].specifier.contains(exact.version) or pin.extras != ranges[name].extras:
            outside.append(f"{pin} outside {ranges[name]}")
    assert outside == []


def imported_top_levels(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_library_the_package_imports_is_declared():
    """What rnb, episodes, models and the top-level modules import, at the top or inside a function."""
    sources = [*REPO.glob("rnb/**/*.py"), *REPO.glob("episodes/**/*.py"), *REPO.glob("models/*.py"),
               REPO / "selector.py", REPO / "benchmark.py"]
    own = {"rnb", "episodes", "models", "bench", "selector", "benchmark"}
    # _typeshed exists for the type checker only; grpc is Ray's own transport, which ray[default] brings (grpcio)
    # and rnb.engines.ray.cluster speaks to ask a cluster whether it wants a token.
    elsewhere = {"_typeshed", "grpc"}
    libraries = ({name for path in sources for name in imported_top_levels(path)} - own - elsewhere
                 - set(sys.stdlib_module_names))
    providers = packages_distributions()
    missing = sorted(name for name in libraries
                     if not any(canonicalize_name(d) in declared() for d in providers.get(name, [])))
    assert "torch" in libraries and missing == []
