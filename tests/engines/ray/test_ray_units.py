"""The Ray engine's pieces that need no cluster: seats, clock offsets, addresses, hand-off accounting."""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from rnb import cli
from rnb.core.messages import Request, Results
from rnb.core.termination import Termination
from rnb.core.timecard import TimeCard
from rnb.engines.ray.clock import measure_offset
from rnb.engines.ray.cluster import NodeInfo, is_loopback_address, resolve_address, split_label, use_loopback_if_local
from rnb.engines.ray.control import JobControl
from rnb.engines.ray.driver import paths_every_node_sees
from rnb.engines.ray.handoffs import Courier, Outbox, Parcel
from rnb.engines.ray.placement import RESOURCE_SLIVER, seat_runners
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.plan import plan_runners

NODES = [
    NodeInfo("head", "127.0.0.1", {}, {"CPU": 2}),
    NodeInfo("a", "127.0.0.1", {"node": "loaders"}, {"CPU": 4}),
    NodeInfo("b", "127.0.0.1", {"node": "nets", "zone": "x"}, {"CPU": 8, "GPU": 2, "fast": 1}),
]


def two_steps(first: dict, second: dict) -> Any:
    document = {"source": {"synthetic": True}, "pipeline": [
        {"model": "tests.support.fixture_models.Frames", "queue_groups": [{"out_queues": [0], **first}]},
        {"model": "tests.support.fixture_models.Head", "queue_groups": [{"in_queue": 0, **second}]}]}
    config = parse_config(document, "c.json")
    return config, plan_runners(config, 1)


def test_groups_find_their_nodes_by_label_key_value_or_custom_resource():
    config, placements = two_steps({"gpus": [-1, -1], "node": "loaders"}, {"gpus": [-1], "node": "fast"})
    seats, bundles = seat_runners(config, placements, NODES)
    assert [seat.choice.actor_options() for seat in seats] == [
        {"label_selector": {"node": "loaders"}}, {"label_selector": {"node": "loaders"}},
        {"resources": {"fast": RESOURCE_SLIVER}}]
    assert bundles == [] and {seat.bundle for seat in seats} == {None}
    config, placements = two_steps({"gpus": [-1], "node": "zone=x"}, {"gpus": [-1]})
    seats, _ = seat_runners(config, placements, NODES)
    assert [seat.choice.actor_options() for seat in seats] == [{"label_selector": {"zone": "x"}}, {}]


def test_entries_naming_one_gpu_share_its_bundle_and_distinct_ones_get_their_own():
    config, placements = two_steps({"gpus": [0, 0], "node": "nets"}, {"gpus": [1], "node": "nets"})
    seats, bundles = seat_runners(config, placements, NODES)
    assert [(seat.bundle, seat.gpu_share) for seat in seats] == [(0, 0.5), (0, 0.5), (1, 1.0)]
    assert [bundle.bundle() for bundle in bundles] == [({"GPU": 1.0}, {"node": "nets"})] * 2
    assert [seat.gpus_path for seat in seats] == ["pipeline[0].queue_groups[0].gpus[0]",
                                                  "pipeline[0].queue_groups[0].gpus[1]",
                                                  "pipeline[1].queue_groups[0].gpus[0]"]


@pytest.mark.parametrize("first, second, message", [
    ({"gpus": [-1], "node": "gpus"}, {"gpus": [-1]},
     "c.json: pipeline[0].queue_groups[0].node: expected a label (node=gpus) or custom resource of a node of the "
     "Ray cluster, found no node with it (its nodes' labels: node=loaders, node=nets, zone=x)"),
    ({"gpus": [-1], "node": "zone=y"}, {"gpus": [-1]},
     "c.json: pipeline[0].queue_groups[0].node: expected a label (zone=y) or custom resource"),
    ({"gpus": [0], "node": "loaders"}, {"gpus": [-1]},
     'c.json: pipeline[0].queue_groups[0].gpus[0]: expected at most 0 distinct GPUs on the Ray nodes "loaders" '
     "selects (they have 0), found the config asks for 1"),
    ({"gpus": [0, 1]}, {"gpus": [2]},
     "c.json: pipeline[1].queue_groups[0].gpus[0]: expected at most 2 distinct GPUs on the Ray cluster's nodes "
     "(they have 2), found the config asks for 3"),
], ids=["unknown_label", "unknown_key_value", "no_gpu_on_label", "too_many_gpus"])
def test_what_the_nodes_cannot_host_is_one_config_sentence(first, second, message):
    config, placements = two_steps(first, second)
    with pytest.raises(ConfigError) as caught:
        seat_runners(config, placements, NODES)
    assert str(caught.value).startswith(message)


def test_the_clock_offset_comes_from_the_tightest_round_trip():
    local = iter([10.0, 10.5, 20.0, 20.01, 30.0, 30.2])   # sent, back for three round trips
    remote = iter([105.2, 115.002, 125.0])                # a clock 95 s ahead, read mid-trip
    offset = measure_offset(lambda: next(remote), round_trips=3, local_clock=lambda: next(local))
    assert offset.round_trip_s == pytest.approx(0.01)
    assert offset.offset_s == pytest.approx(115.002 - 20.005)


@pytest.mark.parametrize("given, seen", [
    ("data/synthetic", os.path.join(os.getcwd(), "data/synthetic")),
    ("/srv/data/synthetic", "/srv/data/synthetic"),
    ("https://example.org/ds", "https://example.org/ds"),
    ("hf://datasets/user/ds", "hf://datasets/user/ds"),
])
def test_a_relative_dataset_root_is_made_absolute_for_the_other_nodes_and_urls_stay(given, seen):
    document = {"source": {"dataset": given}, "pipeline": [
        {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1]}]}]}
    assert paths_every_node_sees(parse_config(document, "c.json")).source["dataset"] == seen


def test_addresses_and_labels():
    assert [is_loopback_address(a) for a in ("127.0.0.1:6379", "localhost:1", "[::1]:5", "10.0.0.5:6379", None)] == [
        True, True, True, False, False]
    assert split_label("loaders") == ("node", "loaders") and split_label("ray.io/zone=x") == ("ray.io/zone", "x")


def test_the_cluster_to_use_and_whether_this_machine_is_loopback_to_ray(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None) is None and resolve_address("10.0.0.5:6379") == "10.0.0.5:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert resolve_address(None) == "auto"
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    use_loopback_if_local("auto")
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    use_loopback_if_local("127.0.0.1:6379")
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


class _Ref:
    """Stands in for an ObjectRef: its future completes when the test says the hand-off call was taken."""

    def __init__(self) -> None:
        self.done: concurrent.futures.Future = concurrent.futures.Future()

    def future(self) -> concurrent.futures.Future:
        return self.done


class _Calls:
    """Stands in for the consumers: records every call's consumer and parcels, hands back its _Ref."""

    def __init__(self) -> None:
        self.made: list[tuple[int, list[str]]] = []
        self.refs: list[_Ref] = []
        self.arrived = threading.Condition()

    def __call__(self, consumer: int, parcels: list[Parcel]) -> _Ref:
        with self.arrived:
            self.made.append((consumer, [p.opened().payload for p in parcels]))
            self.refs.append(_Ref())
            self.arrived.notify_all()
            return self.refs[-1]

    def wait_for(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.made) >= count, timeout=5)


def request(name: str) -> Parcel:
    return Parcel.of(Request(name, TimeCard(0, name)))


def test_items_for_a_consumer_with_a_call_untaken_wait_and_go_together_in_its_next_call():
    calls = _Calls()
    courier = Courier(lambda error: None)
    outbox = Outbox(2, calls, courier)
    outbox.put(0, request("a"))
    calls.wait_for(1)
    for name in "bcd":
        outbox.put(0, request(name))
    outbox.put(1, request("e"))
    calls.wait_for(2)
    assert courier.flush() and calls.made == [(0, ["a"]), (1, ["e"])] and outbox.counts == [4, 1]
    calls.refs[0].done.set_result(None)   # "a" taken: b, c and d go in one call
    calls.wait_for(3)
    assert calls.made[2] == (0, ["b", "c", "d"]) and outbox.counts == [3, 1]
    calls.refs[2].done.set_result(None)
    calls.refs[1].done.set_result(None)
    outbox.put(0, request("f"))            # nothing untaken to consumer 0: at once, alone
    calls.wait_for(4)
    assert calls.made[3] == (0, ["f"]) and outbox.counts == [1, 0] and outbox.calls == 4


def test_each_item_holds_a_slot_until_its_call_is_taken_and_goes_to_the_least_loaded_consumer():
    calls = _Calls()
    outbox = Outbox(3, calls, Courier(lambda error: None))
    for name in "ab":
        outbox.put(outbox.least_loaded([1, 2]), request(name))
    calls.wait_for(2)
    for name in "cd":
        outbox.put(outbox.least_loaded([1, 2]), request(name))
    assert outbox.counts == [0, 2, 2] and sorted(consumer for consumer, _ in calls.made) == [1, 2]
    assert outbox.wait_below(4, lambda: True) is False   # full, and the job ended: no wait
    first = calls.made[0][0]
    taker = threading.Timer(0.2, lambda: calls.refs[0].done.set_result(None))
    taker.start()
    assert outbox.wait_below(4, lambda: False) is True
    assert outbox.total == 3 and outbox.least_loaded([1, 2]) == first


def test_a_call_that_raises_is_told_and_frees_its_items_and_the_calls_after_it_are_still_made():
    failures: list[BaseException] = []
    made: list[int] = []

    def call(consumer: int, parcels: list[Parcel]) -> _Ref:
        raise TypeError("cannot pickle 'generator' object")

    courier = Courier(failures.append)
    outbox = Outbox(1, call, courier)
    outbox.put(0, request("a"))
    courier.post(lambda: made.append(1))
    assert courier.flush()
    assert [str(e) for e in failures] == ["cannot pickle 'generator' object"] and made == [1] and outbox.total == 0


def test_the_job_control_ends_at_the_target_dated_by_the_last_accepted_cards_count_and_drops_the_rest():
    control = JobControl(3, "runner1_finish")
    cards = []
    for item, counted in enumerate([10.0, 12.0, 11.0, 9.0]):
        cards.append(TimeCard(item, str(item)))
        cards[-1].record("runner1_finish", counted)
    control.finish(Results(tuple(cards[:2])))
    assert control.collect().reason == Termination.RUNNING
    control.finish(Results(tuple(cards[2:])))   # the fourth is past the target
    state = control.collect()
    assert state.reason == Termination.TARGET_REACHED and state.raised_at == 12.0
    assert [card.item_id for card in state.cards] == [2] and control.finished == 3


def test_the_job_control_ends_at_the_deadline_and_counts_only_cards_counted_before_it_whenever_they_come():
    control = JobControl(100, "runner1_finish")

    def cards(*counted_at: float) -> Results:
        made = [TimeCard(int(at * 10), str(at)) for at in counted_at]
        for card, at in zip(made, counted_at):
            card.record("runner1_finish", at)
        return Results(tuple(made))

    control.end_at(20.0)
    control.finish(cards(18.0, 19.0))
    before = control.collect()
    assert (before.reason, [card.item_id for card in before.cards]) == (Termination.RUNNING, [180, 190])
    control.finish(cards(19.5, 20.5))   # the driver's watch has not looked yet: the late card still ends the job
    control.finish(cards(19.9, 21.0))   # on its way when the flag went up: counted before the deadline or not at all
    state = control.collect()
    assert (state.reason, state.raised_at, state.late) == (Termination.MAX_DURATION, 20.0, 2)
    assert [card.item_id for card in state.cards] == [195, 199] and control.finished == 4


@pytest.mark.parametrize(("modules", "absent"), [
    ("rnb.engines.ray.control, rnb.core.messages", "[]"),
    # The actors' handles it is attached: Ray loads an actor's class, importing its module, to unpickle its handle
    # (once, that imported torch: 2 s of CPU, and the JobControl took no call meanwhile).
    ("rnb.engines.ray.control, rnb.core.messages, rnb.engines.ray.actors", "['ray']"),
], ids=["its_class_and_messages", "the_handles_of_its_actors"])
def test_the_job_control_and_everything_it_unpickles_import_no_torch(modules, absent):
    """Its actor's process imports what unpickling its class and its calls' arguments needs: no torch there."""
    probe = f"import sys, {modules}; print(sorted(name for name in ('torch', 'ray') if name in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, absent), done.stderr


def test_the_client_actor_s_run_and_a_synthetic_source_s_requests_import_no_torch():
    """Ray's client sends requests, never tensors: what its `run` imports and its source's first requests load no torch
    (2 CPU-s an actor; the toy job's test checks the process itself).  An episode dataset's source still does."""
    probe = ("import sys, rnb.engines.ray.actors, rnb.engines.ray.actor_transports, rnb.engines.participant, "
             "rnb.engines.stall\n"
             "from rnb.engines.client import generate\n"
             "from rnb.pipeline.sources import open_source\n"
             "requests = open_source({'synthetic': True}, 'config/toy.json')\n"
             "print([next(requests), next(requests)], 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "[0, 1] False"), done.stderr


def test_a_ray_address_without_the_ray_engine_is_exit_2_in_one_sentence(capsys):
    assert cli.main(["-c", "config/toy.json", "--ray-address", "127.0.0.1:6379", "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        'command line: --ray-address: expected the ray engine (--engine ray or the config\'s "run": {"engine": "ray"}), '
        "found the local engine")



def test_a_ray_address_where_nothing_answers_is_exit_1_in_one_sentence_not_minutes_of_retries(capsys):
    code = cli.main(["-c", "config/toy.json", "--engine", "ray", "--ray-address", "127.0.0.1:1", "-v", "4"])
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "benchmark.py: could not reach the Ray cluster at 127.0.0.1:1: its GCS did not answer within 5 s")
