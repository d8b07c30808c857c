"""What LoadGen is asked to run for a job: its TestSettings from the job's flags, and when it cannot run at all."""
from __future__ import annotations

import importlib.util
from typing import Any

from rnb.engines.registry import ENGINES, engine_named
from rnb.load import SCENARIOS, LoadSettings

MODULE = "mlperf_loadgen"   # what `pip install '.[loadgen]'` (mlcommons-loadgen) installs
# Offline's query holds max(min_query_count, 1.1 * min_duration * offline_expected_qps) samples (LoadGen's slack).
OFFLINE_SLACK = 1.1


def loadgen_refusal(engine: str, max_duration_s: float) -> str | None:
    """Why a job cannot have LoadGen as its client, as a refusal's `expected ..., found ...`; None when it can."""
    if importlib.util.find_spec(MODULE) is None:
        return (f"expected MLPerf LoadGen's Python package installed (pip install '.[loadgen]'), found no {MODULE} "
                "module")
    refusal = engine_named(engine).loadgen_refusal
    if refusal is not None:
        able = " or ".join(name for name, able in ENGINES.items() if able.loadgen_refusal is None)
        return f"expected the {able} engine, found the {engine} engine: {refusal}"
    if max_duration_s:
        return (f"expected no --max-duration beside it, found {max_duration_s:g} s: LoadGen ends its run when its "
                "last query completes, and a job ended before then would leave LoadGen waiting for samples")
    return None


def queries_of(load: LoadSettings, videos: int) -> int:
    """The queries -v makes: -v requests, in queries of --samples-per-query for multi-stream."""
    return videos // load.samples_per_query if load.scenario == "multi-stream" else videos


def test_settings(lg: Any, load: LoadSettings, videos: int, seed: int) -> Any:
    """LoadGen's TestSettings for the job: exactly -v's queries (its min and max query count), the job's minimum
    duration, Server's rate 1000 / -mi and target latency, the stream scenarios' expected latency and query size."""
    spec = SCENARIOS[load.scenario or "server"]
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, spec.loadgen)
    settings.mode = lg.TestMode.PerformanceOnly
    settings.min_query_count = settings.max_query_count = queries_of(load, videos)
    settings.min_duration_ms = int(load.min_duration_ms)
    settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = seed
    target_ns = int((load.scenario_target_ms or 0.0) * 1e6)
    if spec.name == "server":
        settings.server_target_qps = 1000.0 / load.mean_interval_ms
        settings.server_target_latency_ns = target_ns
    elif spec.name == "single-stream":
        settings.single_stream_expected_latency_ns = target_ns
    elif spec.name == "multi-stream":
        settings.multi_stream_expected_latency_ns = target_ns
        settings.multi_stream_samples_per_query = load.samples_per_query
    elif load.min_duration_ms > 0:
        # Offline's one query of exactly -v samples: at most -v from the expected rate, -v from the query count.
        settings.offline_expected_qps = videos / (OFFLINE_SLACK * load.min_duration_ms / 1000.0)
    return settings
