"""The engines a job can run on, each declared once: what the command, the config check, the launcher and the tuner
need to know of an engine, so that none of them asks for one by name.

An engine is its package (rnb.engines.<name>) plus one entry in ENGINES.
Its driver is named by its import path and imported only when a job runs
on it (rnb.engines.drivers), so this module imports nothing but the
standard library: the launcher reads it before torch is imported, and the
config's checks read it without loading any engine.
"""
from __future__ import annotations

from dataclasses import dataclass


class EngineUnavailable(RuntimeError):
    """The hosts an engine runs on could not be reached or started: the job failed before it began (exit 1)."""


@dataclass(frozen=True)
class Engine:
    """One engine as the rest of RnB sees it."""

    name: str
    help: str                   # what --engine's help says of it
    driver: str                 # "module:function" of its rnb.engines.drivers.Driver
    forks_here: bool            # its job spawns children on this host: rnb.launch starts the fork server for it
    gpus_checked_here: bool     # the command checks the config's GPUs with this host's NVML (else the driver, per node)
    spans_hosts: bool           # the tuner's model: an item's hops cost CPU per item, runners share per-host core pools
    takes_address: bool = False             # --ray-address names the cluster it runs on
    daemon_samples: str = ""                # samples.parquet's prefix of its own daemons' names (the tuner's profile)
    loadgen_refusal: str | None = None      # why LoadGen cannot be its client; None: it can


# Every engine; the first is the default.  Tests may add a stand-in engine here.
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (
    Engine("local", "processes on this host", "rnb.engines.local.driver:run", forks_here=True, gpus_checked_here=True,
           spans_hosts=False),
    Engine("ray", "actors on a Ray cluster", "rnb.engines.ray.entry:run", forks_here=False, gpus_checked_here=False,
           spans_hosts=True, takes_address=True, daemon_samples="ray-daemon:",
           loadgen_refusal="on Ray the final step's actors would have to send each completion to the client actor, "
                           "which holds LoadGen, and that path is not built"),
)}
DEFAULT_ENGINE = next(iter(ENGINES))
# The sample-name prefixes of every engine's daemons: a profile counts their CPU per hop, whatever engine it ran on.
DAEMON_SAMPLES = tuple(engine.daemon_samples for engine in ENGINES.values() if engine.daemon_samples)


def engine_named(name: str) -> Engine:
    """The engine called `name`; KeyError for a name no engine has (the config and the flags check it first)."""
    return ENGINES[name]


def engines_help() -> str:
    """--engine's help: each engine and what it runs on."""
    return "; ".join(f"{engine.name}: {engine.help}" for engine in ENGINES.values())


def spans_hosts(name: str) -> bool:
    """Whether the engine called `name` runs a job's runners on several hosts (the tuner's model, rnb.tune.estimate)."""
    return ENGINES[name].spans_hosts
