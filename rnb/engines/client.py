"""The load generator: puts requests on the request queue, stamped with their enqueue time.

When each request is due is its load mode's (rnb.load: Poisson, bulk,
closed loop, ...); the client sleeps to each due time, takes the next
payload from the config's source and sends it.  In an open loop a full
request queue aborts the job; in the closed loop the engine's
`wait_for_room` holds the next request until the final step finishes one.
It talks to the engine through a `ClientTransport` (rnb.engines.transport).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from rnb.core.messages import Ready, Request
from rnb.core.records import Json
from rnb.core.stages import ENQUEUE
from rnb.core.termination import POLL_S
from rnb.core.timecard import TimeCard, now
from rnb.engines.streams import Dealer, LeakyStreams, mark_frame
from rnb.engines.transport import ClientTransport
from rnb.load import DUE_FIELD, LoadSettings, mode_of
from rnb.pipeline.sources import open_source


@dataclass(frozen=True)
class ClientSpec:
    source: Mapping[str, Json]
    config_path: str
    videos: int
    load: LoadSettings
    seed: int


def generate(spec: ClientSpec, transport: ClientTransport) -> None:
    """Send -v requests from the config's source, in the mode the spec asks for, until done or the job ends."""
    payloads = open_source(spec.source, spec.config_path, spec.seed)
    transport.report(Ready("client"))
    if not transport.wait_for_start():
        return
    streams = spec.load.streams or 0
    dealer = Dealer(payloads, streams) if streams else None
    leaky = LeakyStreams(transport, streams) if streams and spec.load.stream_policy == "drop" else None
    mode = mode_of(spec.load)
    start = time.time()
    job_clock_start = start - (time.time() - now())   # the card's clock runs behind time.time() on other Ray nodes
    for item_id, arrival in zip(range(spec.videos), mode.arrivals(spec.load, spec.seed)):
        if arrival.due_s is not None:
            transport.waits.waiting(time.time(), start + arrival.due_s, item_id)   # what the stall watch reads
            waited = leaky.sleep_until(start + arrival.due_s) if leaky else _sleep_until(start + arrival.due_s, transport)
            transport.waits.sending()
            if not waited:
                return
        if not transport.wait_for_room():
            return
        try:
            payload = next(payloads) if dealer is None or arrival.stream is None else dealer.next_for(arrival.stream)
        except StopIteration:
            raise ValueError(f"{spec.config_path}: source: ran out after {item_id} requests, "
                             f"but -v asks for {spec.videos}") from None
        card = TimeCard(item_id, repr(payload))
        card.record(ENQUEUE)
        due = job_clock_start + (arrival.due_s or 0.0)
        if mode.records_due:
            card.set_field(DUE_FIELD, due)
        if arrival.stream is not None and arrival.frame is not None:
            mark_frame(card, arrival.stream, arrival.frame, due + spec.load.deadline_s if streams else None)
        request = Request(payload, card)
        if not (leaky.offer(arrival.stream or 0, request) if leaky else transport.submit(request)):
            return
    if leaky:
        leaky.drain()


def _sleep_until(due: float, transport: ClientTransport) -> bool:
    """Sleep to an absolute time so gaps do not drift; False if the job ended meanwhile."""
    while (left := due - time.time()) > 0:
        if transport.stopped:
            return False
        time.sleep(min(left, POLL_S))
    return not transport.stopped
