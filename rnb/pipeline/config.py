"""Pipeline configuration: a config file read, checked and typed, the form every other part takes it in.

A module a job: config_records (the typed form, ConfigError, how a refusal
names a value), config_json (the file read as JSON, refusing what json
would accept silently), config_checks (its meaning: keys, steps, queues,
keywords) and run_keys (the keys of its "run" object besides the load
modes').  Importers take the public names from here.
"""
from __future__ import annotations

from rnb.pipeline import DEFAULT_CONFIG_PATH
from rnb.pipeline.config_checks import merges_segments, parse_config
from rnb.pipeline.config_json import read_document
from rnb.pipeline.config_records import ConfigError, PipelineConfig, QueueGroup, Step, describe, did_you_mean

__all__ = ["DEFAULT_CONFIG_PATH", "ConfigError", "PipelineConfig", "QueueGroup", "Step", "describe", "did_you_mean",
           "load_config", "merges_segments", "parse_config"]


def load_config(path: str | None) -> PipelineConfig:
    """Read and fully validate a config file; None means the embedded default.

    The default is found next to the package, not the working directory, so the
    harness runs the same from any directory.
    """
    file = str(DEFAULT_CONFIG_PATH) if path is None else path
    return parse_config(read_document(file), file, "<default>" if path is None else path)
