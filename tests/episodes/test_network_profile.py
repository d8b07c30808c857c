"""The test server's network profile: a relay that gives loopback a bandwidth and a round-trip time."""
from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec
import pytest

from episodes.testing.network import SLOW_WAN, WAN, NetworkProfile
from episodes.testing.server import serve_directory

pytestmark = pytest.mark.nginx

BLOB = os.urandom(600_000)


def test_the_relay_delivers_every_byte_no_faster_than_the_link(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "blob").write_bytes(BLOB)
    profile = NetworkProfile(mbit_per_s=8, rtt_ms=100)  # 1 MB/s: easy to tell from loopback
    with serve_directory(tmp_path / "www", tmp_path / "nginx", profile=profile) as server:
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        url = f"{server.url}/blob"
        started = time.perf_counter()
        assert fs.cat_file(url, start=10, end=20) == BLOB[10:20]
        assert time.perf_counter() - started >= 0.1  # a request and its reply cost at least one round trip
        started = time.perf_counter()
        assert fs.cat_file(url, start=0, end=500_000) == BLOB[:500_000]
        assert time.perf_counter() - started >= 0.5 + 0.1  # 500 kB at 1 MB/s, plus the round trip
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(lambda k: fs.cat_file(url, start=k * 100_000, end=(k + 1) * 100_000), range(4)))
        assert b"".join(parts) == BLOB[:400_000]
        assert time.perf_counter() - started >= 0.4  # concurrent requests share one link
        port = int(server.url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()  # the relay is gone with the server


def test_a_profile_must_be_a_link() -> None:
    with pytest.raises(ValueError, match="needs mbit_per_s > 0 and rtt_ms >= 0"):
        NetworkProfile(mbit_per_s=0, rtt_ms=20)
    assert str(NetworkProfile(100, 20)) == str(WAN) == "100 Mbit/s, 20 ms RTT"
    assert str(SLOW_WAN) == "20 Mbit/s, 80 ms RTT" and SLOW_WAN.bytes_per_s == 2.5e6


def test_a_client_that_hangs_up_mid_answer_leaves_the_relay_serving_others(tmp_path: Path) -> None:
    """A connection's end crosses the link: the relay closes the server's side and goes on relaying the rest."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "blob").write_bytes(BLOB)
    with serve_directory(tmp_path / "www", tmp_path / "nginx", profile=NetworkProfile(8, 20)) as server:
        host, port = server.url.removeprefix("http://").split(":")
        request = f"GET /blob HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        with socket.create_connection((host, int(port)), timeout=5) as rude:
            rude.sendall(request)
            assert rude.recv(12) == b"HTTP/1.1 200"  # the answer has begun to cross; hang up in its middle
        with socket.create_connection((host, int(port)), timeout=10) as polite:
            polite.sendall(request)
            answer = b""
            while chunk := polite.recv(1 << 16):  # the server's end crosses once its last byte has
                answer += chunk
        assert answer.endswith(b"\r\n\r\n" + BLOB)
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        assert fs.cat_file(f"{server.url}/blob", start=599_990, end=600_000) == BLOB[-10:]
