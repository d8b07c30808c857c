"""The search and the report on config/tune-cpu-example.json with hand-made profiles of steps that compute.

Its loader computes 6 ms per item and its network 3 ms (0.3 ms of harness
on each call, on the CPU too).  On a host of 2 cores the pipeline serves at
most 2 / 9.6 ms = 208 items/s whatever the replicas: one loader and one
network serve 1 / 6.3 ms = 159, two loaders and one network reach the
cores' bound, and every replica beyond adds nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rnb.analysis.sweep import Trial
from rnb.tune.cores import HostCores
from rnb.tune.estimate import Estimator
from rnb.tune.profile import Bench, CpuUse, Profile, ProfileKey
from rnb.tune.profile_plan import plan_profiles
from rnb.tune.report import bounding_sentence, resolution_note, winner_of
from rnb.tune.search import Goal, Memory, Search
from rnb.tune.space import Budget, TuneSpace
from rnb.tune.tuning_config import read_space
from rnb.tune.verify import Verified
from tests.support.tune_support import REPO

CPU_EXAMPLE = REPO / "config" / "tune-cpu-example.json"
BENCH = Bench("cpu", "local", host="test-host", cores=HostCores(2, None))
HOP_S = 0.0003


@pytest.fixture(scope="module")
def space() -> TuneSpace:
    return read_space(json.loads(CPU_EXAMPLE.read_text()), str(CPU_EXAMPLE), Budget(cpu_slots=6))


@pytest.fixture(scope="module")
def estimator(space: TuneSpace) -> Estimator:
    profiles: dict[ProfileKey, Profile] = {}
    for job in plan_profiles(space, BENCH, calls=1):
        step = job.document["pipeline"][job.position]
        seconds = step["ms_per_item"] / 1000.0 + HOP_S
        profiles[job.key] = Profile(job.key, (seconds,), (), (seconds,), 24576, 100 * 2**20, None, "hand",
                                    CpuUse(fraction=1.0, per_call_s=seconds, threads=1))
    return Estimator(space, profiles, BENCH, 100.0, 99.0, items=1500)


def test_replicas_beyond_the_cores_add_nothing_to_the_prediction(space: TuneSpace, estimator: Estimator) -> None:
    one = estimator.pipeline(space.candidate({(0, 0): 1, (1, 0): 1}, {}))
    assert one.capacity_per_s() == pytest.approx(1 / 0.0063) and not one.bound_by_cores()
    for loaders, networks in ((2, 1), (3, 1), (3, 3), (5, 1)):
        pipeline = estimator.pipeline(space.candidate({(0, 0): loaders, (1, 0): networks}, {}))
        assert pipeline.bound_by_cores()
        assert pipeline.capacity_per_s() == pytest.approx(2 / 0.0096)


def test_quick_search_adds_no_cpu_replica_the_cores_cannot_run(space: TuneSpace, estimator: Estimator) -> None:
    found = Search(space, estimator, Goal(), Memory({}, None))
    best = found.quick()[0]
    assert space.short_label(best.candidate) == "2 | 1"
    assert 0.8 * 2 / 0.0096 < best.rate < 2 / 0.0096   # the peak under the bound: below the capacity
    # From 2 | 1 the cores bound it: no candidate of four slots or more was predicted.
    assert max(space.cpu_slots_used(e.candidate) for e in found.evaluated.values()) == 3


def _verified(space: TuneSpace, loaders: int, best: float, above: float | None) -> Verified:
    candidate = space.candidate({(0, 0): loaders, (1, 0): 1}, {})
    return Verified(candidate, Path("c.json"), (), Trial(best, 80.0),
                    None if above is None else Trial(above, 120.0))


def test_a_finalist_within_the_verification_s_resolution_of_one_with_fewer_devices_does_not_win(
        space: TuneSpace) -> None:
    four = _verified(space, 4, 200.0, 214.0)     # known to within 14 req/s
    two = _verified(space, 2, 190.0, 203.0)
    assert winner_of([four, two], space, Goal()) is two
    assert "13 req/s here" in resolution_note(two)
    clearly = _verified(space, 4, 230.0, 244.0)
    assert winner_of([clearly, two], space, Goal()) is clearly
    # A peak no rate broke is known only from below: it wins only on its rate.
    unbounded = _verified(space, 4, 195.0, None)
    assert winner_of([unbounded, _verified(space, 2, 180.0, 190.0)], space, Goal()).rate == 195.0  # type: ignore[union-attr]


def test_what_bounds_a_finalist_names_the_cores_when_they_are_busy(space: TuneSpace, estimator: Estimator) -> None:
    finalist = _verified(space, 3, 200.0, 214.0)
    busy = {"step0-g0-r0": 0.97, "step0-g0-r1": 0.97, "step0-g0-r2": 0.96, "step1-g0-r0": 0.5}
    job = {"busy_fraction": json.dumps(busy), "busiest_step": 0, "busiest_busy_fraction": 0.97, "bottleneck_step": 0,
           "cpu_percent": json.dumps({"step0-g0-r0": 60.0, "step0-g0-r1": 61.0, "step0-g0-r2": 59.0,
                                      "step1-g0-r0": 14.0, "client": 1.0, "main": 1.0})}
    assert bounding_sentence(space, estimator, finalist, job) == (
        "3 | 1: the host's 2 cores are busy 98%: more CPU replicas add nothing; only less CPU per item would lift "
        "it, step 0 takes 66% of it (profiled), so a GPU for step 0 would do most.")
    quiet = {**job, "cpu_percent": json.dumps({"step0-g0-r0": 50.0, "step1-g0-r0": 30.0})}
    assert "cores" not in bounding_sentence(space, estimator, finalist, quiet)
