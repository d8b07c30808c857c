"""An HTTP server that misbehaves on purpose, for tests and the reliability bench.

It serves a directory and answers Range requests itself, except when its
fault schedule says otherwise for a request: the whole file (a server that
ignores Range), another range than the one asked for, a 503, a body cut
short, or a connection closed without an answer.  Whatever it does, a
reader must either get exactly the bytes it asked for or raise a FetchError
that blames the server: never wrong bytes, never a hang.

Two more faults stop answering without failing (HANGS): "stall" takes the
request and never answers, "trickle" answers a byte every `trickle_s`
seconds.  A reader must give up within its timeout per attempt.  With
`every_request` the schedule also decides whole-file requests and HEADs
(a server that stopped answering altogether); otherwise it sees only range
requests.  Hung answers end when the server closes.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FAULTS = ("ignore_range", "shift", "status_503", "cut_short", "drop")
HANGS = ("stall", "trickle")
# fault schedule: the 0-based number of a range request -> the fault to commit, or None to answer right
Schedule = Callable[[int], str | None]
# faults by place: a range request's URL path and its first and last byte -> the fault to commit, or None
RangeFaults = Callable[[str, int, int], str | None]


class _Handler(SimpleHTTPRequestHandler):
    schedule: Schedule = staticmethod(lambda n: None)
    by_range: RangeFaults = staticmethod(lambda path, first, last: None)
    counter = [0]
    lock = threading.Lock()
    closing = threading.Event()   # set when the server closes: hung answers end
    every_request = False
    trickle_s = 1.0

    def log_message(self, *args: object) -> None:
        pass

    def _next_fault(self) -> str | None:
        with self.lock:
            fault = self.schedule(self.counter[0])
            self.counter[0] += 1
        return fault

    def do_HEAD(self) -> None:
        fault = self._next_fault() if self.every_request else None
        if fault in HANGS:
            self._hang(fault, b"x" * 1024, 0, 1023)
        else:
            super().do_HEAD()

    def do_GET(self) -> None:
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        path = Path(self.translate_path(self.path))
        if wanted is None or not path.is_file():
            fault = self._next_fault() if self.every_request else None
            if fault in HANGS and path.is_file():
                data = path.read_bytes()
                self._hang(fault, data, 0, len(data) - 1)
            else:
                super().do_GET()  # no Range: the stdlib server's whole file (or its 404)
            return
        numbered = self._next_fault()
        data = path.read_bytes()
        start, end = int(wanted[1]), min(int(wanted[2]), len(data) - 1)
        fault = self.by_range(self.path, start, end) or numbered
        if fault in HANGS:
            self._hang(fault, data, start, end)
        elif fault == "ignore_range":
            super().do_GET()
        elif fault == "status_503":
            self.send_error(503, "Service Unavailable")
        elif fault == "drop":
            self.close_connection = True
            self.connection.close()
        else:
            self._answer(data, start + (1 if fault == "shift" else 0), end + (1 if fault == "shift" else 0),
                         cut=fault == "cut_short")

    def _hang(self, fault: str | None, data: bytes, start: int, end: int) -> None:
        """"stall": say nothing until the server closes; "trickle": a valid answer, one byte every trickle_s."""
        if fault == "stall":
            self.closing.wait()
        else:
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for byte in range(len(body)):
                if self.closing.wait(self.trickle_s):
                    break
                try:
                    self.wfile.write(body[byte:byte + 1])
                    self.wfile.flush()
                except OSError:  # the reader gave up
                    break
        self.close_connection = True

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
def serve_with_faults(root: Path, schedule: Schedule, every_request: bool = False,
                      trickle_s: float = 1.0, by_range: RangeFaults | None = None) -> Iterator[str]:
    """Serve `root` on 127.0.0.1 with `schedule` deciding each range request's fault (each request's, with
    `every_request`); `by_range`, where given, decides a range request's fault by its path and bytes first
    (a fault for one episode's bytes, whenever they are asked for); yields the base URL."""
    closing = threading.Event()
    places = by_range or _Handler.by_range
    handler = type("Handler", (_Handler,), {"schedule": staticmethod(schedule), "by_range": staticmethod(places),
                                            "counter": [0],
                                            "lock": threading.Lock(), "closing": closing,
                                            "every_request": every_request, "trickle_s": trickle_s})
    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        closing.set()
        server.shutdown()
        server.server_close()
        thread.join()
