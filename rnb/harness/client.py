"""The load generator: puts requests on the request queue, stamped with their enqueue time.

Three modes.  Poisson (-mi > 0): open loop with exponential gaps, it never
waits for completions, and a full request queue aborts the job.  Bulk
(-mi 0): all requests at once.  Closed loop (--concurrency N): N requests in
flight, the next one sent as the final step finishes one; -mi is ignored.
"""
from __future__ import annotations

import queue
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping

from rnb.harness.control import POLL_S, Plumbing, Termination
from rnb.harness.child import child_main
from rnb.pipeline.sources import open_source
from rnb.harness.timecard import TimeCard


@dataclass(frozen=True)
class ClientSpec:
    source: Mapping[str, Any]
    config_path: str
    videos: int
    mean_interval_ms: float
    concurrency: int | None
    seed: int


def main(spec: ClientSpec, plumbing: Plumbing) -> None:
    """Process entry point."""
    child_main("client", plumbing, lambda: generate(spec, plumbing))


def generate(spec: ClientSpec, plumbing: Plumbing) -> None:
    payloads = open_source(spec.source, spec.config_path, spec.seed)
    plumbing.status.put(("ready", "client", []))
    if not plumbing.wait_for_start():
        return
    rng = random.Random(spec.seed)
    poisson = spec.concurrency is None and spec.mean_interval_ms > 0
    due = time.time()
    for item_id in range(spec.videos):
        if poisson:
            due += rng.expovariate(1000.0 / spec.mean_interval_ms)
            if not _sleep_until(due, plumbing):
                return
        if plumbing.in_flight is not None and not _acquire(plumbing):
            return
        if plumbing.flag.is_set:
            return
        try:
            payload = next(payloads)
        except StopIteration:
            raise ValueError(f"{spec.config_path}: source: ran out after {item_id} requests, but -v asks for {spec.videos}") from None
        card = TimeCard(item_id, repr(payload))
        card.record("enqueue")
        try:
            plumbing.requests.put_nowait((payload, card))
        except queue.Full:
            plumbing.flag.raise_(Termination.REQUEST_QUEUE_FULL)
            return


def _sleep_until(due: float, plumbing: Plumbing) -> bool:
    """Sleep to an absolute time so gaps do not drift; False if the job ended meanwhile."""
    while (left := due - time.time()) > 0:
        if plumbing.flag.is_set:
            return False
        time.sleep(min(left, POLL_S))
    return not plumbing.flag.is_set


def _acquire(plumbing: Plumbing) -> bool:
    while not plumbing.in_flight.acquire(timeout=POLL_S):
        if plumbing.flag.is_set:
            return False
    return True
