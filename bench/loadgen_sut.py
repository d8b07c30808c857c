"""The floor a harness can reach: LoadGen's plainest system under test, threads that sleep and complete in-process.

`plain_sut` runs one LoadGen test against `workers` threads, each taking the
next sample, sleeping `step_ms` and completing it: the work of an RnB
pipeline of one models.toy.SyncSleep step on `workers` replicas, with
nothing between LoadGen and the work but a queue.  The test's settings are
the ones `--client loadgen` gives LoadGen for the same flags
(rnb.engines.loadgen.settings), so the two runs differ only in what serves
the samples.  It runs in a process of its own (bench.bounded.isolated):
LoadGen keeps one test per process.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

from rnb.analysis.loadgen_log import read_detail
from rnb.core.records import Json
from rnb.engines.loadgen.client import log_settings
from rnb.engines.loadgen.settings import test_settings
from rnb.load import LoadSettings


def plain_sut(load: LoadSettings, videos: int, seed: int, step_ms: float, workers: int, outdir: str) -> dict[str, Json]:
    """LoadGen's detail log of one test of the plain SUT, by key."""
    import mlperf_loadgen as lg

    work: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def serve() -> None:
        while (sample := work.get()) is not None:
            time.sleep(step_ms / 1000.0)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(sample.id, 0, 0)])

    def issue(samples: list[Any]) -> None:
        for sample in samples:
            work.put(sample)

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(videos, videos, lambda indices: None, lambda indices: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, test_settings(lg, load, videos, seed), log_settings(lg, Path(outdir)))
    finally:
        for _ in threads:
            work.put(None)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    detail = read_detail(Path(outdir))
    if detail is None:
        raise RuntimeError(f"LoadGen wrote no detail log into {outdir}")
    return detail
