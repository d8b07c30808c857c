"""The load generator: puts requests on the request queue, stamped with their enqueue time.

Three modes.  Poisson (-mi > 0): open loop with exponential gaps, it never
waits for completions, and a full request queue aborts the job.  Bulk
(-mi 0): all requests at once.  Closed loop (--concurrency N): N requests in
flight, the next one sent as the final step finishes one; -mi is ignored.
It talks to the engine through a `ClientTransport` (rnb.engines.transport).
"""
from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

from rnb.core.messages import Ready, Request
from rnb.core.records import Json
from rnb.core.stages import ENQUEUE
from rnb.core.termination import POLL_S
from rnb.core.timecard import TimeCard
from rnb.engines.transport import ClientTransport
from rnb.pipeline.sources import open_source


@dataclass(frozen=True)
class ClientSpec:
    source: Mapping[str, Json]
    config_path: str
    videos: int
    mean_interval_ms: float
    concurrency: int | None
    seed: int


def generate(spec: ClientSpec, transport: ClientTransport) -> None:
    """Send -v requests from the config's source, in the mode the spec asks for, until done or the job ends."""
    payloads = open_source(spec.source, spec.config_path, spec.seed)
    transport.report(Ready("client"))
    if not transport.wait_for_start():
        return
    rng = random.Random(spec.seed)
    poisson = spec.concurrency is None and spec.mean_interval_ms > 0
    due = time.time()
    for item_id in range(spec.videos):
        if poisson:
            due += rng.expovariate(1000.0 / spec.mean_interval_ms)
            if not _sleep_until(due, transport):
                return
        if not transport.wait_for_room():
            return
        try:
            payload = next(payloads)
        except StopIteration:
            raise ValueError(f"{spec.config_path}: source: ran out after {item_id} requests, "
                             f"but -v asks for {spec.videos}") from None
        card = TimeCard(item_id, repr(payload))
        card.record(ENQUEUE)
        if not transport.submit(Request(payload, card)):
            return


def _sleep_until(due: float, transport: ClientTransport) -> bool:
    """Sleep to an absolute time so gaps do not drift; False if the job ended meanwhile."""
    while (left := due - time.time()) > 0:
        if transport.stopped:
            return False
        time.sleep(min(left, POLL_S))
    return not transport.stopped
