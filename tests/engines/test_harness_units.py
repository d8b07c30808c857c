"""Harness pieces in one process: time cards, shared slots, the runner's hand-off, sources, arguments."""
from __future__ import annotations

import io
import json
import pickle
import queue
import time

import pytest
import torch

from models.toy import SyntheticFrames
from rnb import cli
from rnb.core import joblog
from rnb.core.messages import Exited, Request, Results, Signal
from rnb.core.model import StepOutput
from rnb.core.termination import Termination
from rnb.core.timecard import TimeCard, as_cards
from rnb.engines import transport_protocols as transport_module
from rnb.engines.buffers import LocalBuffers
from rnb.engines.local.lifeline import children_context
from rnb.engines.local.plumbing import Plumbing, SharedSlot, SlotFlag, TerminationFlag
from rnb.engines.local.ring import RING_BYTES, QueueClosed, RingQueue
from rnb.engines.local.shared_memory_transport import LocalTransport, LocalWiring
from rnb.engines.runner import Runner
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.plan import Placement
from rnb.pipeline.sources import open_source

# Children fork from the fork server the jobs use (started once per process, torch loaded), not spawned afresh:
# a spawned child would import torch again, seconds of CPU each.
CTX = children_context()


class CountingPaths:
    """A video_path_iterator class as RnB configs name them."""

    def __init__(self, prefix: str = "clip") -> None:
        self.prefix = prefix

    def __iter__(self):
        return (f"{self.prefix}{i}.mp4" for i in range(3))


def _segment(part: TimeCard, device: str, instance: int, batch: int, times: list[float]) -> None:
    """Stamp what the harness stamps on a segment from its hand-over at step 0 to its arrival at step 2."""
    part.set_out_queue(0, 0)
    for name, when in zip(["slot0_acquired", "runner0_finish", "runner1_start", "inference1_start",
                           "inference1_finish", "slot1_acquired", "runner1_finish", "runner2_start",
                           "inference2_start"], times):
        part.record(name, when)
    part.set_device(1, device), part.set_replica(1, 0, instance), part.set_batch(1, batch, 1)
    part.set_out_queue(1, 1)
    part.set_device(2, "cpu"), part.set_replica(2, 0, 0)


def test_merge_follows_the_first_segment_to_arrive_and_keeps_each_segments_own_record():
    card = TimeCard(7, "7")
    for name, when in [("enqueue", 1.0), ("runner0_start", 2.0), ("inference0_start", 3.0), ("inference0_finish", 4.0)]:
        card.record(name, when)
    card.set_device(0, "cpu"), card.set_replica(0, 0, 0), card.set_batch(0, 0, 1)
    card.set_field("bytes_fetched", 100)
    card.set_field("episode", "ep7")
    first, second = card.fork(2)
    _segment(first, "cuda:0", 0, 3, [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0])
    _segment(second, "cuda:1", 1, 5, [6.5, 7.0, 7.5, 8.5, 9.5, 9.7, 10.5, 11.0, 11.2])
    first.set_field("frames_decoded", 8), second.set_field("frames_decoded", 8)
    merged = TimeCard.merge([second, first])
    assert merged.segments == ()
    # Segment 1 reached step 2 first (11.0): the item follows it, waits for segment 0 (12.0), and
    # step 2's inference is the call of segment 0, the last to arrive (13.0).
    assert merged.events == {
        "enqueue": 1.0, "runner0_start": 2.0, "inference0_start": 3.0, "inference0_finish": 4.0,
        "slot0_acquired": 6.5, "runner0_finish": 7.0, "runner1_start": 7.5, "inference1_start": 8.5,
        "inference1_finish": 9.5, "slot1_acquired": 9.7, "runner1_finish": 10.5, "runner2_start": 11.0,
        "inference2_start": 13.0, "siblings2_arrived": 12.0}
    assert merged.devices == {0: "cpu", 1: "cuda:0+cuda:1", 2: "cpu"}
    names = ["group1", "instance1", "batch1", "batch_size1", "out_queue1"]
    assert [merged.route_entry(name) for name in names] == [0, 1, 5, 1, 1]
    assert merged.fields == {"bytes_fetched": 100, "episode": "ep7", "frames_decoded": 16}
    own = {"slot0_acquired": 0, "runner0_finish": 1, "runner1_start": 2, "inference1_start": 3, "inference1_finish": 4,
           "slot1_acquired": 5, "runner1_finish": 6, "runner2_start": 7, "inference2_start": 8}
    assert merged.per_segment == {
        **{f"seg0_{name}": [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0][i] for name, i in own.items()},
        "seg0_out_queue0": 0, "seg0_device1": "cuda:0", "seg0_group1": 0, "seg0_instance1": 0, "seg0_batch1": 3,
        "seg0_batch_size1": 1, "seg0_out_queue1": 1, "seg0_device2": "cpu", "seg0_group2": 0, "seg0_instance2": 0,
        **{f"seg1_{name}": [6.5, 7.0, 7.5, 8.5, 9.5, 9.7, 10.5, 11.0, 11.2][i] for name, i in own.items()},
        "seg1_out_queue0": 0, "seg1_device1": "cuda:1", "seg1_group1": 0, "seg1_instance1": 1, "seg1_batch1": 5,
        "seg1_batch_size1": 1, "seg1_out_queue1": 1, "seg1_device2": "cpu", "seg1_group2": 0, "seg1_instance2": 0}
    again = pickle.loads(pickle.dumps(merged))
    assert [getattr(again, name) for name in TimeCard.__slots__] == [getattr(merged, name) for name in TimeCard.__slots__]


def test_nested_forks_merge_inside_out_with_every_segment_named_by_its_path():
    card = TimeCard(2)
    card.record("inference0_finish", 1.0)
    outer = card.fork(2)
    for i, part in enumerate(outer):
        part.record("runner0_finish", 2.0 + i)
        part.record("runner1_start", 3.0 + i), part.record("inference1_start", 3.5 + i)
        part.record("inference1_finish", 4.0 + i)
    inner = [part.fork(2) for part in outer]
    for i, pair in enumerate(inner):
        for j, part in enumerate(pair):
            part.record("runner1_finish", 5.0 + i + j / 4)
            part.record("runner2_start", 6.0 + i + j / 4), part.record("inference2_start", 6.125 + i + j / 4)
    halves = [TimeCard.merge(pair) for pair in inner]
    assert [half.segments for half in halves] == [(part.segments[-1],) for part in outer]
    assert [half.event("siblings2_arrived") for half in halves] == [6.25, 7.25]
    for half in halves:
        half.record("inference2_finish", 8.0)
        half.record("runner2_finish", 8.5), half.record("runner3_start", 9.0), half.record("inference3_start", 9.5)
    whole = TimeCard.merge(halves)
    assert whole.events == {"inference0_finish": 1.0, "runner0_finish": 2.0, "runner1_start": 3.0,
                            "inference1_start": 3.5, "inference1_finish": 4.0, "runner1_finish": 5.0,
                            "runner2_start": 6.0, "inference2_start": 6.375, "inference2_finish": 8.0,
                            "runner2_finish": 8.5, "runner3_start": 9.0, "inference3_start": 9.5,
                            "siblings2_arrived": 6.25}
    assert {name: whole.per_segment[name] for name in ["seg0-1_runner2_start", "seg1-0_runner2_start",
                                                        "seg1_siblings2_arrived", "seg1_runner3_start"]} == {
        "seg0-1_runner2_start": 6.25, "seg1-0_runner2_start": 7.0, "seg1_siblings2_arrived": 7.25,
        "seg1_runner3_start": 9.0}


def test_merge_refuses_an_incomplete_set_of_segments():
    parts = TimeCard(3).fork(3)
    with pytest.raises(ValueError, match=r"item 3: merge needs exactly segments 0..2 of one fork"):
        TimeCard.merge(parts[:2])
    with pytest.raises(ValueError, match="a time card can only be forked into 1 or more segments, not 0"):
        TimeCard(3).fork(0)


def test_as_cards_accepts_a_card_or_a_batch_and_rejects_anything_else():
    a, b = TimeCard(1), TimeCard(2)
    assert as_cards(a) == (a,)
    assert as_cards([a, b]) == (a, b)
    with pytest.raises(TypeError, match="expected TimeCard or a sequence of them"):
        as_cards([a, "b"])


def _set_after(flag: SlotFlag, delay_s: float) -> None:
    time.sleep(delay_s)
    flag.set()


def test_slot_flag_wakes_a_producer_waiting_in_another_process_and_times_out_when_nobody_sets_it():
    flag = SlotFlag(CTX)
    assert flag.is_set() and flag.wait(0.0)
    flag.clear(), flag.set(), flag.set(), flag.clear()  # wake-ups nobody waited for must not count as a set
    started = time.monotonic()
    assert flag.wait(0.2) is False and not flag.is_set() and time.monotonic() - started >= 0.2
    setter = CTX.Process(target=_set_after, args=(flag, 0.3))
    setter.start()
    try:
        assert flag.wait(120) is True and flag.is_set()  # a child may take long to start on a loaded machine
    finally:
        setter.join(10)
    assert setter.exitcode == 0


def _put_after(ring: RingQueue, delay_s: float, message: object) -> None:
    time.sleep(delay_s)
    ring.put_nowait(message)


def test_ring_queue_wakes_a_consumer_in_another_process_and_keeps_order_and_capacity():
    ring = RingQueue(3, TerminationFlag(CTX), ctx=CTX, name="test queue")
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        ring.get(timeout=0.2)
    assert time.monotonic() - started >= 0.2
    with pytest.raises(queue.Empty):
        ring.get_nowait()
    sent = Signal(1, 0, 2, 3, {"n": 4}, TimeCard(5, "5")).wire()
    sender = CTX.Process(target=_put_after, args=(ring, 0.3, sent))
    sender.start()
    try:
        got = Signal.from_wire(ring.get(timeout=120))  # a child may take long to start on a loaded machine
    finally:
        sender.join(10)
    assert (got.step, got.group, got.instance, got.slot, got.non_tensors, got.time_card.item_id) == (1, 0, 2, 3, {"n": 4}, 5)
    ring.put_nowait(1), ring.put_nowait(2), ring.put_nowait(3)
    with pytest.raises(queue.Full):
        ring.put_nowait(4)
    assert [ring.get(timeout=10) for _ in range(3)] == [1, 2, 3]


def test_ring_queue_wraps_messages_around_its_end_and_refuses_one_larger_than_itself():
    ring = RingQueue(100, TerminationFlag(CTX), ctx=CTX, name="inter-step queue 0 (step 0 to step 1)", capacity=256,
                     advice="; pass less in non_tensors")
    for turn in range(20):  # about 150 bytes a turn: the ring goes round a dozen times, splitting messages at its end
        messages = [(turn, i, b"x" * (turn + i)) for i in range(3)]
        for message in messages:
            ring.put_nowait(message)
        assert [ring.get(timeout=1) for _ in messages] == messages
    with pytest.raises(ValueError, match=r"^a message of 2\d\d bytes does not fit the 256-byte ring of the inter-step queue 0 "
                                         r"\(step 0 to step 1\); pass less in non_tensors$"):
        ring.put_nowait(b"y" * 240)
    with pytest.raises(ValueError, match=r"^a ring's capacity must be a multiple of 8 bytes below 17179869184, not 100$"):
        RingQueue(1, TerminationFlag(CTX), ctx=CTX, name="test queue", capacity=100)


def test_each_ring_of_a_job_names_itself_when_it_refuses_a_message_too_large():
    plumbing = Plumbing.build(CTX, [{0, 1}], 10, None)
    huge = b"x" * RING_BYTES
    size = len(pickle.dumps(huge, pickle.HIGHEST_PROTOCOL))
    for ring, name in [(plumbing.requests, "request queue"), (plumbing.results, "results queue"),
                       (plumbing.step_queues[0][1], "inter-step queue 1 (step 0 to step 1); pass less in non_tensors")]:
        with pytest.raises(ValueError) as refused:
            ring.put_nowait(huge)
        assert str(refused.value) == f"a message of {size} bytes does not fit the {RING_BYTES}-byte ring of the {name}"


def test_a_full_ring_refuses_what_nobody_will_read_once_the_job_has_ended_and_says_so():
    flag = TerminationFlag(CTX)
    ring = RingQueue(100, flag, ctx=CTX, name="test queue", capacity=1024)
    flag.raise_(Termination.TARGET_REACHED)
    refused = 0
    for i in range(40):  # 5 kB against a ring of 1 kB: nobody reads, and none of it waits
        try:
            ring.put_nowait((i, b"x" * 100))
        except QueueClosed:
            refused += 1
    assert refused == 32   # written or refused, never dropped in silence
    written = []
    with pytest.raises(queue.Empty):
        while True:
            written.append(ring.get(timeout=0.2)[0])
    assert written == list(range(8))  # 8 messages of 128 bytes (a length word, 119 of pickle, padding) fill 1 kB


def _hold_the_lock(lock: object) -> None:
    lock.acquire()  # type: ignore[attr-defined]
    time.sleep(600)


@pytest.mark.parametrize("side", ["write", "read"])
def test_a_process_killed_holding_a_ring_lock_holds_nobody_up_not_even_until_the_job_ends(side):
    """The lock is taken over from its dead holder at once (tests/engines/test_ring.py kills holders mid-operation)."""
    flag = TerminationFlag(CTX)
    ring = RingQueue(10, flag, ctx=CTX, name="test queue")
    if side == "read":
        ring.put_nowait("waiting")
    lock = ring._wlock if side == "write" else ring._rlock
    holder = CTX.Process(target=_hold_the_lock, args=(lock,))
    holder.start()
    deadline = time.monotonic() + 120  # a child may take long to start on a loaded machine
    while lock.acquire(False):
        lock.release()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    holder.kill()
    holder.join(10)
    if side == "write":
        ring.put_nowait("written")
    assert (ring.get(timeout=10), ring.recoveries, flag.is_set) == ("written" if side == "write" else "waiting", 1, False)


def test_shared_slot_reads_full_and_partial_outputs_into_reused_buffers():
    slot = SharedSlot.allocate(CTX, ((3, 2), (1,)), torch.device("cpu"))
    buffers = LocalBuffers(torch.device("cpu"))
    slot.write((torch.full((3, 2), 4.0), torch.tensor([9.0])), "here")
    full, one = slot.read(torch.device("cpu"), buffers)
    assert slot.sizes[:] == [3, 1] and torch.equal(full, torch.full((3, 2), 4.0)) and one.tolist() == [9.0]
    assert full.data_ptr() == buffers.like(0, slot.tensors[0]).data_ptr() != slot.tensors[0].data_ptr()
    slot.write((torch.full((1, 2), 5.0), torch.tensor([8.0])), "here")
    part, _ = slot.read(torch.device("cpu"), buffers)
    assert slot.sizes[:] == [1, 1] and torch.equal(part, torch.full((1, 2), 5.0))
    assert part.data_ptr() == full.data_ptr()


def test_shared_slot_keeps_valid_rows_and_rejects_outputs_that_do_not_fit():
    slot = SharedSlot.allocate(CTX, ((4, 3),), torch.device("cpu"))
    assert slot.tensors[0].is_shared()
    slot.write((torch.ones(2, 3),), "here")
    (copy,) = slot.read(torch.device("cpu"))
    assert torch.equal(copy, torch.ones(2, 3))
    assert copy.data_ptr() != slot.tensors[0].data_ptr()
    with pytest.raises(ValueError,
                       match=r"here: output tensor 0 has shape \(5, 3\), which does not fit output_shape\(\) \(4, 3\)"):
        slot.write((torch.ones(5, 3),), "here")
    with pytest.raises(ValueError, match=r"here: the model returned 2 output tensors but output_shape\(\) declares 1"):
        slot.write((torch.ones(1, 3), torch.ones(1, 3)), "here")


class _TensorSpy(pickle.Pickler):
    """Pickles like a queue would, recording every tensor or storage it meets."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO())
        self.tensors: list[type] = []

    def reducer_override(self, obj):
        if isinstance(obj, (torch.Tensor, torch.UntypedStorage, torch.TypedStorage)):
            self.tensors.append(type(obj))
        return NotImplemented


def _runner(plumbing: Plumbing, step: int, model: str, slots, sources, out_queues, kwargs, target=2) -> Runner:
    spec = Placement(name=f"step{step}-g0-r0", step=step, group=0, instance=0, device="cpu", model=model,
                     model_kwargs=kwargs, in_queue=None if step == 0 else 0, out_queues=out_queues)
    return Runner(spec, LocalTransport(spec, target, LocalWiring(slots, sources), plumbing))


def test_runners_hand_tensors_over_through_slots_and_queues_carry_none(monkeypatch):
    monkeypatch.setattr(transport_module, "RESULTS_WAIT_S", 3600.0)  # on a loaded machine item 1 may come 50 ms later
    plumbing = Plumbing.build(CTX, [{0}], 10, None)
    kwargs = {"clips": 2, "frames": 2, "height": 4, "width": 4}
    shapes = SyntheticFrames.output_shape(**kwargs)
    slots = tuple(SharedSlot.allocate(CTX, shapes, torch.device("cpu")) for _ in range(2))
    first = _runner(plumbing, 0, "models.toy.SyntheticFrames", slots, {}, (0,), kwargs)
    final = _runner(plumbing, 1, "models.toy.TinyConvNet", (), {(0, 0): slots}, (), {"clips": 2})

    for item in range(2):
        card = TimeCard(item, repr(item))
        card.record("enqueue")
        plumbing.requests.put_nowait(Request(item, card).wire())
        first.handle(first.transport.receive(timeout=10))
        wire = plumbing.step_queues[0][0].get(timeout=10)
        spy = _TensorSpy()
        spy.dump(wire)
        assert spy.tensors == []
        signal = Signal.from_wire(wire)
        assert isinstance(signal, Signal) and (signal.step, signal.slot) == (0, item)
        assert not slots[item].free.is_set()
        assert torch.equal(slots[item].tensors[0], SyntheticFrames.frames_for(item, shapes[0]))
        plumbing.step_queues[0][0].put_nowait(wire)
        final.handle(final.transport.receive(timeout=10))
        assert slots[item].free.is_set()

    (shipped,) = [plumbing.results.get(timeout=10)]  # the target ships what the final step held at once
    finished = shipped.cards
    assert [card.item_id for card in finished] == [0, 1]
    assert plumbing.finished.value == 2 and plumbing.flag.reason == Termination.TARGET_REACHED
    for card in finished:
        assert [name for name in card.events] == ["enqueue", "runner0_start", "inference0_start", "inference0_finish",
                                                  "slot0_acquired", "runner0_finish", "runner1_start", "inference1_start",
                                                  "inference1_finish", "runner1_finish"]
        assert sorted(card.events.values()) == list(card.events.values())
        assert card.devices == {0: "cpu", 1: "cpu"} and card.fields == {"frames_decoded": 4}


def test_the_final_step_ships_counted_cards_in_batches_and_holds_none_back(monkeypatch):
    monkeypatch.setattr(transport_module, "RESULTS_WAIT_S", 3600.0)  # only size, idleness, the target and exit ship here
    plumbing = Plumbing.build(CTX, [], 10, None)
    spec = Placement(name="step0-g0-r0", step=0, group=0, instance=0, device="cpu", model="models.toy.TinyConvNet",
                     model_kwargs={}, in_queue=None, out_queues=())
    transport = LocalTransport(spec, 151, LocalWiring((), {}), plumbing)
    cards = [TimeCard(item) for item in range(152)]

    def shipped() -> list[list[int]]:
        messages = []
        while True:
            try:
                messages.append([card.item_id for card in plumbing.results.get(timeout=0.2).cards])
            except queue.Empty:
                return messages

    assert [transport.finish((card,)) for card in cards[:130]] == [False] * 130
    assert shipped() == [list(range(64)), list(range(64, 128))]
    assert transport.receive(0.01) is None  # an idle input ships what is left
    assert shipped() == [[128, 129]]
    assert [transport.finish((card,)) for card in cards[130:150]] == [False] * 20
    transport.report(Exited("step0-g0-r0", 1, None, 1, 1))
    assert shipped() == [list(range(130, 150))]
    assert isinstance(plumbing.status.get(timeout=10), Exited)
    assert transport.finish((cards[150], cards[151])) is True  # the target: shipped at once, past it dropped
    assert shipped() == [[150]] and plumbing.finished.value == 151


def test_held_cards_go_within_their_bound_whatever_the_final_steps_loop_does_next():
    """No call after the count: the runner's loop may hang in its next item. The cards still go, on their own,
    when the oldest has been held 50 ms. The sender reads a clock the test moves, so the bound is checked exactly
    however slowly the machine runs: nothing goes at 49 ms, whatever real time passes, and everything at 50."""
    sent: list[Results] = []
    clock = [100.0]
    finished = transport_module.FinishedCards(sent.append, within_s=0.05, clock=lambda: clock[0])

    def sent_ids_once(count: int) -> list[list[int]]:
        deadline = time.monotonic() + 10.0  # a hang guard
        while len(sent) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return [[card.item_id for card in results.cards] for results in sent]

    finished.add((TimeCard(0), TimeCard(1)))
    clock[0] = 100.0 + 0.03
    finished.add((TimeCard(2),))    # joins what is held: the bound still runs from the first card
    clock[0] = 100.0 + 0.049
    time.sleep(0.3)                 # the sender looks again and again, each time short of the bound
    assert sent == [] and len(finished) == 3
    clock[0] = 100.0 + 0.05
    assert sent_ids_once(1) == [[0, 1, 2]] and len(finished) == 0
    clock[0] = 200.0
    finished.add((TimeCard(3),))    # a new batch after an empty spell: its own bound
    clock[0] = 200.0 + 0.049
    time.sleep(0.3)
    assert len(sent) == 1
    clock[0] = 200.0 + 0.05
    assert sent_ids_once(2) == [[0, 1, 2], [3]]


def test_final_step_refuses_unmerged_segments_before_completing_or_counting_them():
    plumbing = Plumbing.build(CTX, [], 10, None, completions=True)
    final = _runner(plumbing, 0, "models.toy.SyntheticFrames", (), {}, (), {}, target=5)
    with pytest.raises(ValueError, match="item 4 reached the final step as an unmerged segment"):
        final.emit(StepOutput((), {}, tuple(TimeCard(4).fork(2))), None, took_item=True)
    assert plumbing.completions is not None and plumbing.completions.waiting() == 0
    assert plumbing.finished.value == 0


def test_final_step_completes_items_for_loadgen_before_it_counts_them(monkeypatch):
    """The completion goes first, before the final step's own stamps and count; every item handed over is
    completed, one past the target too (LoadGen never issues one: its max query count is -v)."""
    plumbing = Plumbing.build(CTX, [], 10, None, completions=True)
    assert plumbing.completions is not None
    final = _runner(plumbing, 0, "models.toy.SyncSleep", (), {}, (), {}, target=1)
    seen_when_counting = []
    count_finished = Plumbing.count_finished

    def counting(self: Plumbing, count: int, target: int) -> tuple[int, bool] | None:
        seen_when_counting.append(plumbing.completions.waiting())
        return count_finished(self, count, target)
    monkeypatch.setattr(Plumbing, "count_finished", counting)
    for item in range(2):
        card = TimeCard(item, repr(item))
        card.record("enqueue")
        plumbing.requests.put_nowait(Request(item, card).wire())
        final.handle(final.transport.receive(timeout=10))
    assert seen_when_counting == [1, 2]
    assert [plumbing.completions.get(timeout=10) for _ in range(2)] == [(0,), (1,)]
    assert plumbing.finished.value == 1 and plumbing.flag.reason == Termination.TARGET_REACHED


def test_sources_synthetic_numbers_requests_and_path_iterator_builds_the_named_class():
    numbers = open_source({}, "c.json")
    assert [next(numbers) for _ in range(3)] == [0, 1, 2]
    paths = open_source({"video_path_iterator": f"{__name__}.CountingPaths", "prefix": "v"}, "c.json")
    assert list(paths) == ["v0.mp4", "v1.mp4", "v2.mp4"]
    with pytest.raises(ConfigError, match=r"c.json: source.nothing: expected a source whose first key is one of"):
        open_source({"nothing": 1}, "c.json")


def _toy_config(run: dict) -> object:
    with open("config/toy.json", encoding="utf-8") as handle:
        document = json.load(handle)
    document["run"] = run
    return parse_config(document, "toy.json")


def test_command_line_overrides_config_run_which_overrides_defaults():
    config = _toy_config({"videos": 40, "mean_interval_ms": 0})
    args = cli.resolve_args(cli.parse_args(["-v", "7", "--warmup", "0"]), config)
    assert (args.videos, args.load.mean_interval_ms, args.warmup, args.queue_size, args.batch_size) == (7, 0, 0, 50000, 1)
    assert (args.load.concurrency, args.seed, args.cpu, args.log_dir) == (None, 0, False, "logs")


@pytest.mark.parametrize("argv, message", [
    (["-v", "0"], "command line: -v/--videos: expected an integer >= 1, found 0"),
    (["--videos", "2.5"], "command line: -v/--videos: expected an integer >= 1, found 2.5"),
    (["-mi", "-1"], "command line: -mi/--mean_interval_ms: expected a number from 0 to 8.64e+07, found -1"),
    (["--mean-interval-ms", "nan"], "command line: -mi/--mean_interval_ms: expected a number from 0 to 8.64e+07, found nan"),
    (["--concurrency", "0"], "command line: --concurrency: expected an integer from 1 to 2147483647, found 0"),
    (["-v", "ten"], "command line: -v/--videos: expected an integer >= 1, found 'ten'"),
    (["-b"], "command line: -b/--batch_size: expected a value, found none"),
    (["--engine", "spark"], "command line: --engine: expected one of \"local\", \"ray\", found 'spark'"),
    (["--vidoes", "3"], "command line: --vidoes: expected a flag of benchmark.py, found an unknown one (did you mean --videos?)"),
])
def test_bad_argument_values_exit_2_with_one_sentence(argv, message, capsys, tmp_path):
    assert cli.main(["-c", "config/toy.json", "--log-dir", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []


def test_check_prints_a_ready_line_and_spawns_nothing(capsys, tmp_path):
    assert cli.main(["-c", "config/toy.json", "--check", "--log-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ready: python ") and "config/toy.json is valid (2 steps, 2 runners)" in out
    assert list(tmp_path.iterdir()) == []


def test_job_id_carries_the_config_name_and_load_and_directories_never_collide(tmp_path):
    start = time.mktime((2026, 12, 1, 19, 33, 37, 0, 0, -1))
    assert joblog.job_id(start, "toy", "mi2", 200) == "261201_193337-toy-mi2-v200"
    assert joblog.job_id(start, "toy", "mi2", 200, batch_size=1, queue_size=50000) == "261201_193337-toy-mi2-v200"
    # The load is its mode's label (tests/load/test_load.py); -b and -qs appear where not their defaults.
    assert joblog.job_id(start, "r2p1d-whole", "c8", 10, 4, 9) == "261201_193337-r2p1d-whole-c8-v10-b4-qs9"
    names = {"config/toy.json": "toy", "<default>": "default", "/tmp/my conf (2).json": "my_conf_2",
             "../x/.hidden.json": "hidden", "config/ünïcode.json": "n_code", "$$$.json": "config", "a" * 60 + ".json": "a" * 40}
    assert {path: joblog.config_name(path) for path in names} == names
    names = [joblog.create_job_dir(str(tmp_path), "job").name for _ in range(3)]
    assert names == ["job", "job-2", "job-3"]


def test_a_full_inter_step_queue_ends_the_job_with_that_reason_and_frees_the_slot():
    plumbing = Plumbing.build(CTX, [{0}], 1, None)
    kwargs = {"clips": 1, "frames": 1, "height": 2, "width": 2}
    slots = tuple(SharedSlot.allocate(CTX, SyntheticFrames.output_shape(**kwargs), torch.device("cpu")) for _ in range(3))
    first = _runner(plumbing, 0, "models.toy.SyntheticFrames", slots, {}, (0,), kwargs)
    for item in range(2):
        plumbing.requests.put_nowait(Request(item, TimeCard(item)).wire())
        first.handle(first.transport.receive(timeout=10))
    assert plumbing.flag.reason == Termination.INTER_STEP_QUEUE_FULL
    assert [slot.free.is_set() for slot in slots] == [False, True, True]
