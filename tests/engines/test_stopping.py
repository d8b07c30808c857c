"""What a stop (Ctrl-C, SIGTERM) does at each point of the command's life (rnb.engines.stopping), on a Stops of the
test's own: its handler is called as the signal module would call it, so nothing here is sent a real signal."""
from __future__ import annotations

import signal

import pytest

from rnb.core.termination import Termination
from rnb.engines.stopping import STOP_SIGNALS, Stop, Stopped, Stops, handlers_kept


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


def test_a_stop_cuts_short_a_call_the_driver_can_unwind_from_and_reacts_first() -> None:
    stops = Stops()
    stops.hold()
    seen: list[Stop] = []
    after: list[str] = []

    def blocking() -> None:
        stops.on_signal(signal.SIGTERM)   # lands while the call waits
        after.append("the rest of the call")

    with stops.reacting(seen.append):
        assert stops.cut_short(blocking) is False
        assert (after, len(seen), stops.cutting) == ([], 1, False)
        assert stops.cut_short(lambda: after.append("never run")) is False   # a stop came before: not even begun
    assert after == []


def test_without_a_stop_a_call_runs_whole_and_a_stop_after_it_raises_nothing() -> None:
    stops = Stops()
    stops.hold()
    ran: list[int] = []
    assert stops.cut_short(lambda: ran.append(1)) is True
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
