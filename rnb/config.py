"""Pipeline configuration: the typed form of a config JSON, and its validation.

Everything that can be checked without starting a process is checked here, so
that a bad config costs the user one sentence and exit code 2, never a
half-started job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


class ConfigError(ValueError):
    """A config or request that cannot run; `str()` is the one sentence a user sees."""

    def __init__(self, file: str, json_path: str, expected: str) -> None:
        self.file = file
        self.json_path = json_path
        self.expected = expected
        super().__init__(f"{file}: {json_path}: {expected}")


@dataclass(frozen=True)
class QueueGroup:
    """One queue group of a step: a runner per entry of `gpus` (-1 = CPU)."""

    gpus: tuple[int, ...]
    in_queue: int | None            # None only for step 0 (reads the request queue)
    out_queues: tuple[int, ...]     # empty only for the final step
    queue_selector: str | None      # dotted class path; None = round robin
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)  # step keywords, group ones on top


@dataclass(frozen=True)
class Step:
    model: str                      # dotted class path
    queue_groups: tuple[QueueGroup, ...]
    num_shared_tensors: int         # output slots per runner; 0 for the final step
    num_segments: int               # 1 = no split
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)  # every other step key


@dataclass(frozen=True)
class PipelineConfig:
    path: str                       # where it came from ("<default>" for the embedded one)
    source: Mapping[str, Any]
    steps: tuple[Step, ...]
    run: Mapping[str, Any]          # defaults for CLI values ("videos", "mean_interval_ms", ...)
    raw: Mapping[str, Any]          # the parsed JSON as written, copied into the job log
