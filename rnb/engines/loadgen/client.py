"""The client's role handed to LoadGen: its issue callback sends each sample, a thread completes what finished.

LoadGen calls the issue callback on the thread that started its test, with
a query's samples; each becomes a request with a new time card, sent to
step 0 at once, its item id the next in issue order (so a multi-stream
query's samples are consecutive ids, as RnB's own lockstep client numbers
them).  The final step's hand-over puts the item's id on the engine's
completions channel, and a thread of this process completes the sample
there (QuerySamplesComplete): LoadGen times each sample from its query's
schedule to that call.  The test returns once every sample it issued has
completed; LoadGen has then written its logs into the job's directory.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from rnb.core.messages import Offered, Ready, Request
from rnb.core.stages import ENQUEUE
from rnb.core.termination import POLL_S
from rnb.core.timecard import TimeCard, now
from rnb.engines.client import ClientSpec
from rnb.engines.loadgen.settings import test_settings
from rnb.engines.transport_protocols import ClientTransport
from rnb.pipeline.sources import open_source

LOG_PREFIX = "mlperf_log_"
# What a performance run leaves empty beside its summary and detail: no accuracy is logged, no trace asked for.
EMPTY_LOGS = ("mlperf_log_accuracy.json", "mlperf_log_trace.json")


class Completions(Protocol):
    """Finished items' ids from the final step, as the engine delivers them (a tuple of ids per message)."""

    def get(self, timeout: float) -> Any:
        """The next message; queue.Empty when none came within `timeout` seconds."""


class Issuer:
    """LoadGen's issue callback: each sample becomes a request to step 0, its LoadGen id kept by item id."""

    def __init__(self, transport: ClientTransport, payloads: Sequence[object]) -> None:
        self.transport = transport
        self.payloads = payloads
        self.names = [repr(payload) for payload in payloads]   # each card's payload, made once per sample, not per issue
        self.sample_ids: list[int] = []   # LoadGen's response id of each item, by item id
        self.refused = False               # a request could not go: the job ended (a full request queue ends it)

    def issue(self, samples: Sequence[Any]) -> None:
        for sample in samples:
            item_id = len(self.sample_ids)
            self.sample_ids.append(sample.id)
            card = TimeCard(item_id, self.names[sample.index])
            card.record(ENQUEUE)
            if not self.refused and not self.transport.submit(Request(self.payloads[sample.index], card)):
                self.refused = True


class Completer:
    """A thread completing each finished item's sample in LoadGen, until told to stop."""

    def __init__(self, lg: Any, issuer: Issuer, completions: Completions) -> None:
        self.lg = lg
        self.issuer = issuer
        self.completions = completions
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="loadgen-completer", daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                ids = self.completions.get(POLL_S)
            except queue.Empty:
                continue
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(self.issuer.sample_ids[item], 0, 0)
                                          for item in ids])


def drive(spec: ClientSpec, transport: ClientTransport, completions: Completions) -> None:
    """The job's client: LoadGen's test of the job's scenario, its samples the source's first -v payloads."""
    import mlperf_loadgen as lg  # here: the package is optional, and only this process needs it

    payloads = list(itertools.islice(open_source(spec.source, spec.config_path, spec.seed), spec.videos))
    if not payloads:
        raise ValueError(f"{spec.config_path}: source: gave no request for LoadGen's sample library")
    transport.report(Ready("client"))
    if not transport.wait_for_start():
        return
    issuer = Issuer(transport, payloads)
    completer = Completer(lg, issuer, completions)
    sut = lg.ConstructSUT(issuer.issue, lambda: None)
    qsl = lg.ConstructQSL(len(payloads), len(payloads), lambda indices: None, lambda indices: None)
    completer.thread.start()
    started = now()
    try:
        lg.StartTestWithLogSettings(sut, qsl, test_settings(lg, spec.load, spec.videos, spec.seed),
                                    log_settings(lg, Path(spec.job_dir)))
    finally:
        completer.done.set()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        transport.report(Offered("client", started, len(issuer.sample_ids)))   # the log keeps what LoadGen issued
    for name in EMPTY_LOGS:
        (Path(spec.job_dir) / name).unlink(missing_ok=True)


def log_settings(lg: Any, job_dir: Path) -> Any:
    """LoadGen's logs into the job's directory, without its trace (a per-sample timeline the time cards hold)."""
    settings = lg.LogSettings()
    settings.log_output.outdir = str(job_dir)
    settings.log_output.prefix = LOG_PREFIX
    settings.enable_trace = False
    return settings

