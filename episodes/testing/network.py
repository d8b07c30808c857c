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
costs one more, as a TCP handshake does.
"""
from __future__ import annotations

import argparse
import asyncio
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


async def _carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, one_way_s: float) -> None:
    """Move bytes from `reader` to `writer` as the link would: in order, serialised, then delayed."""
    loop = asyncio.get_running_loop()
    arrivals: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await arrivals.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                writer.write_eof() if writer.can_write_eof() else writer.close()
                return
            writer.write(data)
            await writer.drain()

    delivering = asyncio.create_task(deliver())
    try:
        while data := await reader.read(_CHUNK):
            arrivals.put_nowait((link.departure(loop.time(), len(data)) + one_way_s, data))
        arrivals.put_nowait((loop.time() + one_way_s, b""))
        await delivering
    except (ConnectionError, asyncio.CancelledError):
        delivering.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _relay(listen_port: int, upstream_port: int, profile: NetworkProfile) -> None:
    up, down = _Link(profile.bytes_per_s), _Link(profile.bytes_per_s)
    one_way = profile.rtt_ms / 2000

    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(2 * one_way)  # the handshake's round trip
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_carry(client_reader, server_writer, up, one_way),
                             _carry(server_reader, client_writer, down, one_way))

    server = await asyncio.start_server(connection, "127.0.0.1", listen_port)
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
