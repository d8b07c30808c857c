"""What bounded a job, and who missed its frames: the bottleneck line for every way a job can go."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rnb.analysis.bound import JobBound
from rnb.analysis.utilisation import run_wait_fraction


def row(busy: float, reason: str = "target reached", late: int = 0, dropped: int = 0, policy: str = "queue",
        inside_ms: float = 20.0, **load: object) -> dict[str, object]:
    """A jobs-table row of a one-step job whose step (an AsyncSleep of `inside_ms`) was `busy`, with camera streams of
    a 250 ms deadline."""
    streams = {"count": 2, "fps": 30, "policy": policy, "deadline_ms": 250.0, "offered": 400}
    return {"busiest_step": 0, "busiest_busy_fraction": busy, "step_models": '["models.toy.AsyncSleep"]',
            "termination_reason": reason, "streams": 2, "frames_offered": 400, "frames_late": late,
            "frames_dropped": dropped, "streams_record": json.dumps(streams), "num_steps": 1, "copy0_mean_ms": 0.1,
            "inside0_mean_ms": inside_ms, "queue0_mean_ms": 500.0, **load}


@pytest.mark.parametrize(("job", "words"), [
    (row(0.97, late=48), "step 0 (its runners busy 97% of the elapsed time on average); it, not the host, missed "
                         "48 of 400 frames (48 late, 0 dropped)"),
    (row(0.22, late=25), "no step was saturated, yet 25 of 400 frames (25 late, 0 dropped) were missed: a host stall, not "
                         "the pipeline's capacity, missed them (the busiest, step 0, 22% of the elapsed time on "
                         "average)"),
    (row(0.40, dropped=87, policy="drop"),
     "no step was saturated, yet 87 of 400 frames (0 late, 87 dropped) were missed: a host stall, not the pipeline's "
     "capacity, missed them (the busiest, step 0, 40% of the elapsed time on average)"),
    (row(0.20, late=400, inside_ms=299.9),
     "no step was saturated, yet 400 of 400 frames (400 late, 0 dropped) were missed: an item's own time in the steps, "
     "300 ms without waits, is over their 250 ms deadline (the busiest, step 0, 20% of the elapsed time on average)"),
    (row(0.05, reason="stalled"), "no step was saturated, and the job ended as 'stalled' without serving its load "
                                  "(the busiest, step 0, 5% of the elapsed time on average)"),
    (row(0.30), "no step was saturated: the pipeline served the offered load (the busiest, step 0, 30% of the "
                "elapsed time on average)"),
])
def test_the_bottleneck_line_says_who_missed_the_frames(job: dict[str, object], words: str) -> None:
    assert JobBound.of(job).words() == words


def test_only_a_job_that_served_its_load_says_so() -> None:
    """Issue 43's stalled summary and issue 44's Ray job: neither a stall, nor a drop, nor a late frame is 'served'."""
    for job in (row(0.1, reason="stalled"), row(0.1, dropped=1, policy="drop"), row(0.1, late=1),
                row(0.1, reason="process failed")):
        assert "served the offered load" not in JobBound.of(job).words()
    # Dropped frames under the queue policy cannot happen; under drop they are missed.
    assert JobBound.of(row(0.1, dropped=3, policy="drop")).missed == 3


def test_a_stream_trial_names_its_busiest_step_and_a_host_stall() -> None:
    assert JobBound.of(row(0.22, late=25)).trial_words() == (
        "step 0 (AsyncSleep) busy 22%: a host stall (frames missed while no step was saturated)")
    assert JobBound.of(row(0.97, late=25)).trial_words() == "step 0 (AsyncSleep) busy 97%: the pipeline missed the frames"
    assert JobBound.of(row(0.5)).trial_words() == "step 0 (AsyncSleep) busy 50%"
    assert JobBound.of(row(0.22, late=25)).host_stall and not JobBound.of(row(0.97, late=25)).host_stall
    assert not JobBound.of(row(0.2, late=400, inside_ms=300.0)).host_stall


def test_a_bulk_job_without_a_saturated_step_is_bound_between_the_models() -> None:
    job = {"busiest_step": 1, "busiest_busy_fraction": 0.5, "termination_reason": "target reached",
           "mean_interval_ms": 0}
    assert JobBound.of(job).words() == (
        "no step was saturated, though every request was sent at once: the time between the models (queues, copies, "
        "hand-overs) bounds it (the busiest, step 1, 50% of the elapsed time on average)")


def test_a_saturated_step_that_waited_for_cores_shares_the_blame_with_the_host() -> None:
    job = {**row(0.93, late=61, dropped=145, policy="drop"),
           "run_wait_fraction": json.dumps({"step0-g0-r0": 0.43, "client": 0.9})}
    assert JobBound.of(job).words() == (
        "step 0 (its runners busy 93% of the elapsed time on average, though waiting for a core 43% of it): the "
        "host's cores (the pipeline's own CPU, or other work on the host), as much as the step, missed 206 of 400 "
        "frames (61 late, 145 dropped)")
    assert JobBound.of(job).trial_words() == (
        "step 0 (AsyncSleep) busy 93%, waiting for a core 43% of the time: the host's cores missed the frames")
    calm = {**job, "run_wait_fraction": json.dumps({"step0-g0-r0": 0.05})}   # under a tenth: the step's own
    assert JobBound.of(calm).words().endswith("; it, not the host, missed 206 of 400 frames (61 late, 145 dropped)")


def test_the_share_of_time_a_process_waited_for_a_core_comes_from_its_samples() -> None:
    samples = pa.table({"time": [10.0, 10.5, 11.0, 10.0, 11.0, 12.0], "process": ["a", "a", "a", "b", "b", "b"],
                        "run_wait_s": [1.0, 1.1, 1.4, None, 0.0, 0.5]})
    assert run_wait_fraction(samples, 10.0, 11.5) == pytest.approx({"a": 0.4})   # b: one sample within
    assert run_wait_fraction(samples, 10.0, 12.0) == pytest.approx({"a": 0.4, "b": 0.5})
    assert run_wait_fraction(samples.drop_columns(["run_wait_s"]), 10.0, 12.0) == {}


def test_a_host_stall_says_how_long_a_frame_took_to_reach_step_0() -> None:
    """On Ray the hop from the client to step 0 grows with the host's load: the line says how long it took."""
    stalled = JobBound.of(row(0.64, dropped=188, policy="drop", queue0_p50_ms=45.9))
    assert stalled.host_stall and stalled.words().endswith(
        "(the busiest, step 0, 64% of the elapsed time on average); a frame waited a median 45.9 ms to reach step 0")
