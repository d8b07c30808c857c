"""MLPerf LoadGen's scenarios: what each issues and the defaults LoadGen judges it by, and the keys that choose one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rnb.load.inputs import MAX_WAIT_S
from rnb.load.keys import MAX_SEMAPHORE_VALUE, RunKey, Setting

if TYPE_CHECKING:
    from rnb.load.settings import LoadSettings


@dataclass(frozen=True)
class Scenario:
    """One of MLPerf LoadGen's scenarios: its name there, what it issues, and the defaults LoadGen judges it by.

    The percentile is the one LoadGen reports and early stopping bounds (its
    TestSettings defaults); the target latency is Server's bound
    (server_target_latency_ns) and, for the stream scenarios, the latency
    LoadGen expects (single_stream_expected_latency_ns,
    multi_stream_expected_latency_ns), which only sizes its schedule.
    """

    name: str                          # as --scenario spells it
    loadgen: str                       # mlperf_loadgen.TestScenario's member
    percentile: float                  # 0.99 is 99th
    target_latency_ms: float | None    # LoadGen's default; None: Offline has none

    def sets(self, settings: LoadSettings) -> dict[str, Setting]:
        """The load keys the scenario gives RnB's client (docs/running.md puts LoadGen's definitions beside them)."""
        sets: dict[str, dict[str, Setting]] = {"offline": {"mean_interval_ms": 0}, "single-stream": {"concurrency": 1},
                                               "multi-stream": {"concurrency": settings.samples_per_query}}
        return sets.get(self.name, {})


SCENARIOS: dict[str, Scenario] = {spec.name: spec for spec in (
    Scenario("offline", "Offline", 0.99, None), Scenario("server", "Server", 0.99, 100.0),
    Scenario("single-stream", "SingleStream", 0.90, 1.0), Scenario("multi-stream", "MultiStream", 0.99, 8.0))}
SCENARIO = RunKey("scenario", ("--scenario",), "NAME",
                  "a LoadGen scenario, issued and judged by LoadGen's rules: offline (-mi 0), server (Poisson at -mi), "
                  "single-stream (one request at a time), multi-stream (queries of --samples-per-query requests in "
                  "lockstep) (default: none, RnB's own verdict)", choices=tuple(SCENARIOS))
SAMPLES_PER_QUERY = RunKey("samples_per_query", ("--samples-per-query",), "N",
                           "multi-stream: requests in each query, issued together, the next query once all of them "
                           "finished (default {default}, LoadGen's)", integral=True, minimum=1, maximum=MAX_SEMAPHORE_VALUE,
                           needs="scenario")
TARGET_LATENCY = RunKey("target_latency_ms", ("--target-latency-ms",), "MS",
                        "server: the bound on the scenario's p99 latency (default 100, LoadGen's "
                        "server_target_latency); single-stream, multi-stream: the latency LoadGen expects, which "
                        "sizes its schedule (defaults 1 and 8, LoadGen's)", minimum=0, above=True,
                        maximum=MAX_WAIT_S * 1000, needs="scenario")
MIN_DURATION = RunKey("min_duration_ms", ("--min-duration-ms",), "MS",   # at most a day: LoadGen issues until it passes
                      "a scenario's minimum duration (default {default:g}, LoadGen's min_duration_ms)",
                      maximum=MAX_WAIT_S * 1000, needs="scenario")
CLIENT = RunKey("client", ("--client",), "NAME", "who issues the scenario's requests: rnb (this harness's client) or "
                "loadgen (MLPerf LoadGen itself, pip install '.[loadgen]') (default {default})", choices=("rnb", "loadgen"),
                needs="scenario")
SCENARIO_KEYS = (SCENARIO, SAMPLES_PER_QUERY, TARGET_LATENCY, MIN_DURATION, CLIENT)
