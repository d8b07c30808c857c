"""The typed form of a config, the error that refuses one, and how a refusal names the value it found.

Every check of a config (rnb.pipeline.config_checks, config_json) and of
what the command line adds to it speaks through ConfigError: one sentence,
`file: json.path: expected ..., found ...`, and exit 2 from the command.
"""
from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rnb.core.model import Keywords
from rnb.core.records import Json, JsonObject


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
    model_kwargs: Keywords = field(default_factory=dict)  # step keywords, group ones on top
    queue_selector_kwargs: Mapping[str, Json] = field(default_factory=dict)  # keywords of its constructor
    node: str | None = None         # Ray engine: the label (or custom resource) of the nodes its runners go to


@dataclass(frozen=True)
class Step:
    model: str                      # dotted class path
    queue_groups: tuple[QueueGroup, ...]
    num_shared_tensors: int         # output slots per runner; 0 for the final step
    num_segments: int               # 1 = no split
    model_kwargs: Keywords = field(default_factory=dict)  # every other step key


@dataclass(frozen=True)
class PipelineConfig:
    path: str                       # where it came from ("<default>" for the embedded one)
    source: Mapping[str, Json]
    steps: tuple[Step, ...]
    run: Mapping[str, Json]         # defaults for CLI values ("videos", "mean_interval_ms", ...)
    raw: JsonObject                 # the parsed JSON as written, copied into the job log
    notes: tuple[str, ...] = ()     # what was mapped from the original RnB's vocabulary (rnb.pipeline.original)




def did_you_mean(key: str, known: Sequence[str]) -> str:
    """A refusal's hint for a misspelt key: ` (did you mean "pipeline"?)`, or '' when none is close."""
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean \"{close[0]}\"?)" if close else ""


def describe(value: Json) -> str:
    """Name a JSON value the way a user wrote it, short enough for a one-line error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = json.dumps(value)
    if len(text) > 40:
        text = text[:37] + "..."
    if isinstance(value, str):
        return f"the string {text}"
    if isinstance(value, list):
        return f"the list {text}"
    return f"the object {text}"
