"""The tuner's space and search on config/tune-example.json with hand-made profiles: the optimum worked out by hand.

The example's steps cost a loader 8 ms per item, a network 6 + 1.5 x batch ms
per batch and a head 3 ms per call (0.3 ms of harness on each call).  On 6
CPU slots (the Batcher takes none) the capacities are, per replica, 120
loader items/s, 133/222/333/444 network items/s at batch 1/2/4/8 and 300 x
batch head items/s, so 4 loaders, one network at batch 8 and one head serve
min(4 x 120, 437) = 437 items/s: every other split of 6 slots serves at most
3 x 120 = 361 (three loaders) or 2 x 120 (two).  Under a p99 bound of 100 ms
the simulation puts its peak near 420 items/s.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rnb.pipeline.config import ConfigError, parse_config
from rnb.tune.estimate import Estimator
from rnb.tune.profile import Bench, Form, Profile, ProfileKey
from rnb.tune.profile_plan import forms_of, plan_profiles
from rnb.tune.search import Goal, Memory, Search, memory_problem
from rnb.tune.space import Budget, TuneRequestError, TuneSpace
from rnb.tune.tuning_config import read_space
from tests.support.tune_support import EXAMPLE, example_document, hand_profiles

BENCH = Bench("cpu", "local", host="test-host")
BOUND_MS = 100.0


@pytest.fixture(scope="module")
def space() -> TuneSpace:
    return read_space(example_document(), str(EXAMPLE), Budget(cpu_slots=6))


@pytest.fixture(scope="module")
def profiles(space: TuneSpace) -> dict[ProfileKey, Profile]:
    return hand_profiles(space, BENCH)


@pytest.fixture(scope="module")
def estimator(space: TuneSpace, profiles: dict[ProfileKey, Profile]) -> Estimator:
    """One estimator for the module: each candidate is simulated once, whichever test asks first."""
    return Estimator(space, profiles, BENCH, BOUND_MS, 99.0, items=1200)


def test_the_example_has_three_tuned_steps_and_a_batcher_that_takes_no_slot(space: TuneSpace) -> None:
    assert [(g.name, g.kind, g.tuned) for g in space.groups] == [
        ("step 0", "work", True), ("step 1", "batcher", False), ("step 2", "work", True), ("step 3", "work", True)]
    assert space.choices(1, 0).batches == (1, 2, 4, 8)
    assert space.max_replicas == 4
    # replica counts (a, b, c) >= 1 with a + b + c <= 6: C(6, 3) = 20, times 4 batches
    assert space.grid_size() == 80
    best = space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8})
    assert space.cpu_slots_used(best) == 6 and space.within_budget(best)
    assert not space.within_budget(space.candidate({(0, 0): 4, (2, 0): 2, (3, 0): 1}, {(1, 0): 8}))
    assert space.short_label(best) == "4 | b8 | 1 | 1"
    assert space.label(best) == "step 0: 4 x cpu; step 1: batch 8; step 2: 1 x cpu; step 3: 1 x cpu"


def test_a_candidate_becomes_a_config_the_harness_accepts(space: TuneSpace) -> None:
    best = space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8})
    document = space.document_for(best, run={"mean_interval_ms": 2.5})
    config = parse_config(json.loads(json.dumps(document)), "best.json")
    assert [group.gpus for step in config.steps for group in step.queue_groups] == [(-1,) * 4, (-1,), (-1,), (-1,)]
    assert config.steps[1].queue_groups[0].model_kwargs["batch"] == 8
    assert document["run"] == {"videos": 1000, "mean_interval_ms": 2.5, "warmup": 20}


def test_profiles_are_planned_per_step_and_batch_with_the_batcher_measured_beside_its_network(space: TuneSpace) -> None:
    jobs = plan_profiles(space, BENCH, calls=100)
    assert [(job.what, job.videos, job.position) for job in jobs] == [
        ("step 0", 100, 0), ("step 2", 100, 2), ("step 2 at batch 2", 200, 2), ("step 2 at batch 4", 400, 2),
        ("step 2 at batch 8", 800, 2), ("step 3", 100, 1), ("step 3 at batch 2", 200, 2), ("step 3 at batch 4", 400, 2),
        ("step 3 at batch 8", 800, 2)]
    net = jobs[4].document["pipeline"]
    assert [step["model"] for step in net] == ["rnb.tune.instruments.Feeder", "models.batcher.Batcher",
                                               example_document()["pipeline"][2]["model"], "rnb.tune.instruments.Sink"]
    assert net[0]["shapes"] == [[2, 3, 4, 16, 16]] and net[1]["batch"] == 8
    assert jobs[4].batcher_key is not None and jobs[4].batcher_key.form == Form(1, 1, 1, 8)
    assert jobs[0].document["source"] == {"synthetic": True} and len(jobs[0].document["pipeline"]) == 2
    best = space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8})
    assert forms_of(space, best) == {(0, 0): Form(), (1, 0): Form(1, 1, 1, 8), (2, 0): Form(8), (3, 0): Form(8)}


def test_exhaustive_search_finds_the_hand_worked_optimum(space: TuneSpace, estimator: Estimator) -> None:
    found = Search(space, estimator, Goal(), Memory({}))
    ranked = found.exhaustive()
    assert len(ranked) == 80 and not found.pruned
    assert space.short_label(ranked[0].candidate) == "4 | b8 | 1 | 1"
    assert ranked[0].estimate.capacity_per_s == pytest.approx(8 / 0.0183, rel=1e-6)   # the network bounds it
    assert 400 < ranked[0].rate < 437
    # every other candidate is bounded by three loaders or fewer
    assert all(e.estimate.capacity_per_s <= 3 / 0.0083 + 1e-6 for e in ranked[1:])


def test_quick_search_finds_it_too_predicting_a_handful_of_candidates(space: TuneSpace, estimator: Estimator) -> None:
    found = Search(space, estimator, Goal(), Memory({}))
    ranked = found.quick()
    assert space.short_label(found.start()) == "1 | b8 | 1 | 1"
    assert space.short_label(ranked[0].candidate) == "4 | b8 | 1 | 1"
    assert len(found.evaluated) <= 20


def test_quick_search_climbs_to_the_bound_from_a_start_that_meets_it_at_no_rate(
        space: TuneSpace, profiles: dict[ProfileKey, Profile]) -> None:
    # Under p99 < 70 ms one loader cannot fill batches of 8 fast enough at any rate it serves; the search must
    # still reach the optimum, which at this bound is still 4 | b8 | 1 | 1 (the network bounds it).
    found = Search(space, Estimator(space, profiles, BENCH, 70.0, 99.0, items=1200), Goal(), Memory({}))
    start = found.evaluate(found.start())
    assert space.short_label(start.candidate) == "1 | b8 | 1 | 1" and start.estimate.rate_per_s is None
    best = found.quick()[0]
    assert space.short_label(best.candidate) == "4 | b8 | 1 | 1" and 350 < best.rate < 437
    assert len(found.evaluated) <= 20
    # From 3 | b4 | 2 | 1 (the loaders its bottleneck, no slot free) one move gives a network to the loaders and
    # lets the one network left keep up at the next batch: the optimum, which neither change alone reaches.
    near = found.evaluate(space.candidate({(0, 0): 3, (2, 0): 2, (3, 0): 1}, {(1, 0): 4}))
    assert near.estimate.at_peak is not None and near.estimate.at_peak.bottleneck == "step 0"
    assert "4 | b8 | 1 | 1" in [space.short_label(c) for c in found.moves(near)]


def test_the_devices_objective_finds_the_fewest_slots_that_serve_the_target(space: TuneSpace, estimator: Estimator) -> None:
    # 300 items/s need three loaders (two serve at most 241); one network at batch 4 or 8 and a head: 5 slots.
    found = Search(space, estimator, Goal("devices", 300.0), Memory({}))
    ranked = found.exhaustive()
    assert ranked[0].devices == 5 and ranked[0].rate >= 300.0
    assert space.short_label(ranked[0].candidate) == "3 | b8 | 1 | 1"
    quick = Search(space, estimator, Goal("devices", 300.0), Memory({}))
    assert quick.quick()[0].devices == 5


def test_memory_prunes_what_the_host_cannot_hold(space: TuneSpace, profiles: dict[ProfileKey, Profile],
                                                 estimator: Estimator) -> None:
    best = space.candidate({(0, 0): 4, (2, 0): 1, (3, 0): 1}, {(1, 0): 8})
    # 7 runners of 100 MiB each (the Batcher's included) and their slots: 700 MiB and a little
    assert memory_problem(space, best, profiles, BENCH, Memory({}, 2**30)) is None
    assert memory_problem(space, best, profiles, BENCH, Memory({}, 600 * 2**20)) == (
        "the CPU replicas would need 0.685 GiB of the 0.586 GiB available")
    found = Search(space, estimator, Goal(), Memory({}, 600 * 2**20))
    ranked = found.exhaustive()
    assert len(ranked) + len(found.pruned) == 80 and found.pruned
    assert space.short_label(ranked[0].candidate) != "4 | b8 | 1 | 1"


def test_a_budget_smaller_than_the_steps_is_refused_before_anything_runs() -> None:
    with pytest.raises(TuneRequestError) as error:
        read_space(example_document(), "config/tune-example.json", Budget(cpu_slots=2))
    assert str(error.value) == ("config/tune-example.json: a budget of 2 CPU slots cannot hold the 3 work groups "
                                "(step 0, step 2, step 3), each of which needs at least one replica.")


def test_a_batch_list_must_hold_positive_integers() -> None:
    document = example_document()
    document["pipeline"][1]["batch"] = [1, 0]
    with pytest.raises(ConfigError) as error:
        read_space(document, "x.json", Budget(cpu_slots=6))
    assert str(error.value) == ("x.json: pipeline[1].batch: expected a non-empty list of integers >= 1 to choose from, "
                                "found [1, 0]")


def test_the_batch_flag_and_a_segments_list_widen_the_space() -> None:
    document = example_document()
    del document["pipeline"][1]["batch"]
    space = read_space(document, "x.json", Budget(cpu_slots=3), batches=[2, 16])
    assert space.choices(1, 0).batches == (2, 16) and space.grid_size() == 2
    assert read_space(document, "x.json", Budget(cpu_slots=3)).choices(1, 0).batches == (1, 2, 4, 8)
    document["pipeline"][0]["num_segments"] = [1, 2]
    with pytest.raises(TuneRequestError, match=r"pipeline\[0\]\.num_segments lists \[1, 2\], but no later step merges"):
        read_space(document, "x.json", Budget(cpu_slots=3))


def on_gpu(document: dict[str, Any], gpu: int = 0) -> dict[str, Any]:
    for step in document["pipeline"]:
        for group in step["queue_groups"]:
            group["gpus"] = [gpu]
    return document


def test_gpu_replicas_are_dealt_over_the_budget_s_gpus_and_their_memory_prunes() -> None:
    space = read_space(on_gpu(example_document()), "gpu.json", Budget(gpus=(0, 1)))
    assert [g.on_gpu for g in space.tuned_groups] == [True, True, True] and space.max_replicas == 2
    two = space.candidate({(0, 0): 2, (2, 0): 1, (3, 0): 1}, {(1, 0): 8})
    # dealt in turn: the loaders on 0 and 1, the network on 0, the head on 1; the Batcher beside the network
    assert [candidate.devices for step in two.steps for candidate in step.groups] == [(0, 1), (0,), (0,), (1,)]
    assert space.gpus_used(two) == (0, 1) and space.devices_used(two) == 2
    bench = Bench("NVIDIA H200", "local", 0, host="test-host")
    profiles = {key: dataclasses.replace(profile, peak_device_bytes=2**30)
                for key, profile in hand_profiles(space, bench).items()}
    # GPU 0 holds a loader, the Batcher and the network: 3 GiB and their slots
    assert memory_problem(space, two, profiles, bench, Memory({0: 4 * 2**30, 1: 4 * 2**30})) is None
    assert memory_problem(space, two, profiles, bench, Memory({0: 3 * 2**30, 1: 4 * 2**30})) == (
        "GPU 0 would need 3 GiB of its 3 GiB")


def test_a_cpu_group_next_to_gpu_groups_is_kept_as_written_without_cpu_slots() -> None:
    document = on_gpu(example_document())
    document["pipeline"][3]["queue_groups"][0]["gpus"] = [-1, -1]
    kept = read_space(document, "mixed.json", Budget(gpus=(0,)))
    assert kept.choices(3, 0).fixed == (-1, -1) and not kept.choices(3, 0).tuned
    tuned = read_space(document, "mixed.json", Budget(gpus=(0,), cpu_slots=3))
    assert tuned.choices(3, 0).tuned and not tuned.choices(3, 0).on_gpu and tuned.max_replicas == 3


def test_a_config_of_several_queue_groups_per_step_is_tuned_group_by_group() -> None:
    space = read_space(json.loads(Path("config/r2p1d-rnb.json").read_text()), "config/r2p1d-rnb.json",
                       Budget(gpus=(0, 1, 2, 3)))
    assert [(g.name, g.kind, g.batches) for g in space.groups] == [
        ("step 0", "work", ()), ("step 1", "batcher", (1, 2, 4, 8)), ("step 1 group 1", "batcher", (1,)),
        ("step 2", "work", ()), ("step 2 group 1", "work", ())]
    assert [g.name for g in space.feeds(space.choices(1, 1))] == ["step 2 group 1"]
    assert space.grid_size() == 4 ** 3 * 4
    best = space.candidate({(0, 0): 4, (2, 0): 2, (2, 1): 2}, {(1, 0): 4, (1, 1): 1})
    config = parse_config(space.document_for(best), "rnb.json")
    assert [group.gpus for step in config.steps for group in step.queue_groups] == [
        (0, 1, 2, 3), (0,), (2,), (0, 1), (2, 3)]


def _finalist_job(busy: dict[str, float], busiest: int, saturated: bool) -> dict[str, Any]:
    """The columns of a finalist's job row that say what bounds it (rnb.analysis.utilisation's)."""
    names = [name for name in busy if name.startswith(f"step{busiest}-")]
    mean = sum(busy[name] for name in names) / len(names)
    return {"busy_fraction": json.dumps(busy), "busiest_step": busiest, "busiest_busy_fraction": mean,
            "bottleneck_step": busiest if saturated else None}


def test_what_bounds_a_finalist_is_its_jobs_bottleneck_as_analysis_names_it(space: TuneSpace, estimator: Estimator) -> None:
    from rnb.tune.report import bounding_sentence
    from rnb.tune.verify import Verified

    finalist = Verified(space.candidate({(0, 0): 3, (2, 0): 1, (3, 0): 1}, {(1, 0): 8}), Path("c.json"), (), None, None)
    busy = {"step0-g0-r0": 0.9, "step0-g0-r1": 0.96, "step0-g0-r2": 0.93, "step1-g0-r0": 0.02,
            "step2-g0-r0": 0.6, "step3-g0-r0": 0.3}
    said = bounding_sentence(space, estimator, finalist, _finalist_job(busy, 0, saturated=True))
    assert said.startswith("step 0's 3 replicas are busy 93%: one more CPU slot would add about ")
    assert said.endswith(" items/s (predicted).")
    idle = {name: share / 2 for name, share in busy.items()}
    assert bounding_sentence(space, estimator, finalist, _finalist_job(idle, 0, saturated=False)) == (
        "3 | b8 | 1 | 1: no step was saturated at the peak rate (the busiest, step 0, busy 46%): the latency bound, "
        "not a step's capacity, holds it there.")
    # A Batcher whose own calls keep it busy (not its wait for company): named, but the tuner does not replicate it.
    batcher = {**idle, "step1-g0-r0": 0.85}
    assert bounding_sentence(space, estimator, finalist, _finalist_job(batcher, 1, saturated=True)) == (
        "step 1's 1 replica is busy 85%; the tuner does not choose its replicas, so only a faster step would lift it.")
