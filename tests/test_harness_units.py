"""Harness pieces in one process: time cards, shared slots, the runner's hand-off, sources, arguments."""
from __future__ import annotations

import io
import json
import pickle
import queue
import time

import pytest
import torch
import torch.multiprocessing as mp

from rnb.harness import cli
from rnb.harness.control import Plumbing, SharedSlot, Signal, Termination
from models.toy import SyntheticFrames
from rnb.harness import joblog
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.sources import open_source
from rnb.harness.timecard import TimeCard, as_cards
from rnb.harness.runner import Runner, RunnerSpec

CTX = mp.get_context("spawn")


class CountingPaths:
    """A video_path_iterator class as RnB configs name them."""

    def __init__(self, prefix: str = "clip") -> None:
        self.prefix = prefix

    def __iter__(self):
        return (f"{self.prefix}{i}.mp4" for i in range(3))


def test_fork_then_merge_restores_one_card_with_spanning_events_and_fields_counted_once():
    card = TimeCard(7, "7")
    card.record("enqueue", 1.0)
    card.set_device(0, "cpu")
    card.set_field("bytes_fetched", 100)
    card.set_field("episode", "ep7")
    first, second = card.fork(2)
    first.record("runner1_start", 5.0), second.record("runner1_start", 4.0)
    first.record("runner1_finish", 6.0), second.record("runner1_finish", 9.0)
    first.set_device(1, "cuda:0"), second.set_device(1, "cuda:1")
    first.set_field("frames_decoded", 8), second.set_field("frames_decoded", 8)
    merged = TimeCard.merge([second, first])
    assert merged.segments == ()
    assert merged.events == {"enqueue": 1.0, "runner1_start": 4.0, "runner1_finish": 9.0}
    assert merged.devices == {0: "cpu", 1: "cuda:0+cuda:1"}
    assert merged.fields == {"bytes_fetched": 100, "episode": "ep7", "frames_decoded": 16}
    assert pickle.loads(pickle.dumps(merged)).events == merged.events


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


def test_shared_slot_keeps_valid_rows_and_rejects_outputs_that_do_not_fit():
    slot = SharedSlot.allocate(CTX, ((4, 3),), torch.device("cpu"))
    assert slot.tensors[0].is_shared()
    slot.write((torch.ones(2, 3),), "here")
    (copy,) = slot.read(torch.device("cpu"))
    assert torch.equal(copy, torch.ones(2, 3))
    assert copy.data_ptr() != slot.tensors[0].data_ptr()
    with pytest.raises(ValueError, match=r"here: output tensor 0 has shape \(5, 3\), which does not fit output_shape\(\) \(4, 3\)"):
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


def _spec(step: int, model: str, slots, sources, out_queues, kwargs, target=2, segments=1) -> RunnerSpec:
    return RunnerSpec(f"step{step}-g0-r0", step, 0, 0, "cpu", model, kwargs, None,
                      None if step == 0 else 0, out_queues, segments, target, slots, sources)


def test_runners_hand_tensors_over_through_slots_and_queues_carry_none():
    plumbing = Plumbing.build(CTX, [{0}], 10, None)
    kwargs = {"clips": 2, "frames": 2, "height": 4, "width": 4}
    shapes = SyntheticFrames.output_shape(**kwargs)
    slots = tuple(SharedSlot.allocate(CTX, shapes, torch.device("cpu")) for _ in range(2))
    first = Runner(_spec(0, "models.toy.SyntheticFrames", slots, {}, (0,), kwargs), plumbing)
    final = Runner(_spec(1, "models.toy.TinyConvNet", (), {(0, 0): slots}, (), {"clips": 2}), plumbing)

    for item in range(2):
        card = TimeCard(item, repr(item))
        card.record("enqueue")
        first.handle((item, card))
        signal = plumbing.step_queues[0][0].get(timeout=10)
        spy = _TensorSpy()
        spy.dump(signal)
        assert spy.tensors == []
        assert isinstance(signal, Signal) and (signal.step, signal.slot) == (0, item)
        assert not slots[item].free.is_set()
        assert torch.equal(slots[item].tensors[0], SyntheticFrames.frames_for(item, shapes[0]))
        final.handle(signal)
        assert slots[item].free.is_set()

    finished = [card for _ in range(2) for card in plumbing.results.get(timeout=10)]
    assert [card.item_id for card in finished] == [0, 1]
    assert plumbing.finished.value == 2 and plumbing.flag.reason == Termination.TARGET_REACHED
    for card in finished:
        assert [name for name in card.events] == ["enqueue", "runner0_start", "inference0_start", "inference0_finish",
                                                  "slot0_acquired", "runner0_finish", "runner1_start", "inference1_start",
                                                  "inference1_finish", "runner1_finish"]
        assert sorted(card.events.values()) == list(card.events.values())
        assert card.devices == {0: "cpu", 1: "cpu"} and card.fields == {"frames_decoded": 4}


def test_final_step_refuses_unmerged_segments():
    plumbing = Plumbing.build(CTX, [], 10, None)
    final = Runner(_spec(0, "models.toy.SyntheticFrames", (), {}, (), {}, target=5), plumbing)
    with pytest.raises(ValueError, match="item 4 reached the final step as an unmerged segment"):
        final.count(tuple(TimeCard(4).fork(2)))


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
    assert (args.videos, args.mean_interval_ms, args.warmup, args.queue_size, args.batch_size) == (7, 0, 0, 50000, 1)
    assert (args.concurrency, args.seed, args.cpu, args.log_dir) == (None, 0, False, "logs")


@pytest.mark.parametrize("argv, message", [
    (["-v", "0"], "command line: -v/--videos: expected a number >= 1, found 0"),
    (["-mi", "-1"], "command line: -mi/--mean_interval_ms: expected a number >= 0, found -1"),
    (["-mi", "nan"], "command line: -mi/--mean_interval_ms: expected a number >= 0, found nan"),
    (["--concurrency", "0"], "command line: --concurrency: expected a number >= 1, found 0"),
    (["-v", "ten"], "benchmark.py: argument -v/--videos: invalid int value: 'ten'"),
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


def test_job_id_carries_the_cli_values_and_directories_never_collide(tmp_path):
    start = time.mktime((2026, 11, 30, 9, 15, 0, 0, 0, -1))
    assert joblog.job_id(start, 3, 1, 2000, 50000, None) == "261130_091500-mi3-b1-v2000-qs50000"
    # Closed loop ignores -mi, so its id names the concurrency instead.
    assert joblog.job_id(start, 0.5, 4, 10, 9, 8) == "261130_091500-c8-b4-v10-qs9"
    names = [joblog.create_job_dir(str(tmp_path), "job").name for _ in range(3)]
    assert names == ["job", "job-2", "job-3"]


def test_a_full_inter_step_queue_ends_the_job_with_that_reason_and_frees_the_slot():
    plumbing = Plumbing.build(CTX, [{0}], 1, None)
    kwargs = {"clips": 1, "frames": 1, "height": 2, "width": 2}
    slots = tuple(SharedSlot.allocate(CTX, SyntheticFrames.output_shape(**kwargs), torch.device("cpu")) for _ in range(3))
    first = Runner(_spec(0, "models.toy.SyntheticFrames", slots, {}, (0,), kwargs), plumbing)
    for item in range(2):
        first.handle((item, TimeCard(item)))
    assert plumbing.flag.reason == Termination.INTER_STEP_QUEUE_FULL
    assert [slot.free.is_set() for slot in slots] == [False, True, True]
