"""Reading a runner's occupancy per call off its time cards: hand-made calls, and the cache."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rnb.core.stages import StepEvents
from rnb.engines.ray.cluster import DAEMON_SAMPLES
from rnb.engines.sampler import SCHEMA
from rnb.tune.cores import HostCores
from rnb.tune.profile import CpuUse, Form, Profile, ProfileKey
from rnb.tune.profile_cache import ProfileCache
from rnb.tune.profile_read import Call, cpu_spent, daemons_per_hop_s, occupancy, sink_hop_s


def call(arrived: float, taken: float, started: float, finished: float, handed_over: float, slot_wait: float = 0.0,
         cards: int = 1) -> Call:
    return Call(arrived, taken, started, finished, slot_wait, handed_over, cards)


def test_a_busy_runner_s_occupancy_is_the_gap_between_its_hand_overs() -> None:
    # Three items queued at 0; each call hands over 10 ms after the previous one did.
    calls = [call(0.0, 0.001, 0.002, 0.009, 0.010), call(0.0, 0.011, 0.012, 0.019, 0.020),
             call(0.0, 0.021, 0.022, 0.029, 0.030)]
    emit, held, inside, cards = occupancy(calls)
    assert emit == pytest.approx([0.010, 0.010, 0.010]) and held == [] and cards == [1, 1, 1]
    assert inside == pytest.approx([0.007, 0.007, 0.007])


def test_calls_skipped_at_the_start_still_say_when_the_runner_became_free() -> None:
    # All five queued at 0 (a bulk job), 10 ms each: the third call, the first kept, served 10 ms, not the
    # 30 ms since its item arrived (the wait behind the two skipped calls is not its own).
    calls = [call(0.0, 0.010 * i + 0.001, 0.010 * i + 0.002, 0.010 * i + 0.009, 0.010 * (i + 1)) for i in range(5)]
    emit, _, _, cards = occupancy(calls, skip=2)
    assert emit == pytest.approx([0.010]) and cards == [1]


def test_an_idle_runner_s_occupancy_starts_when_its_input_arrives_and_leaves_out_the_slot_wait() -> None:
    # The second input arrives 50 ms after the first was handed over; the third waits 4 ms for a free slot.
    calls = [call(0.0, 0.001, 0.002, 0.009, 0.010), call(0.060, 0.061, 0.062, 0.069, 0.070),
             call(0.060, 0.071, 0.072, 0.079, 0.084, slot_wait=0.004)]
    emit, _, _, _ = occupancy(calls)
    assert emit == pytest.approx([0.010, 0.010, 0.010])


def test_a_batcher_s_holding_calls_are_kept_apart_from_the_call_that_hands_the_batch_on() -> None:
    # Batch of 3: calls 1 and 2 keep their item (their finish is the batch's, after call 3 was taken).
    calls = [call(0.0, 0.0010, 0.0012, 0.0050, 0.0060), call(0.0, 0.0020, 0.0022, 0.0050, 0.0060),
             call(0.0, 0.0030, 0.0032, 0.0050, 0.0060)]
    emit, held, _, cards = occupancy(calls)
    assert held == pytest.approx([0.0012, 0.0010])          # until each one's model call started
    assert emit == pytest.approx([0.0060 - 0.0022])         # the last: from the previous call's end to its hand-over
    assert cards == [1]


def test_the_cache_returns_a_profile_only_under_its_own_key(tmp_path: Path) -> None:
    key = ProfileKey("m.M", "{}", Form(4), "null", "cpu", "local", "host", HostCores(2, None))
    profile = Profile(key, (0.01, 0.012), (), (0.009, 0.011), 100, 2**20, None, "job", CpuUse(0.9, 0.01, 1, 2e-4, 1e-4, 3e-4),
                      hop_latency_s=0.004)
    cache = ProfileCache(tmp_path)
    cache.put(profile)
    assert cache.get(key) == profile
    assert cache.get(ProfileKey("m.M", "{}", Form(8), "null", "cpu", "local", "host", HostCores(2, None))) is None
    assert json.loads(cache.path(key).read_text())["key"]["form"] == {"cards": 4, "segments": 1, "splits": 1, "batch": 1}
    cache.path(key).write_text("{")                          # damaged: measured again, not a crash
    assert cache.get(key) is None
    cache.put(profile)
    older = json.loads(cache.path(key).read_text())
    older["version"] = 1                                      # read off its job another way: measured again
    cache.path(key).write_text(json.dumps(older))
    assert cache.get(key) is None


def test_a_batch_handed_on_by_flush_counts_its_call_as_held_and_not_the_idle_wait() -> None:
    # Batch of 4, but only 2 items came: the second call returned at 2.2 ms, the flush wrote the batch at 60 ms.
    calls = [call(0.0, 0.0010, 0.0012, 0.0600, 0.0610), call(0.0020, 0.0021, 0.0022, 0.0600, 0.0610)]
    emit, held, _, _ = occupancy(calls)
    assert emit == [] and held == pytest.approx([0.0012, 0.0002])   # the second: from its arrival to its start


def test_cpu_spent_in_a_window_is_read_between_a_process_s_samples() -> None:
    # A runner sampled every 100 ms, burning 0.5 CPU-seconds per second; another process beside it.
    rows = [{"time": 10.0 + 0.1 * i, "process": "step1-g0-r0", "cpu_s": 2.0 + 0.05 * i} for i in range(11)]
    rows += [{"time": 10.0 + 0.1 * i, "process": "main", "cpu_s": 7.0 + 0.01 * i} for i in range(11)]
    samples = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert cpu_spent(samples, "step1-g0-r0", 10.25, 10.75) == pytest.approx(0.25)
    assert cpu_spent(samples, "main", 10.0, 11.0) == pytest.approx(0.1)
    assert cpu_spent(samples, "step1-g0-r0", 9.0, 10.5) == pytest.approx(0.25)   # the window cut to the samples
    assert cpu_spent(samples, "client", 10.0, 11.0) is None                      # never sampled
    assert cpu_spent(samples, "main", 12.0, 13.0) is None                        # after its last sample


def test_the_wait_for_a_core_is_read_like_the_cpu_and_absent_where_not_kept() -> None:
    rows = [{"time": 10.0 + 0.1 * i, "process": "step0-g0-r0", "cpu_s": 0.05 * i, "run_wait_s": 0.03 * i}
            for i in range(11)]
    samples = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert cpu_spent(samples, "step0-g0-r0", 10.0, 11.0, column="run_wait_s") == pytest.approx(0.3)
    older = samples.drop_columns(["run_wait_s"])                  # a log from before the sampler kept it
    assert cpu_spent(older, "step0-g0-r0", 10.0, 11.0, column="run_wait_s") is None
    unknown = pa.Table.from_pylist([{**row, "run_wait_s": None} for row in rows], schema=SCHEMA)
    assert cpu_spent(unknown, "step0-g0-r0", 10.0, 11.0, column="run_wait_s") is None


def test_ray_s_daemons_are_read_per_item_and_hop_from_every_process_sampled_as_one() -> None:
    # A raylet burning 0.2 CPU-seconds per second and the GCS 0.1, beside a runner; 100 items through 4 hops in
    # the 1 s window: 0.3 / 100 / 4 = 0.75 ms per item and hop. The runner is not a daemon.
    rows = []
    for name, rate in ((f"{DAEMON_SAMPLES}raylet:41", 0.2), (f"{DAEMON_SAMPLES}gcs_server:40", 0.1),
                       ("step0-g0-r0", 0.9)):
        rows += [{"time": 10.0 + 0.1 * i, "process": name, "cpu_s": 1.0 + rate * 0.1 * i} for i in range(11)]
    samples = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert daemons_per_hop_s(samples, 10.0, 11.0, 100, 4) == pytest.approx(0.3 / 100 / 4)
    assert daemons_per_hop_s(samples.filter(pc.field("process") == "step0-g0-r0"), 10.0, 11.0, 100, 4) == 0.0


def test_the_hop_into_the_sink_is_the_median_gap_between_the_hand_over_and_the_sink_s_take() -> None:
    # A three-step profiling job (feeder, measured step, sink): the sink took items 2, 3, 30 and 4 ms after the
    # measured step handed them over (the 30 a hiccup the median leaves out), and one item it never took.
    timings = pa.table({"item_id": [0, 1, 2, 3, 4], "handed1": [1.0, 2.0, 3.0, 4.0, 5.0],
                        "runner2_start": [1.002, 2.003, 3.030, 4.004, float("nan")]}).rename_columns(
        ["item_id", StepEvents(1).handed_over, StepEvents(2).arrived])
    assert sink_hop_s(timings, 3) == pytest.approx(0.0035)
    assert sink_hop_s(timings.drop_columns([StepEvents(2).arrived]), 3) == 0.0
