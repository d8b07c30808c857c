"""ARCHITECTURE.md's import map is the code's: every arrow it draws is an import, and every import between parts is drawn.

The map is read from the page itself, so the picture a reader trusts cannot drift from the code: a move that adds an
edge between parts, or removes the last import behind one, fails here until the page is redrawn. The parts are the
map's own nodes (a module belongs to the longest part its name starts with), drawn at package level so that modules
moving inside a package leave the map as it is. Which imports count is tests/project/test_layering.py's reading (module level
and inside functions, relative ones made absolute, import_module with a literal name).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support.imports import imported, module_name

ROOT = Path(__file__).resolve().parents[2]
HEADING = "## The import map"
ARROW = "──▶"
Edges = dict[tuple[str, str], list[str]]  # (importer's part, imported part) -> the importing modules


def parse_map(page: str) -> dict[str, set[str]]:
    """Each part the map draws and the parts it imports, from the first fenced block after HEADING.

    A line `part ──▶ a, b (a note), c` draws three arrows; a line starting with spaces continues the one above;
    words in parentheses are notes to the reader, and `part ──▶ (a note)` alone draws a part importing nothing."""
    if HEADING not in page:
        raise ValueError(f"ARCHITECTURE.md has no {HEADING!r} section")
    block = page.split(HEADING, 1)[1].split("```", 2)
    if len(block) < 3:
        raise ValueError(f"ARCHITECTURE.md's {HEADING!r} section has no fenced block")
    drawn: dict[str, set[str]] = {}
    for number, line in enumerate(_joined(block[1].splitlines()), start=1):
        source, arrow, targets = line.partition(ARROW)
        part = source.strip()
        if not arrow or not re.fullmatch(r"[\w.]+", part):
            raise ValueError(f"ARCHITECTURE.md's import map, line {number}: expected `part {ARROW} parts`, "
                             f"found {line.strip()!r}")
        if part in drawn:
            raise ValueError(f"ARCHITECTURE.md's import map draws {part} twice")
        named = re.sub(r"\([^)]*\)", "", targets)
        drawn[part] = {name.strip() for name in named.split(",") if name.strip()}
    return drawn


def _joined(lines: Iterable[str]) -> list[str]:
    joined: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        if line[0].isspace() and joined:
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return joined


def part_of(module: str, parts: Iterable[str]) -> str | None:
    """The longest part whose name is `module` or a package above it."""
    owners = [part for part in parts if module == part or module.startswith(part + ".")]
    return max(owners, key=len, default=None)


def sources() -> list[Path]:
    """Every module of the project that is not a test, but rnb/__init__.py: a docstring, no part (test_layering.py
    holds it to importing nothing)."""
    trees = ("rnb", "models", "episodes", "bench", "scripts")
    found = [path for tree in trees for path in ROOT.glob(f"{tree}/**/*.py") if path != ROOT / "rnb" / "__init__.py"]
    return sorted([*found, ROOT / "benchmark.py", ROOT / "selector.py"])


def measured(imports: dict[str, set[str]], parts: Iterable[str]) -> Edges:
    """The arrows between parts that `imports` (module -> the modules it imports) make, with the modules behind each.
    An imported name in no part (a library, or the bare `rnb` package) draws nothing."""
    parts = list(parts)
    edges: Edges = {}
    for module, names in sorted(imports.items()):
        mine = part_of(module, parts)
        for name in names:
            theirs = part_of(name, parts)
            if mine is not None and theirs is not None and theirs != mine:
                importers = edges.setdefault((mine, theirs), [])
                if module not in importers:
                    importers.append(module)
    return edges


def arrows(drawn: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(part, target) for part, targets in drawn.items() for target in targets}


@pytest.fixture(scope="module")
def drawn() -> dict[str, set[str]]:
    return parse_map((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    return {module_name(path): imported(path) for path in sources()}


def test_every_import_between_parts_is_drawn(drawn, imports):
    undrawn = {f"{a} {ARROW} {b}": importers for (a, b), importers in measured(imports, drawn).items()
               if (a, b) not in arrows(drawn)}
    assert undrawn == {}, "imports between parts that ARCHITECTURE.md's import map does not draw: add their arrows"


def test_every_arrow_drawn_is_an_import(drawn, imports):
    gone = sorted(f"{a} {ARROW} {b}" for a, b in arrows(drawn) - set(measured(imports, drawn)))
    assert gone == [], "arrows of ARCHITECTURE.md's import map that no import makes any more: remove them"


def test_every_module_is_in_a_drawn_part_and_every_part_has_modules(drawn, imports):
    assert [module for module in imports if part_of(module, drawn) is None] == []
    assert sorted(part for part in drawn if not any(part_of(module, [part]) for module in imports)) == []
    assert sorted(target for targets in drawn.values() for target in targets if target not in drawn) == []


def test_each_package_and_module_of_rnb_is_a_part_of_its_own(drawn):
    """Package level, no coarser: a map drawing all of rnb as one part would hold every import and say nothing."""
    tops = {f"rnb.{path.stem}" for path in (ROOT / "rnb").glob("*.py") if path.stem != "__init__"}
    tops |= {f"rnb.{path.parent.name}" for path in (ROOT / "rnb").glob("*/__init__.py")}
    assert sorted(tops - set(drawn)) == []


SAMPLE = """# Architecture

## The import map

```
rnb.cli ──▶ rnb.engines (the job), rnb.core,
            rnb.analysis
rnb.engines ──▶ rnb.core
rnb.analysis ──▶ rnb.core
rnb.core ──▶ (nothing of this project)
```
"""


def test_the_map_is_read_with_its_wrapped_lines_and_notes():
    assert parse_map(SAMPLE) == {"rnb.cli": {"rnb.engines", "rnb.core", "rnb.analysis"},
                                 "rnb.engines": {"rnb.core"}, "rnb.analysis": {"rnb.core"}, "rnb.core": set()}


def test_an_import_not_drawn_and_an_arrow_not_imported_are_both_found():
    drawn = parse_map(SAMPLE)
    imports = {"rnb.cli": {"rnb.engines.local.driver", "rnb.core.stages", "rnb.analysis.jobs", "torch"},
               "rnb.engines.runner": {"rnb.core.model", "rnb.analysis.jobs", "rnb.engines.job", "numpy"},
               "rnb.analysis.jobs": {"pyarrow"}, "rnb.core.model": {"rnb"}}
    edges = measured(imports, drawn)
    assert set(edges) - arrows(drawn) == {("rnb.engines", "rnb.analysis")}
    assert edges[("rnb.engines", "rnb.analysis")] == ["rnb.engines.runner"]
    assert arrows(drawn) - set(edges) == {("rnb.analysis", "rnb.core")}


def test_the_longest_drawn_part_owns_a_module():
    parts = ["episodes", "episodes.testing", "rnb.load"]
    assert [part_of(name, parts) for name in ("episodes.testing.synthetic", "episodes._cache", "rnb.load_inputs",
                                               "rnb.load.modes", "episodes")] == [
        "episodes.testing", "episodes", None, "rnb.load", "episodes"]


@pytest.mark.parametrize(("page", "message"), [
    ("# Architecture\n", "ARCHITECTURE.md has no '## The import map' section"),
    (f"{HEADING}\n\nno block\n", "ARCHITECTURE.md's '## The import map' section has no fenced block"),
    (f"{HEADING}\n```\nrnb.cli imports rnb.core\n```\n",
     "ARCHITECTURE.md's import map, line 1: expected `part ──▶ parts`, found 'rnb.cli imports rnb.core'"),
    (f"{HEADING}\n```\nrnb.core ──▶\nrnb.core ──▶ episodes\n```\n", "ARCHITECTURE.md's import map draws rnb.core twice"),
])
def test_a_map_that_cannot_be_read_is_refused_with_its_line(page, message):
    with pytest.raises(ValueError) as refused:
        parse_map(page)
    assert str(refused.value) == message
