"""What the command hands an engine's driver, and the driver found from its registry entry (rnb.engines.registry)."""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from rnb.core.records import GpuRecord
from rnb.engines.job import JobResult, RunArgs
from rnb.engines.registry import Engine
from rnb.pipeline.config import PipelineConfig
from rnb.pipeline.plan import Placement


@dataclass(frozen=True)
class EngineJob:
    """A job as every driver receives it: the checked config, its settings, the planned runners, the GPUs this host
    checked (none where the engine checks them on its own nodes) and whether busy GPUs were allowed."""

    config: PipelineConfig
    args: RunArgs
    placements: list[Placement]
    gpus: Sequence[GpuRecord]
    allow_busy_gpus: bool


class Driver(Protocol):
    """An engine's entry: the job run and logged.  It raises rnb.pipeline.config.ConfigError for what its hosts
    cannot run (exit 2, before any log exists) and rnb.engines.registry.EngineUnavailable for hosts out of reach
    (exit 1)."""

    def __call__(self, job: EngineJob) -> JobResult: ...


def driver_of(engine: Engine) -> Driver:
    """The engine's driver, imported only now: an engine's imports are heavy (torch, Ray)."""
    module, _, function = engine.driver.partition(":")
    return cast(Driver, getattr(importlib.import_module(module), function))
