"""The load generator: puts requests on the request queue, stamped with their enqueue time.

When each request is due is its load mode's (rnb.load: Poisson, bulk,
closed loop, ...); the client sleeps to each due time, takes the next
payload from the config's source and sends it.  In an open loop a full
request queue aborts the job; in the closed loop the engine's
`wait_for_room` holds the next request until the final step finishes one.
LoadGen's multi-stream queries go in lockstep: the room for a whole query
is taken before its first request, so it goes only once every request of
the query before it has finished.
It talks to the engine through a `ClientTransport` (rnb.engines.transport_protocols).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from rnb.core.messages import Offered, Ready, Request
from rnb.core.records import Json
from rnb.core.stages import ENQUEUE
from rnb.core.termination import POLL_S
from rnb.core.timecard import TimeCard, now
from rnb.engines.streams import Dealer, LeakyStreams, mark_frame
from rnb.engines.transport_protocols import ClientTransport
from rnb.load import DUE_FIELD, Arrival, LoadSettings, mode_of
from rnb.pipeline.sources import open_source


@dataclass(frozen=True)
class ClientSpec:
    source: Mapping[str, Json]
    config_path: str
    videos: int
    load: LoadSettings
    seed: int
    job_dir: str = ""   # the job's log directory, where a LoadGen client's logs go


def generate(spec: ClientSpec, transport: ClientTransport) -> None:
    """Send -v requests from the config's source, in the mode the spec asks for, until done or the job ends."""
    payloads = open_source(spec.source, spec.config_path, spec.seed)
    transport.report(Ready("client"))
    if not transport.wait_for_start():
        return
    streams = spec.load.streams or 0
    sender = _Sender(spec, transport, payloads, Dealer(payloads, streams) if streams else None,
                     LeakyStreams(transport, streams) if streams and spec.load.stream_policy == "drop" else None)
    try:
        sender.send()
    finally:   # whatever ended it, the log keeps what was offered
        transport.report(Offered("client", sender.job_clock_start, sender.issued,
                                 tuple(sender.leaky.dropped) if sender.leaky else ()))


class _Sender:
    """The client's loop: each request at its due time, until -v are sent or the job ends; what it issued."""

    def __init__(self, spec: ClientSpec, transport: ClientTransport, payloads: Iterator[object], dealer: Dealer | None,
                 leaky: LeakyStreams | None) -> None:
        self.spec, self.transport, self.payloads, self.dealer, self.leaky = spec, transport, payloads, dealer, leaky
        self.start = time.time()
        self.job_clock_start = self.start - (time.time() - now())   # the card's clock runs behind on other Ray nodes
        self.issued = 0   # requests made so far: items 0 to issued - 1

    def send(self) -> None:
        spec, transport, leaky = self.spec, self.transport, self.leaky
        mode = mode_of(spec.load)
        query = mode.query_size(spec.load)
        # A scenario's latency runs from each request's schedule, as LoadGen's does: Offline's all at the start.
        scheduled = spec.load.scenario is not None
        for item_id, arrival in zip(range(spec.videos), mode.arrivals(spec.load, spec.seed)):
            if arrival.due_s is not None:
                due_at = self.start + arrival.due_s
                transport.waits.waiting(time.time(), due_at, item_id)   # what the stall watch reads
                waited = leaky.sleep_until(due_at) if leaky else _sleep_until(due_at, transport)
                transport.waits.sending()
                if not waited:
                    return
            if item_id % query == 0 and not all(transport.wait_for_room() for _ in range(query)):
                return
            records_due = mode.records_due or (scheduled and (arrival.due_s is not None or mode.saturating))
            request = self.request(item_id, arrival, records_due)
            self.issued += 1
            if not (leaky.offer(arrival.stream or 0, request) if leaky else transport.submit(request)):
                return
        if leaky:
            leaky.drain()

    def request(self, item_id: int, arrival: Arrival, records_due: bool) -> Request:
        """Item `item_id`'s request: its stream's next payload, its card stamped at enqueue with its due time and,
        for a stream's frame, its stream, frame and deadline."""
        spec = self.spec
        try:
            payload = (next(self.payloads) if self.dealer is None or arrival.stream is None
                       else self.dealer.next_for(arrival.stream))
        except StopIteration:
            raise ValueError(f"{spec.config_path}: source: ran out after {item_id} requests, "
                             f"but -v asks for {spec.videos}") from None
        card = TimeCard(item_id, repr(payload))
        card.record(ENQUEUE)
        due = self.job_clock_start + (arrival.due_s or 0.0)
        if records_due:
            card.set_field(DUE_FIELD, due)
        if arrival.stream is not None and arrival.frame is not None:
            mark_frame(card, arrival.stream, arrival.frame, due + spec.load.deadline_s if spec.load.streams else None)
        return Request(payload, card)


def _sleep_until(due: float, transport: ClientTransport) -> bool:
    """Sleep to an absolute time so gaps do not drift; False if the job ended meanwhile."""
    while (left := due - time.time()) > 0:
        if transport.stopped:
            return False
        time.sleep(min(left, POLL_S))
    return not transport.stopped
