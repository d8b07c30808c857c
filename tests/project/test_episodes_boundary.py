"""`episodes` is a library of its own: it imports nothing of RnB, and RnB uses only its public names.

Read from the sources (ast), not from what happens to be imported at run
time, so an import inside a function counts as much as one at the top.
"""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import episodes

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "episodes"
RNB_SIDE = ("rnb", "models", "bench", "tests", "benchmark", "client", "control", "runner", "selector")


def imported(path: Path) -> set[str]:
    """Every module `path` imports, as dotted names; `from m import n` counts m and m.n (n may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import of {node.module!r}"
            names.add(node.module or "")
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def tracked(*patterns: str) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in listed.stdout.split()]


def is_private(module: str) -> bool:
    """A module of episodes that the package keeps private: a part with a leading underscore (not a dunder)."""
    parts = module.split(".")
    return parts[0] == "episodes" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_no_module_of_episodes_imports_rnb_models_or_bench() -> None:
    found = {f"{path.relative_to(REPO)} imports {name}" for path in PACKAGE.rglob("*.py") for name in imported(path)
             if any(under(name, side) for side in RNB_SIDE)}
    assert not found


def test_the_library_never_imports_its_test_kit_or_tools() -> None:
    tooling = (PACKAGE / "testing", PACKAGE / "tools", PACKAGE / "__main__.py")
    library = [path for path in PACKAGE.rglob("*.py") if not any(path.is_relative_to(t) for t in tooling)]
    assert PACKAGE / "_cache.py" in library and PACKAGE / "_mp4" / "index.py" in library
    found = {f"{path.relative_to(REPO)} imports {name}" for path in library for name in imported(path)
             if under(name, "episodes.testing") or under(name, "episodes.tools")}
    assert not found


def test_outside_episodes_and_tests_only_public_names_are_imported() -> None:
    outside = [path for path in tracked("*.py") if path.relative_to(REPO).parts[0] not in ("episodes", "tests")]
    assert REPO / "models" / "episode.py" in outside and REPO / "bench" / "episode_bench.py" in outside
    found = {f"{path.relative_to(REPO)} imports {name}" for path in outside for name in imported(path)
             if is_private(name)}
    assert not found


def test_every_public_name_is_exported() -> None:
    assert all(hasattr(episodes, name) for name in episodes.__all__)
    assert not [name for name in episodes.__all__ if name.startswith("_")]
