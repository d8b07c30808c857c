"""`pip install .` gives a command that runs: its default config ships inside the package (rnb/pipeline/default.json).

The install goes into a fresh environment whose dependencies come from the
running one (bench/installed.py says how and why), and the command runs from
a directory of its own with PYTHONPATH unset.
"""
from __future__ import annotations

import pytest

from bench.installed import check_installed


@pytest.mark.slow
def test_the_installed_command_runs_its_embedded_default_from_another_directory(tmp_path) -> None:
    assert check_installed(tmp_path) == []
