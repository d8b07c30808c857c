"""Live progress on stderr: lines every 5 s off a terminal, bars that stay on one, nothing with -q; an injected clock."""
from __future__ import annotations

import io

from rnb.engines.live import LiveProgress, progress_mode, waiting_for

PROCESSES = ("client", "step0-g0-r0", "step1-g0-r0")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_start_up_and_progress_are_lines_every_5_s() -> None:
    clock, out = Clock(), io.StringIO()
    live = LiveProgress(PROCESSES, 200, "lines", out, clock)
    for t, ready in [(1, set()), (4.9, {"client"}), (5.0, {"client"}), (9.0, {"client", "step0-g0-r0"}),
                     (10.0, {"client", "step0-g0-r0"})]:
        clock.now = 100.0 + t
        live.starting(ready)
    clock.now = 111.0
    live.starting(set(PROCESSES))   # all ready: start-up is about to complete, nothing to say
    live.started()
    for t, done in [(111.0, 0), (113.0, 30), (116.0, 75), (116.5, 80), (121.0, 150), (122.0, 200)]:
        clock.now = t
        live.running(done)
    clock.now = 130.0   # stopping the processes takes time, which the last line leaves out
    live.close(200)
    assert out.getvalue().splitlines() == [
        "start-up: 1 of 3 processes ready after 5 s; waiting for step0-g0-r0 and 1 other",
        "start-up: 2 of 3 processes ready after 10 s; waiting for step1-g0-r0",
        "progress: 0 of 200 items, 0.0 items/s, 0.0 s",
        "progress: 75 of 200 items, 15.0 items/s, 5.0 s",
        "progress: 150 of 200 items, 15.0 items/s, 10.0 s",
        "progress: 200 of 200 items, 18.2 items/s, 11.0 s",
    ]


def test_a_job_that_never_started_writes_no_progress_line() -> None:
    clock, out = Clock(), io.StringIO()
    live = LiveProgress(PROCESSES, 200, "lines", out, clock)
    clock.now = 106.0
    live.starting({"client"})
    live.close(0)
    assert out.getvalue() == "start-up: 1 of 3 processes ready after 6 s; waiting for step0-g0-r0 and 1 other\n"


def test_quiet_shows_nothing_and_a_terminal_gets_bars_left_standing() -> None:
    clock, quiet = Clock(), io.StringIO()
    live = LiveProgress(PROCESSES, 20, progress_mode(True, Terminal()), quiet, clock)
    for done in (0, 10, 20):
        clock.now += 6
        live.starting(set(PROCESSES[:1]))
        live.running(done)
    live.close(20)
    assert quiet.getvalue() == ""
    terminal = Terminal()
    live = LiveProgress(PROCESSES, 20, progress_mode(False, terminal), terminal, clock)
    live.starting({"client"})
    live.started()
    for done in (5, 12, 20):
        live.running(done)
    live.close(20)
    last_lines = [part.strip() for part in terminal.getvalue().split("\n") if part.strip()]
    start_up, items = (part.rsplit("\r", 1)[-1] for part in last_lines)
    assert start_up.startswith("start-up: 3 of 3 processes ready after 00:00, all ready")
    assert items.startswith("items: 100%") and "20/20" in items
    assert progress_mode(False, io.StringIO()) == "lines"


def test_waiting_for_names_the_first_still_loading_and_counts_the_rest() -> None:
    assert waiting_for(PROCESSES, set()) == "client and 2 others"
    assert waiting_for(PROCESSES, {"client", "step1-g0-r0"}) == "step0-g0-r0"
    assert waiting_for(PROCESSES, set(PROCESSES)) == "none"
