"""Resolve the dotted class paths that configs use for models, selectors and sources."""
from __future__ import annotations

import importlib
from typing import Any


def load_object(path: str) -> Any:
    """The object `package.module.Name` names; config validation has already vetted the path.

    What a module holds is unknown until run time (hence no type here); each caller knows what its path names.
    """
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)
