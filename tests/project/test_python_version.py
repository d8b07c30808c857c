"""One Python version across what pip, mypy and ruff are told and what runs: the oldest one the project accepts."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8"))


def test_requires_python_mypy_and_ruff_name_one_version():
    requires = PYPROJECT["project"]["requires-python"]
    assert requires.startswith(">=")
    oldest = requires.removeprefix(">=")
    assert PYPROJECT["tool"]["mypy"]["python_version"] == oldest
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + oldest.replace(".", "")


def test_the_python_that_runs_the_tests_is_one_the_project_accepts():
    running = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert running in SpecifierSet(PYPROJECT["project"]["requires-python"])
