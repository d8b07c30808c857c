"""Shared pytest setup for the whole suite: markers that skip what this machine cannot run."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from episodes.testing_server import NGINX

REPO = Path(__file__).resolve().parents[1]
# Scripts the tests start (scripts/*.py, bench/run.py) import the project through the venv's
# editable install, which may point at another checkout: this one's code must come first.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
# Derived files (MP4 index sidecars, usage-format columns) of the tests' datasets go to a fresh directory,
# not the user's ~/.cache/rnb; spawned jobs inherit it.
os.environ["RNB_CACHE_DIR"] = tempfile.mkdtemp(prefix="rnb-test-cache-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {}
    if not torch.cuda.is_available():
        skips["gpu"] = pytest.mark.skip(reason="needs CUDA; this machine has no GPU")
    if not os.access(NGINX, os.X_OK):
        skips["nginx"] = pytest.mark.skip(reason=f"needs Debian's nginx at {NGINX}; scripts/test.sh installs it")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
