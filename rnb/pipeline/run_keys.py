"""The run keys besides the load modes': each declared once, as rnb.load declares its own.

A key's RunKey holds its range (the config's check and the flag's type both
read it), its flag's spellings, metavar and help; JobSettings holds its
default, and is the record of those settings that the job's RunArgs
(rnb.engines.job) extends.  A help text names its default as `{default}`,
filled in from JobSettings (RunKey.flag_help), so the two cannot disagree.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import rnb.flags as flags
from rnb.engines.registry import DEFAULT_ENGINE, ENGINES
from rnb.load import MAX_SEMAPHORE_VALUE, RunKey, Setting


@dataclass(frozen=True)
class JobSettings:
    """What a job runs besides its load: the value of each key below, by default what applies when neither the
    command line nor the config's "run" object sets it."""

    videos: int = 2000
    batch_size: int = 1
    queue_size: int = 50000
    warmup: int = 10
    seed: int = 0
    stall_s: float = 60.0          # no item leaving any step this long ends the job; 0: never
    max_duration_s: float = 0.0    # measured seconds after which the job ends; 0: no bound
    engine: str = DEFAULT_ENGINE   # an engine's name in rnb.engines.registry


_KEYS = (
    RunKey("videos", flags.VIDEOS, "N", "number of requests to finish (default {default})", integral=True, minimum=1),
    RunKey("batch_size", flags.BATCH, "N", "batch of the batching steps whose config sets none (default {default})",
           integral=True, minimum=1),
    RunKey("queue_size", flags.QUEUE_SIZE, "N", "capacity of every queue (default {default})", integral=True,
           minimum=1, maximum=MAX_SEMAPHORE_VALUE),
    RunKey("warmup", flags.WARMUP, "N", "first N items excluded from latency statistics (default {default})",
           integral=True),
    RunKey("seed", flags.SEED, "N", "seed of the Poisson arrivals and of a random episode order (default {default})",
           integral=True),
    RunKey("stall_s", flags.STALL, "S", "end the job as stalled when items wait and none has left any step for S "
           "seconds (default {default:g}; 0 never)"),
    RunKey("max_duration_s", flags.MAX_DURATION, "S", "end the job after S seconds of measured time, keeping what "
           "it measured (default {default:g}: no maximum)"),
    RunKey("engine", flags.ENGINE, "ENGINE", "the engine that runs the job, one of {choices} (default: "
           "the config's, else {default})", choices=ENGINES),
)
# Every run key besides the load keys once, in JobSettings' order: flags, run keys and RunArgs fields.
RUN_KEYS: dict[str, RunKey] = {field.name: {key.name: key for key in _KEYS}[field.name]
                               for field in dataclasses.fields(JobSettings)}
RUN_DEFAULTS: dict[str, Setting] = dataclasses.asdict(JobSettings())
