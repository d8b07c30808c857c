"""A slower network in front of the test server: a loopback TCP relay with a bandwidth and a round-trip time.

Loopback moves bytes at memory speed with no latency, which flatters every
path that makes many requests. nginx's own `limit_rate` cannot stand in for
a link: it limits each request alone (concurrent requests each get the full
rate) and lets each request send a second's worth of bytes before it
throttles, so range requests of a few hundred kilobytes are never slowed.

The relay runs as its own process (this file run as a script),
so its timing does not share an interpreter with what is measured. Each
direction is one link shared by every connection: bytes leave in order at
`mbit_per_s` (serialisation) and arrive half a round trip later
(propagation), chunk by chunk, so a long response streams at the link's rate
while a request and its reply cost one round trip; opening a connection
costs one more, as a TCP handshake does. A connection's end crosses the
link after its last byte. The relay's own CPU is part of what a bench pays
for the link on a small host, so each chunk costs one timer and one write
(asyncio protocols, no task or queue per chunk).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import AnyStr

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class NetworkProfile:
    """A link: bandwidth in megabits per second, round-trip time in milliseconds."""

    mbit_per_s: float
    rtt_ms: float

    def __post_init__(self) -> None:
        if self.mbit_per_s <= 0 or self.rtt_ms < 0:
            raise ValueError(f"a network profile needs mbit_per_s > 0 and rtt_ms >= 0, got {self}")

    @property
    def bytes_per_s(self) -> float:
        return self.mbit_per_s * 1e6 / 8

    def __str__(self) -> str:
        return f"{self.mbit_per_s:g} Mbit/s, {self.rtt_ms:g} ms RTT"


WAN = NetworkProfile(mbit_per_s=100, rtt_ms=20)
SLOW_WAN = NetworkProfile(mbit_per_s=20, rtt_ms=80)  # a far or shared link: another continent, a busy uplink


class _Link:
    """One direction of the wire: when the last byte queued so far will have left."""

    def __init__(self, bytes_per_s: float) -> None:
        self.bytes_per_s = bytes_per_s
        self.free_at = 0.0

    def departure(self, now: float, size: int) -> float:
        """Queue `size` bytes at time `now`; the time their last byte leaves."""
        self.free_at = max(self.free_at, now) + size / self.bytes_per_s
        return self.free_at


class _End(asyncio.Protocol):
    """One socket of a relayed connection: what it receives crosses `link` to its peer, the other socket.

    What is on the wire towards the peer waits in `wire` in order, each
    chunk with its arrival time, its end (None) last; one timer at a time
    writes whatever has arrived when it fires and waits for the next, so the
    relay spends a deque entry and at most one timer on a chunk.
    """

    def __init__(self, link: _Link, one_way_s: float) -> None:
        self.link, self.one_way_s = link, one_way_s
        self.transport: asyncio.Transport | None = None
        self.peer: _End | None = None
        self.held: list[bytes] = []   # what came before the peer was connected
        self.wire: collections.deque[tuple[float, memoryview | None]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def join(self, peer: _End) -> None:
        """Carry to `peer` from now on, what came before first (its end too, where it came)."""
        self.peer = peer
        for data in self.held:
            self.data_received(data)
        self.held.clear()
        if self.ended:
            self._send(None, 0)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.held.append(data)
            return
        view = memoryview(data)
        for at in range(0, len(data), _CHUNK):
            self._send(view[at:at + _CHUNK], min(_CHUNK, len(data) - at))

    def eof_received(self) -> bool:
        self._end()
        return True  # the peer closes this socket once the end has crossed

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            if self.peer is not None:
                self._send(None, 0)

    def _send(self, chunk: memoryview | None, size: int) -> None:
        """Put `size` bytes (or the end, None) on the wire, due when their last byte has crossed."""
        loop = asyncio.get_running_loop()
        due = self.link.departure(loop.time(), size) if size else loop.time()
        self.wire.append((due + self.one_way_s, chunk))
        if self.timer is None:
            self.timer = loop.call_at(self.wire[0][0], self._arrive)

    def _arrive(self) -> None:
        """Hand the peer every chunk that has arrived by now, in order; wait for the next."""
        assert self.peer is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self.wire and self.wire[0][0] <= now:
            _, chunk = self.wire.popleft()
            if chunk is None:
                self.peer.close()
            else:
                self.peer.write(chunk)
        self.timer = loop.call_at(self.wire[0][0], self._arrive) if self.wire else None

    def write(self, data: memoryview) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.transport.close()
        self._end()

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def _relay(listen_port: int, upstream_port: int, profile: NetworkProfile) -> None:
    loop = asyncio.get_running_loop()
    up, down = _Link(profile.bytes_per_s), _Link(profile.bytes_per_s)
    one_way = profile.rtt_ms / 2000

    connecting: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references to tasks

    def accepted() -> _End:
        client = _End(up, one_way)
        task = loop.create_task(connect(client))
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    async def connect(client: _End) -> None:
        await asyncio.sleep(2 * one_way)  # the handshake's round trip
        try:
            _, server = await loop.create_connection(lambda: _End(down, one_way), "127.0.0.1", upstream_port)
        except OSError:
            client.close()
            return
        server.join(client)
        client.join(server)

    server = await loop.create_server(accepted, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen[AnyStr]) -> None:
    """Terminate a helper process we started, kill it if it lingers, and close its pipes."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@contextlib.contextmanager
def slow_link(upstream_port: int, profile: NetworkProfile, timeout_s: float = 20.0) -> Iterator[int]:
    """Run the relay to 127.0.0.1:`upstream_port` until the block exits; yields the port to connect to."""
    port = free_port()
    # Run as a script, not `-m episodes...`: the package's __init__ would load torch for nothing.
    command = [sys.executable, __file__, str(port), str(upstream_port), str(profile.mbit_per_s), str(profile.rtt_ms)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None  # both are pipes
    try:
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline() if ready else ""
        if line.strip() != "ready":
            proc.kill()
            raise RuntimeError(f"the network relay did not start within {timeout_s} s: {line.strip()!r} "
                               f"{stderr.read()[-500:]}")
        yield port
    finally:
        stop_process(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="network.py", description=__doc__.splitlines()[0])
    parser.add_argument("listen_port", type=int)
    parser.add_argument("upstream_port", type=int)
    parser.add_argument("mbit_per_s", type=float)
    parser.add_argument("rtt_ms", type=float)
    args = parser.parse_args(argv)
    profile = NetworkProfile(args.mbit_per_s, args.rtt_ms)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_relay(args.listen_port, args.upstream_port, profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
