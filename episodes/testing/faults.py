"""An HTTP server that misbehaves on purpose, for tests and the reliability bench.

It serves a directory and answers Range requests itself, except when its
fault schedule says otherwise for a request: the whole file (a server that
ignores Range), another range than the one asked for, a 503, a body cut
short, or a connection closed without an answer.  Whatever it does, a
reader must either get exactly the bytes it asked for or raise a FetchError
that blames the server: never wrong bytes, never a hang.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAULTS = ("ignore_range", "shift", "status_503", "cut_short", "drop")
# fault schedule: the 0-based number of a range request -> the fault to commit, or None to answer right
Schedule = Callable[[int], str | None]


class _Handler(SimpleHTTPRequestHandler):
    schedule: Schedule = staticmethod(lambda n: None)
    counter = [0]
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if wanted is None or not path.is_file():
            super().do_GET()  # no Range: the stdlib server's whole file (or its 404)
            return
        with self.lock:
            fault = self.schedule(self.counter[0])
            self.counter[0] += 1
        data = path.read_bytes()
        start, end = int(wanted[1]), min(int(wanted[2]), len(data) - 1)
        if fault == "ignore_range":
            super().do_GET()
        elif fault == "status_503":
            self.send_error(503, "Service Unavailable")
        elif fault == "drop":
            self.close_connection = True
            self.connection.close()
        else:
            self._answer(data, start + (1 if fault == "shift" else 0), end + (1 if fault == "shift" else 0),
                         cut=fault == "cut_short")

    def _answer(self, data: bytes, start: int, end: int, cut: bool) -> None:
        body = data[start:end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)
        if cut:
            self.close_connection = True


@contextmanager
def serve_with_faults(root: Path, schedule: Schedule) -> Iterator[str]:
    """Serve `root` on 127.0.0.1 with `schedule` deciding each range request's fault; yields the base URL."""
    handler = type("Handler", (_Handler,), {"schedule": staticmethod(schedule), "counter": [0],
                                            "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
