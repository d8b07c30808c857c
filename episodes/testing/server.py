"""A real HTTP server for a dataset directory: Debian's nginx on a free loopback port.

It lives in `episodes/testing/`, beside the storage layer it exercises but
outside the library, because both the tests and the benchmarks (bench/)
serve datasets with it: benchmark code must not import the test tree, and
tests must not import bench/.

Byte ranges are nginx's default for static files. Extra locations inject
faults: `/fault503/...` always answers 503, and `/slow/...` serves the same
files at one byte per second, so a client timeout fires. `/nolist/...`
serves the files without directory listings, like most CDNs.

With a NetworkProfile (episodes.testing.network) the server is reached
through a relay that gives it that bandwidth and round-trip time.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from episodes.testing.network import NetworkProfile, free_port, slow_link, stop_process

DEBIAN_NGINX = "/usr/sbin/nginx"   # where Debian's package puts it, on root's PATH but not always on a user's
LOG_SETTLE_S = 0.05  # how long a count of the access log must hold still before it is believed


def nginx_binary() -> str | None:
    """nginx on PATH, else Debian's: where scripts/setup.sh looks before it installs the package; None if neither."""
    return shutil.which("nginx") or (DEBIAN_NGINX if os.access(DEBIAN_NGINX, os.X_OK) else None)

_CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ application/json json; video/mp4 mp4; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        location / {{ root {root}; autoindex on; }}
        location /fault503/ {{ return 503; }}
        location /slow/ {{ alias {root}/; limit_rate 1; }}
        location /nolist/ {{ alias {root}/; autoindex off; }}
    }}
}}
"""


@dataclass(frozen=True)
class NginxServer:
    """A running server: `url` ends without a slash; `access_log` lists every request."""

    url: str
    access_log: Path

    def requests(self, path_part: str) -> int:
        """How many requests so far had `path_part` in their request line.

        nginx logs a request after its response has gone, so a client can
        have the answer before the line is written: the count is read until
        two reads LOG_SETTLE_S apart agree.
        """
        count = self._count(path_part)
        while True:
            time.sleep(LOG_SETTLE_S)
            again = self._count(path_part)
            if again == count:
                return count
            count = again

    def _count(self, path_part: str) -> int:
        if not self.access_log.exists():
            return 0
        return sum(path_part in line for line in self.access_log.read_text().splitlines())


@contextlib.contextmanager
def serve_directory(root: Path, tmp: Path, timeout_s: float = 10.0,
                    profile: NetworkProfile | None = None) -> Iterator[NginxServer]:
    """Run nginx on a free loopback port serving `root` until the block exits; its files go under `tmp`.

    With `profile`, the yielded url leads through a relay with that bandwidth and round-trip time.
    """
    nginx = nginx_binary()
    if nginx is None:
        raise FileNotFoundError(f"found no nginx on PATH or at {DEBIAN_NGINX}: install Debian's nginx package to serve "
                                "datasets over HTTP")
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = tmp / "nginx.conf"
    config.write_text(_CONFIG.format(tmp=tmp, port=port, root=Path(root).resolve()))
    proc = subprocess.Popen([nginx, "-c", str(config), "-p", str(tmp), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr
    assert stderr is not None  # a pipe
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited at start-up: {stderr.read().decode(errors='replace')}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not listen on port {port} within {timeout_s} s")
            time.sleep(0.05)
        with contextlib.ExitStack() as link:
            if profile is not None:
                port = link.enter_context(slow_link(port, profile))
            yield NginxServer(url=f"http://127.0.0.1:{port}", access_log=tmp / "access.log")
    finally:
        stop_process(proc)
