"""Every load key's value for one job, as one record."""
from __future__ import annotations

from dataclasses import dataclass

from rnb.load.scenarios import SCENARIOS


@dataclass(frozen=True)
class LoadSettings:
    """Every load key's value for one job, after command line, config and defaults are combined.

    The fields are the run keys of the modes below (a test holds the two to
    each other); meta.json's `args` holds them flat, beside the job's other
    settings.
    """

    mean_interval_ms: float = 3.0
    concurrency: int | None = None
    streams: int | None = None
    fps: float = 30.0
    stream_phase: str = "spread"
    jitter_ms: float = 0.0
    deadline_ms: float | None = None    # None: one frame period, 1000 / fps
    stream_policy: str = "queue"
    arrivals: str | None = None         # a trace: a CSV or Parquet file of offsets, or a job's log directory
    rate_schedule: str | None = None    # "100@10s,300@5s" or ramps "100-300@10s": requests/s for each span
    scenario: str | None = None         # a LoadGen scenario's name (SCENARIOS): its load, and its rules for the verdict
    samples_per_query: int = 8          # multi-stream: samples issued together, the next query once all are done
    target_latency_ms: float | None = None   # None: the scenario's LoadGen default (Scenario.target_latency_ms)
    min_duration_ms: float = 10000.0    # a scenario's minimum duration, LoadGen's min_duration_ms (its default)
    client: str = "rnb"                 # who issues the requests: RnB's client, or MLPerf LoadGen ("loadgen")

    @property
    def scenario_target_ms(self) -> float | None:
        """The scenario's target latency: --target-latency-ms, else LoadGen's default for it (None for offline)."""
        spec = SCENARIOS.get(self.scenario or "")
        return self.target_latency_ms if self.target_latency_ms is not None or spec is None else spec.target_latency_ms

    @property
    def deadline_s(self) -> float:
        """How long after its due time a stream's frame may finish and not be late."""
        return (1000.0 / self.fps if self.deadline_ms is None else self.deadline_ms) / 1000.0
