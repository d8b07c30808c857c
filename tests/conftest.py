"""Shared pytest markers for the whole suite: skip what this machine cannot run."""
from __future__ import annotations

import os

import pytest
import torch

from episodes.testing_server import NGINX


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
