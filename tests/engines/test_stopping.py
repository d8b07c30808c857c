"""What a stop (Ctrl-C, SIGTERM) does at each point of the command's life (rnb.engines.stopping), on a Stops of the
test's own: its handler is called as the signal module would call it, except around cut_short, whose call runs on
a thread of its own: there this process sends itself the signal, with the handler set for the test only."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rnb.core.termination import Termination
from rnb.engines.stopping import STOP_SIGNALS, Stop, Stopped, Stops, handlers_kept
from tests.support.tune_support import REPO


def test_before_the_job_holds_its_log_the_first_stop_raises_and_a_second_changes_nothing() -> None:
    stops = Stops()
    with pytest.raises(Stopped) as raised:
        stops.on_signal(signal.SIGTERM)
    first = raised.value.stop
    assert (first.number, first.termination, first.exit_code) == (signal.SIGTERM, Termination.TERMINATED, 143)
    assert str(raised.value) == "terminated (SIGTERM) before the job started: nothing was written"
    stops.on_signal(signal.SIGINT)   # while the first unwinds: noted, no second exception, the first stays the stop
    assert stops.received is first


def test_a_held_job_reacts_to_a_stop_and_raises_nothing_also_for_a_stop_that_came_before_it_reacted() -> None:
    stops = Stops()
    stops.hold()
    stops.on_signal(signal.SIGINT)
    seen: list[Stop] = []
    with stops.reacting(seen.append):
        assert [stop.termination for stop in seen] == [Termination.INTERRUPTED]
        stops.on_signal(signal.SIGINT)
        assert len(seen) == 2 and seen[0] is seen[1]
    stops.on_signal(signal.SIGTERM)   # after the driver returned: noted, nothing more
    assert len(seen) == 2 and stops.received is not None and stops.received.exit_code == 130


def test_a_stop_that_came_before_the_log_was_held_but_was_swallowed_is_raised_when_the_driver_asks_to_hold() -> None:
    stops = Stops()
    with pytest.raises(Stopped):
        stops.on_signal(signal.SIGINT)   # as a library's `except BaseException` would swallow it
    with pytest.raises(Stopped):
        stops.hold()
    assert not stops.held


@contextmanager
def handled_by(stops: Stops) -> Iterator[None]:
    """Inside, this process's SIGINT and SIGTERM go to `stops` (real signals: cut_short's call runs on a thread, and
    only the main thread runs a handler)."""
    with handlers_kept():
        for number in STOP_SIGNALS:
            signal.signal(number, stops.on_signal)
        yield


def test_a_stop_while_a_call_runs_ends_the_wait_and_lets_the_call_finish_whole() -> None:
    stops = Stops()
    stops.hold()
    seen: list[Stop] = []
    after: list[str] = []

    def starting_a_child() -> None:
        os.kill(os.getpid(), signal.SIGTERM)   # lands while the main thread waits, half way through the call
        time.sleep(0.2)
        after.append("the rest of the call")

    with handled_by(stops), stops.reacting(seen.append):
        assert stops.cut_short(starting_a_child, lambda: after.append("abandoned"), grace_s=10.0) is False
        assert (after, len(seen), stops.cutting) == (["the rest of the call"], 1, False)
        assert stops.cut_short(lambda: after.append("never run"), lambda: None, grace_s=1.0) is False   # came before
    assert after == ["the rest of the call"]


def test_a_call_still_running_past_its_grace_is_abandoned_and_what_that_makes_it_raise_is_not_raised() -> None:
    stops = Stops()
    stops.hold()
    server_gone = threading.Event()

    def waiting_for_the_fork_server() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        if server_gone.wait(10.0):
            raise EOFError("the fork server went before it answered")

    with handled_by(stops):
        assert stops.cut_short(waiting_for_the_fork_server, server_gone.set, grace_s=0.1) is False
    assert server_gone.is_set() and stops.received is not None and stops.received.exit_code == 130


def test_without_a_stop_a_call_runs_whole_raises_its_own_error_and_a_stop_after_it_raises_nothing() -> None:
    stops = Stops()
    stops.hold()
    ran: list[int] = []
    assert stops.cut_short(lambda: ran.append(1), lambda: ran.append(2), grace_s=1.0) is True
    with pytest.raises(ZeroDivisionError):
        stops.cut_short(lambda: 1 / 0, lambda: ran.append(2), grace_s=1.0)
    stops.on_signal(signal.SIGINT)
    assert ran == [1] and stops.received is not None


def test_a_sigterm_a_library_answered_with_its_own_handler_is_the_commands_stop() -> None:
    stops = Stops()
    stopped = stops.answered_elsewhere(signal.SIGTERM)
    assert stopped.stop is stops.received and stopped.stop.exit_code == 143


def test_handlers_a_library_sets_inside_are_put_back() -> None:
    before = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    with handlers_kept():
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert {number: signal.getsignal(number) for number in STOP_SIGNALS} == before


def test_a_process_a_cut_short_call_started_outlives_the_call_and_the_exit_handlers_see_it_alive(
        tmp_path: Path) -> None:
    """The fork server asks the kernel to kill it when the thread that started it ends; that thread is cut_short's,
    so it must last until the process leaves, after the exit handlers that stop the server in order."""
    script = tmp_path / "started_in_a_call.py"
    script.write_text(textwrap.dedent('''
        import atexit, ctypes, signal, subprocess, sys, time
        from rnb.engines.stopping import Stops

        def tied_to_its_starting_thread():
            ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG

        started = []
        stops = Stops()
        stops.hold()
        stops.cut_short(lambda: started.append(subprocess.Popen(["sleep", "30"],
                                                                preexec_fn=tied_to_its_starting_thread)),
                        lambda: None, grace_s=1.0)
        time.sleep(0.2)

        def at_exit():
            child = started[0]
            time.sleep(0.5)   # a SIGKILL the kernel sent as the starting thread ended has landed by now
            print("after the call:", "alive" if child.poll() is None else "gone")
            child.kill()
            child.wait()
        atexit.register(at_exit)
    '''))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "after the call: alive\n", "")
