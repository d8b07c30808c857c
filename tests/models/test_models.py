"""Episode models, R(2+1)D stages, aggregator, batcher, selector and the uint8 slot, called in-process."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import multiprocessing
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from torchvision.models.video import r2plus1d_18

import models
import selector as selector_module
from episodes import DEFAULT_COALESCE_GAP, EpisodeByteCache, open_dataset
from episodes._mp4.span import episode_span
from episodes._mp4.windows import frame_windows
from episodes._storage import coalesce_ranges
from models import shipped
from models.aggregator import Aggregator
from models.batcher import Batcher
from models.clips import ClipCount
from models.episode import EpisodeDecoder, EpisodeFetcher, EpisodeLoader
from models.episode_decode import to_clips
from models.episode_reader import sample_clip_frames
from models.r2p1d import R2P1DRunner, input_rows, stage_shape, warm_up_rows
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard
from rnb.engines.local.driver import allocate_slots
from rnb.engines.local.plumbing import SharedSlot
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.dataset_source import SourceOptions, parse_options, requests
from rnb.pipeline.plan import plan_runners
from selector import LargeSmallSelector
from tests.support.model_support import episode_range_bytes, one_torch_thread, tiny_dataset
from tests.support.mp4_fixtures import read_index

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_dataset(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The test's R(2+1)D passes on one intra-op thread (tests.support.model_support.one_torch_thread)."""
    with one_torch_thread():
        yield


def request(root: str, episode: int, upcoming: tuple[int, ...] = ()) -> dict:
    return {"request": EpisodeRequest("dataset", root, episode, upcoming)}


def test_clip_sampling_spreads_clips_evenly_inside_the_episode():
    rng = np.random.default_rng(0)
    frames = sample_clip_frames(100, 4, 8, rng)
    assert frames.shape == (4, 8)
    assert (np.diff(frames, axis=1) == 1).all()
    starts = frames[:, 0]
    assert starts[0] < 24 and (np.diff(starts) >= 23).all() and (np.diff(starts) <= 24).all() and frames.max() <= 99
    short = sample_clip_frames(3, 2, 5, rng)
    assert short.tolist() == [[0, 1, 2, 2, 2], [0, 1, 2, 2, 2]]


def test_clip_count_forms_and_errors():
    assert ClipCount.parse(3).maximum == 3
    choice = ClipCount.parse({"choices": [1, 15], "weights": [10, 1]})
    draws = [choice.draw(np.random.default_rng(seed)) for seed in range(200)]
    assert set(draws) == {1, 15} and draws.count(1) > draws.count(15) and choice.maximum == 15
    with pytest.raises(ValueError, match="every choice must be an int >= 1"):
        ClipCount.parse({"choices": [0, 2], "weights": [1, 1]})
    with pytest.raises(ValueError, match="num_clips must be a positive int"):
        ClipCount.parse("ten")


def test_loader_frames_equal_the_cache_frames_at_the_sampled_timestamps(dataset):
    loader = EpisodeLoader(CPU, num_clips=3, clip_length=4, size=32, tabular=["observation.state", "action"], seed=7)
    card = TimeCard(5)
    (clips,), out, card = loader((), request(dataset, 2, (3,)), card)
    assert clips.shape == (3, 3, 4, 32, 32) and clips.dtype == torch.float32
    assert EpisodeLoader.output_shape(num_clips=3, clip_length=4, size=32) == ((3, 3, 4, 32, 32),)

    ds = open_dataset(dataset)
    rng = np.random.default_rng([7, 5])
    numbers = sample_clip_frames(ds.episode_length(2), ClipCount.parse(3).draw(rng), 4, rng)
    with EpisodeByteCache(ds) as cache:
        raw = cache.get_frames(2, ds.video_keys[0], numbers.reshape(-1) / ds.fps)
    assert torch.equal(clips, to_clips(raw, 3, 32))
    assert not torch.equal(raw[0], raw[-1])  # the check would be weak if every frame looked alike

    assert out["episode"] == 2 and out["num_clips"] == 3
    table = ds.episode_table(2, ["observation.state"])
    assert np.array_equal(out["tabular"]["observation.state"], np.stack(table.column(0).to_numpy(zero_copy_only=False)))
    assert out["tabular"]["action"].shape == (ds.episode_length(2), 6)
    assert card.fields["frames_decoded"] == len(np.unique(numbers)) and card.fields["bytes_fetched"] > 0
    assert card.fields["episode"] == 2 and card.fields["num_clips"] == 3
    events = card.events
    assert events["fetch_start"] <= events["fetch_finish"] <= events["decode_start"] <= events["decode_finish"]


def test_split_fetch_then_decode_gives_the_loaders_clips_through_a_uint8_slot(dataset):
    kwargs = dict(num_clips=2, clip_length=4, seed=1)
    loader = EpisodeLoader(CPU, size=32, **kwargs)
    fetcher = EpisodeFetcher(CPU, max_bytes=2**20, **kwargs)
    decoder = EpisodeDecoder(CPU, size=32, num_clips=2, clip_length=4)
    assert EpisodeFetcher.output_dtypes() == (torch.uint8,)
    slot = SharedSlot.allocate(multiprocessing.get_context("spawn"), EpisodeFetcher.output_shape(max_bytes=2**20),
                               CPU, EpisodeFetcher.output_dtypes())
    assert slot.tensors[0].dtype == torch.uint8 and slot.tensors[0].shape == (2**20,)

    (expected,), _, _ = loader((), request(dataset, 1), TimeCard(3))
    (data,), between, card = fetcher((), request(dataset, 1), TimeCard(3))
    slot.write((data,), "fetcher")
    (received,) = slot.read(CPU)
    assert torch.equal(received, data) and received.dtype == torch.uint8
    (clips,), out, card = decoder((received,), between, card)
    assert torch.equal(clips, expected)
    assert "mini" not in out and out["episode"] == 1
    assert card.fields["bytes_fetched"] == episode_range_bytes(dataset, 1) and card.fields["bytes_reused"] == 0

    small = EpisodeFetcher(CPU, max_bytes=100, **kwargs)
    with pytest.raises(ValueError, match="more than max_bytes \\(100\\); raise the step's max_bytes"):
        small((), request(dataset, 1), TimeCard(3))


def clip_window_bytes(root: str, ep: int, frames: np.ndarray) -> int:
    """What fetching only the GOPs of `frames` reads: their windows' runs, coalesced as the cache does."""
    ds = open_dataset(root)
    segment = ds.episode(ep).videos[ds.video_keys[0]]
    index = read_index(Path(root) / segment.path)
    runs = frame_windows(index, episode_span(index, segment.from_timestamp, segment.to_timestamp), frames).runs
    return sum(e - s for s, e in coalesce_ranges([(r.byte_start, r.byte_end) for r in runs], DEFAULT_COALESCE_GAP))


@pytest.mark.parametrize("split", [False, True])
def test_clips_fetch_gives_the_episode_fetch_clips_from_only_their_gops(dataset, split):
    kwargs = dict(num_clips=1, clip_length=3, seed=4)
    episode_loader = EpisodeLoader(CPU, size=32, **kwargs)
    if split:
        fetcher = EpisodeFetcher(CPU, max_bytes=2**20, fetch="clips", **kwargs)
        decoder = EpisodeDecoder(CPU, size=32, num_clips=1, clip_length=3)
    else:
        clips_loader = EpisodeLoader(CPU, size=32, fetch="clips", **kwargs)
    fewer = 0
    for item in range(6):
        ep = item % 4
        (expected,), _, whole = episode_loader((), request(dataset, ep), TimeCard(item))
        if split:
            (data,), between, card = fetcher((), request(dataset, ep), TimeCard(item))
            (clips,), _, card = decoder((data,), between, card)
        else:
            (clips,), _, card = clips_loader((), request(dataset, ep), TimeCard(item))
        assert torch.equal(clips, expected), item
        rng = np.random.default_rng([4, item])
        frames = sample_clip_frames(open_dataset(dataset).episode_length(ep), 1, 3, rng)
        assert card.fields["bytes_fetched"] == clip_window_bytes(dataset, ep, np.unique(frames))
        assert card.fields["bytes_reused"] == 0 and card.fields["frames_decoded"] == len(np.unique(frames))
        fewer += card.fields["bytes_fetched"] < whole.fields["bytes_fetched"]
    assert fewer >= 3  # an early clip needs only the GOPs up to its last frame
    with pytest.raises(ValueError, match='fetch must be "episode" or "clips", got \'gop\''):
        EpisodeLoader(CPU, fetch="gop")


def test_bytes_fetched_counts_what_the_item_caused_and_bytes_reused_what_it_found(dataset):
    loader = EpisodeLoader(CPU, num_clips=1, clip_length=2, size=16, prefetch=1, seed=2)
    sizes = {ep: episode_range_bytes(dataset, ep) for ep in (1, 2)}
    cards = [loader((), request(dataset, ep, upcoming), TimeCard(item))[2]
             for item, (ep, upcoming) in enumerate([(1, (2,)), (2, ()), (2, ())])]
    fields = [(c.fields["bytes_fetched"], c.fields["bytes_reused"]) for c in cards]
    # Item 0 fetched episode 1 and started episode 2's prefetch, which item 1 is the first to use; item 2 reuses it.
    assert fields == [(sizes[1], 0), (sizes[2], 0), (0, sizes[2])]


def test_output_dtypes_reach_the_planned_slots():
    document = {"source": {}, "pipeline": [
        {"model": "models.episode.EpisodeFetcher", "queue_groups": [{"gpus": [-1], "out_queues": [0]}], "max_bytes": 4096},
        {"model": "models.episode.EpisodeDecoder", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}],
         "num_clips": 2, "clip_length": 4, "size": 32},
        {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0}], "size": 32}]}
    fetch, decode, _ = plan_runners(parse_config(document, "c.json"), 1)
    assert (fetch.output_shapes, fetch.output_dtypes) == (((4096,),), (torch.uint8,))
    assert (decode.output_shapes, decode.output_dtypes) == (((2, 3, 4, 32, 32),), ())


def test_split_loader_bytes_stay_in_host_memory_on_gpu_runners():
    """Fetcher and decoder both on GPU 0: the mini-MP4 bytes never go to the GPU, the clips do."""
    document = {"source": {}, "pipeline": [
        {"model": "models.episode.EpisodeFetcher", "queue_groups": [{"gpus": [0], "out_queues": [0]}]},
        {"model": "models.episode.EpisodeDecoder", "queue_groups": [{"gpus": [0], "in_queue": 0, "out_queues": [0]}]},
        {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [0], "in_queue": 0}]}]}
    fetch, decode, network = plan_runners(parse_config(document, "c.json"), 1)
    assert (fetch.device, fetch.input_device, fetch.output_device) == ("cuda:0", "cuda:0", "cpu")
    assert (decode.device, decode.input_device, decode.output_device) == ("cuda:0", "cpu", "cuda:0")
    assert (network.input_device, network.output_device) == ("cuda:0", "cuda:0")
    # the job allocates the fetcher's slots in shared host memory
    (slot,) = allocate_slots(multiprocessing.get_context("spawn"), dataclasses.replace(fetch, num_slots=1))
    assert [(t.device.type, t.dtype, t.is_shared()) for t in slot.tensors] == [("cpu", torch.uint8, True)]


@pytest.mark.usefixtures("one_thread")
def test_warm_up_sizes_are_every_row_count_a_batch_of_items_can_have():
    rnb = {"choices": [1, 15], "weights": [10, 1]}
    assert input_rows(rnb, 1) == [1, 15]
    assert input_rows(rnb, 3) == [1, 2, 3, 15, 16, 17, 30, 31, 45]
    assert input_rows(10, 4) == [10, 20, 30, 40]
    runner = R2P1DRunner(CPU, 1, 5, num_clips=rnb, clip_length=4, size=32)
    assert runner.notes[-1] == "R2P1DRunner warm-up (on the CPU): 1 pass(es) at 1 rows"


@pytest.mark.gpu
def test_gpu_runner_turns_cudnn_benchmark_on_and_warms_every_size():
    runner = R2P1DRunner(torch.device("cuda:0"), 1, 5, num_clips={"choices": [1, 15], "weights": [10, 1]},
                         clip_length=4, size=32, batch=2)
    assert torch.backends.cudnn.benchmark
    assert runner.notes[-1] == "R2P1DRunner warm-up (cudnn.benchmark on): 1 pass(es) at 1, 2, 15, 16, 30 rows"


def _rnb_pipeline(later: dict) -> dict:
    """Loader -> batcher (per-group batch) -> R(2+1)D stages 1-3 -> stages 4-5; `later` goes on every later step."""
    loader = {"model": "models.episode.EpisodeLoader", "queue_groups": [{"gpus": [-1], "out_queues": [0, 1]}],
              "num_clips": {"choices": [1, 15], "weights": [10, 1]}, "clip_length": 8, "size": 112}
    return {"source": {}, "pipeline": [
        loader,
        {"model": "models.batcher.Batcher", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]},
                                                            {"gpus": [-1], "in_queue": 1, "out_queues": [0], "batch": 1}],
         **later},
        {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}],
         "start_index": 1, "end_index": 3, **later},
        {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0}],
         "start_index": 4, "end_index": 5, **later}]}


def test_later_steps_size_themselves_from_the_previous_steps_outputs():
    placements = plan_runners(parse_config(_rnb_pipeline({}), "c.json"), 4)
    assert [(p.name, p.input_shapes, p.output_shapes) for p in placements] == [
        ("step0-g0-r0", None, ((15, 3, 8, 112, 112),)),
        ("step1-g0-r0", ((15, 3, 8, 112, 112),), ((60, 3, 8, 112, 112),)),
        ("step1-g1-r0", ((15, 3, 8, 112, 112),), ((15, 3, 8, 112, 112),)),
        ("step2-g0-r0", ((60, 3, 8, 112, 112),), ((60, 128, 4, 28, 28),)),
        ("step3-g0-r0", ((60, 128, 4, 28, 28),), ())]
    assert placements[4].model_kwargs["input_shapes"] == ((60, 128, 4, 28, 28),)
    repeated = {"num_clips": {"choices": [1, 15], "weights": [10, 1]}, "clip_length": 8, "size": 112}
    old_style = plan_runners(parse_config(_rnb_pipeline(repeated), "c.json"), 4)
    assert [p.output_shapes for p in old_style] == [p.output_shapes for p in placements]


def test_segments_size_the_next_step_and_a_model_without_input_shapes_still_plans():
    document = {"source": {}, "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
         "num_segments": 3, "clips": 7, "frames": 2, "height": 8, "width": 8},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
        {"model": "tests.support.fixture_models.Frames", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
        {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
    frames, net, legacy, head = plan_runners(parse_config(document, "c.json"), 1)
    assert (net.input_shapes, net.output_shapes) == (((3, 3, 2, 8, 8),), ((3, 10),))  # 7 clips in 3 segments: <= 3 each
    assert (legacy.input_shapes, legacy.output_shapes, head.input_shapes) == (((3, 10),), ((1, 4),), ((1, 4),))
    assert "input_shapes" not in legacy.model_kwargs


def test_a_network_cut_that_does_not_fit_its_input_is_a_config_error():
    document = _rnb_pipeline({})
    document["pipeline"][2]["start_index"] = 3
    with pytest.raises(ConfigError, match=r"c.json: pipeline\[2\].model: expected output_shape\(\) to accept the step's "
                                          r"keywords, found ValueError: stage 3 takes one tensor of \(clips, 64, frames, "
                                          r"height, width\), but the previous step outputs \(\(60, 3, 8, 112, 112\),\)"):
        plan_runners(parse_config(document, "c.json"), 4)


@pytest.mark.usefixtures("one_thread")
def test_a_network_built_on_its_input_shape_warms_up_on_it_and_pads_empty_segments():
    net = R2P1DRunner(CPU, 3, 5, num_classes=7, input_shapes=((2, 64, 5, 19, 19),))
    (empty,), _, _ = net((torch.zeros(0, 64, 5, 19, 19),), {}, None)
    (logits,), _, _ = net((torch.zeros(2, 64, 5, 19, 19),), {}, None)
    assert (tuple(empty.shape), tuple(logits.shape)) == ((0, 7), (2, 7))
    assert net.notes[-1] == "R2P1DRunner warm-up (on the CPU): 1 pass(es) at 1 rows"
    # Without the loader's clip counts any row count up to the input's may come; with them, exactly theirs.
    rnb = {"choices": [1, 15], "weights": [10, 1]}
    assert warm_up_rows(None, 3, ((4, 3, 8, 32, 32),)) == [1, 2, 3, 4]
    assert warm_up_rows(rnb, 3, ((45, 3, 8, 32, 32),)) == input_rows(rnb, 3)


@pytest.mark.usefixtures("one_thread")
def test_every_stage_shape_matches_the_network_and_cut_logits_equal_whole_logits():
    x = torch.randn(2, 3, 5, 37, 37, generator=torch.Generator().manual_seed(0))
    whole = R2P1DRunner(CPU, 1, 5, num_clips=2, clip_length=5, size=37, warmup=0)
    first = R2P1DRunner(CPU, 1, 2, num_clips=2, clip_length=5, size=37, warmup=0)
    rest = R2P1DRunner(CPU, 3, 5, num_clips=2, clip_length=5, size=37, warmup=0)
    (logits,), _, _ = whole((x,), {}, None)
    (middle,), _, _ = first((x,), {}, None)
    (cut,), _, _ = rest((middle,), {}, None)
    assert logits.shape == (2, 400) and torch.allclose(cut, logits, atol=1e-5)
    y = x
    for stage in range(1, 6):
        (y,), _, _ = R2P1DRunner(CPU, stage, stage, 2, 5, 37, warmup=0)((y,), {}, None)
        assert R2P1DRunner.output_shape(stage, stage, 2, 5, 37) == (tuple(y.shape),)
        assert tuple(y.shape[1:]) == stage_shape(stage, 5, 37)
    assert R2P1DRunner.output_shape(1, 3, {"choices": [1, 15], "weights": [1, 1]}, 8, 112, batch=4) == ((60, 128, 4, 28, 28),)
    assert whole.notes == ["R2P1DRunner stages 1-5: random weights (seed 0; no checkpoint given); float32 "
                           "(weights and inputs cast, not autocast)"]
    with pytest.raises(ValueError, match="1 <= start_index <= end_index <= 5, got 4 and 2"):
        R2P1DRunner.output_shape(4, 2)


@pytest.mark.usefixtures("one_thread")
def test_checkpoint_weights_are_loaded_and_named(tmp_path):
    donor = R2P1DRunner(CPU, 1, 5, 1, 4, 32, seed=3, warmup=0)
    path = tmp_path / "r2p1d.pt"
    torch.save(torch.nn.Sequential(*donor.net).state_dict(), path)  # stage-keyed, not a torchvision state_dict
    with pytest.raises(RuntimeError, match="state_dict"):
        R2P1DRunner(CPU, 1, 5, 1, 4, 32, checkpoint=str(path), warmup=0)
    net = r2plus1d_18(weights=None)
    torch.save(net.state_dict(), path)
    loaded = R2P1DRunner(CPU, 1, 5, 1, 4, 32, checkpoint=str(path), warmup=0)
    x = torch.randn(1, 3, 4, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(loaded((x,), {}, None)[0][0], net.eval()(x), atol=1e-5)
    assert loaded.notes == [f"R2P1DRunner stages 1-5: checkpoint {path}; float32 (weights and inputs cast, not autocast)"]
    with pytest.raises(ValueError, match="checkpoint /no/such.pt is not a file"):
        R2P1DRunner.output_shape(checkpoint="/no/such.pt")


def test_aggregator_merges_segments_in_order_and_predicts_once_per_item():
    aggregator = Aggregator(CPU, num_classes=4)
    logits = torch.tensor([[0.0, 1, 0, 0], [0, 0, 3, 0], [0, 2, 0, 0]])
    card = TimeCard(9)
    card.set_field("bytes_fetched", 10)
    parts = card.fork(3)
    order = [2, 0, 1]
    results = [aggregator((logits[i:i + 1] if i != 1 else logits[1:1],), {}, parts[i]) for i in order]
    assert [r[2] for r in results[:2]] == [None, None]
    (sums,), out, merged = results[2]
    assert merged.item_id == 9 and merged.segments == () and merged.fields["bytes_fetched"] == 10
    assert sums.tolist() == [[0.0, 3, 0, 0]] and out["predictions"] == [1] and merged.fields["prediction"] == 1
    assert aggregator.pending == {}


def test_aggregator_splits_a_batch_by_each_items_clip_count():
    cards = (TimeCard(0), TimeCard(1))
    logits = torch.tensor([[1.0, 0], [1.0, 0], [0, 5.0]])
    (sums,), out, back = Aggregator(CPU, num_classes=2)((logits,), {"items": [{"num_clips": 2}, {"num_clips": 1}]}, cards)
    assert sums.tolist() == [[2.0, 0], [0, 5.0]] and out["predictions"] == [0, 1]
    assert [c.fields["prediction"] for c in back] == [0, 1]


def test_batcher_stacks_full_batches_and_flushes_the_rest_after_its_timeout():
    batcher = Batcher(CPU, batch=3, num_clips=2, clip_length=1, size=1, timeout_ms=0)
    assert Batcher.output_shape(batch=3, num_clips=2, clip_length=1, size=1) == ((6, 3, 1, 1, 1),)
    emitted = []
    for item in range(10):
        clips = torch.full((1 + item % 2, 3, 1, 1, 1), float(item))
        result = batcher((clips,), {"num_clips": 1 + item % 2}, TimeCard(item))
        if result[2] is not None:
            emitted.append(result)
    assert [[c.item_id for c in r[2]] for r in emitted] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert emitted[0][0][0][:, 0, 0, 0, 0].tolist() == [0, 1, 1, 2]
    assert [i["num_clips"] for i in emitted[1][1]["items"]] == [2, 1, 2]
    (rest,), _, cards = batcher.flush()
    assert [c.item_id for c in cards] == [9] and rest.shape[0] == 2
    assert batcher.flush()[2] is None
    waiting = Batcher(CPU, batch=3, timeout_ms=60_000)
    waiting((torch.zeros(1, 3, 8, 112, 112),), {}, TimeCard(0))
    assert waiting.flush()[2] is None

    with pytest.raises(TypeError) as caught:
        waiting((torch.zeros(1, 3, 8, 112, 112),), {}, (TimeCard(4), TimeCard(5)))
    assert str(caught.value) == ("Batcher takes one item per call, found a batch of 2 (items 4, 5): a step after a "
                                 "batching one needs a model that takes batches")


def classes_defined_in(modules: list[ModuleType], member: str) -> set[type]:
    """The classes these modules define (not import) that have `member`."""
    return {cls for module in modules for cls in vars(module).values()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and hasattr(cls, member)}


def test_every_model_and_selector_class_shipped_is_in_the_tuple_mypy_checks_against_the_contract():
    """models/shipped.py and selector.py hold each class to rnb.core.model's protocols; none may be left out."""
    # walk_packages: a model module that becomes a package keeps its classes in view
    modules = [importlib.import_module(info.name) for info in pkgutil.walk_packages(models.__path__, "models.")]
    assert classes_defined_in(modules, "output_shape") == set(shipped.MODEL_CLASSES)
    assert len(shipped.MODEL_CLASSES) == len(set(shipped.MODEL_CLASSES))  # each listed once
    assert classes_defined_in([selector_module], "select") == set(selector_module.SELECTOR_CLASSES) == {
        selector_module.RoundRobinSelector, LargeSmallSelector}


def test_large_small_selector_routes_by_clip_count():
    selector = LargeSmallSelector(2, threshold=4)
    assert [selector.select((), {"num_clips": n}, None) for n in (1, 4, 5, 15)] == [0, 0, 1, 1]
    assert selector.select((torch.zeros(6, 3),), {}, None) == 1
    with pytest.raises(ValueError, match="exactly two output queues"):
        LargeSmallSelector(3)


def test_sources_cycle_in_order_with_lookahead_and_reject_bad_keys(dataset):
    options = SourceOptions("dataset", dataset, "sequential", None, (1, 3), 2, False)
    first = [next(stream) for stream in [requests(options, 4)] for _ in range(5)]
    assert [(r.episode, r.upcoming) for r in first] == [(1, (3, 1)), (3, (1, 3)), (1, (3, 1)), (3, (1, 3)), (1, (3, 1))]
    assert repr(first[0]) == f"{dataset}#1"
    shuffled = requests(SourceOptions("dataset", dataset, "random", None, None, 0, False), 4, seed=5)
    episodes = [next(shuffled).episode for _ in range(8)]
    assert sorted(episodes[:4]) == sorted(episodes[4:]) == [0, 1, 2, 3] and episodes[:4] != [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="c.json: source.order: expected \"random\" or \"sequential\""):
        parse_options({"dataset": dataset, "order": "backwards"}, "c.json")
    with pytest.raises(ConfigError, match="c.json: source.generate_if_missing: expected one of the videos source keys"):
        parse_options({"videos": "*.mp4", "generate_if_missing": True}, "c.json")


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_r2p1d_runs_in_the_dtype_and_layout_asked_and_says_so(dtype):
    x = torch.rand((2, 3, 2, 16, 16))
    reference = R2P1DRunner(CPU, 1, 2, clip_length=2, size=16, warmup=0)
    runner = R2P1DRunner(CPU, 1, 2, clip_length=2, size=16, warmup=0, dtype=dtype, channels_last=True)
    assert all(p.dtype == getattr(torch, dtype) for p in runner.net.parameters())
    (out,), _, _ = runner((x,), {}, TimeCard(0))
    (expected,), _, _ = reference((x,), {}, TimeCard(0))
    assert out.dtype == getattr(torch, dtype) and out.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(out.float(), expected, atol=0.1, rtol=0.05)
    assert runner.notes[0] == (f"R2P1DRunner stages 1-2: random weights (seed 0; no checkpoint given); {dtype} "
                               "(weights and inputs cast, not autocast), channels_last (NDHWC)")
    assert R2P1DRunner.output_dtypes(dtype=dtype) == (getattr(torch, dtype),)
    assert reference.notes[0].endswith("; float32 (weights and inputs cast, not autocast)")


def test_r2p1d_slots_carry_its_dtype_and_a_wrong_dtype_is_a_config_error():
    def config(dtype: str) -> dict:
        return {"source": {}, "pipeline": [
            {"model": "models.episode.EpisodeLoader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
            {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}],
             "start_index": 1, "end_index": 3, "dtype": dtype},
            {"model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0}],
             "start_index": 4, "end_index": 5, "dtype": dtype}]}
    _, first, _ = plan_runners(parse_config(config("bfloat16"), "half.json"), 1)
    assert first.output_dtypes == (torch.bfloat16,)
    with pytest.raises(ConfigError, match=r"pipeline\[1\]\.model: expected output_shape\(\) to accept the step's "
                                          r"keywords, found ValueError: dtype must be one of float32, float16, "
                                          r"bfloat16, got 'half'"):
        plan_runners(parse_config(config("half"), "half.json"), 1)


def test_cpu_spin_computes_its_cpu_time_per_item_and_hands_its_input_on():
    import time

    from models.toy import CpuSpin, SyntheticFrames
    loader = CpuSpin(torch.device("cpu"), ms=5.0, ms_per_item=10.0)
    cards = (TimeCard(3), TimeCard(4))
    before = time.thread_time()
    frames, = loader((), {"request": None}, cards).tensors
    assert time.thread_time() - before >= 0.025                      # 5 ms + 2 items x 10 ms, all of it CPU
    assert torch.equal(frames, torch.cat([SyntheticFrames.frames_for(i, (2, 3, 4, 16, 16)) for i in (3, 4)]))
    passed, = CpuSpin(torch.device("cpu"), ms=1.0)((frames,), {"request": None}, cards).tensors
    assert torch.equal(passed, frames) and passed.data_ptr() != frames.data_ptr()
    assert CpuSpin.output_shape(input_shapes=((4, 10),)) == ((4, 10),)


def test_sync_sleep_sleeps_in_its_call_and_hands_its_input_on_as_it_came():
    import time

    from models.toy import SyncSleep
    frames, cards, extra = torch.ones(2, 3), (TimeCard(1),), {"request": 7}
    before = time.monotonic()
    output = SyncSleep(torch.device("cpu"), ms=20.0)((frames,), extra, cards)
    assert time.monotonic() - before >= 0.02
    assert output.tensors[0] is frames and output.non_tensors is extra and output.time_card is cards  # nothing made
    assert SyncSleep.output_shape() is None and SyncSleep.output_shape(input_shapes=((2, 3),)) == ((2, 3),)


def test_sync_sleep_as_a_first_step_feeding_another_is_refused_for_lack_of_an_output():
    raw = {"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyncSleep", "queue_groups": [{"gpus": [-1], "out_queues": [0]}], "num_shared_tensors": 2},
        {"model": "models.toy.SyncSleep", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
    with pytest.raises(ConfigError, match=r"pipeline\[0\]\.model: expected output_shape\(\) to give a non-empty tuple "
                                          r"of shapes \(tuples of positive ints\) because the step feeds another, found None"):
        plan_runners(parse_config(raw, "sleep.json"), 1)
