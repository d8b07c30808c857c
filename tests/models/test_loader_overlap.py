"""The loader decodes while the network fetches: the same frames and clips with and without fetching ahead, the
byte budget held, a failed or stalled fetch ahead raised to the item that needed it, items in order."""
from __future__ import annotations

import gc
import re
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench.overlap_bench import overlap_rates
from episodes import EpisodeByteCache, FetchedFrames, FetchError, FrameRequest, _ready_parts, open_dataset
from episodes._budget import ByteBudget
from episodes._ready_parts import ReadyParts
from episodes._storage import RangeAnswer, Storage
from episodes.synthetic import make_dataset
from episodes.testing.faults import serve_with_faults
from episodes.tools.verify import FullFileReference
from models.episode import EpisodeLoader
from models.episode_decode import clips_of
from models.episode_reader import cache_dir, sample_clip_frames
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard

CPU = torch.device("cpu")
ORDER = [4, 1, 5, 0, 3, 2, 4, 1]   # items 0..7: episode of each (episode 4 and 1 twice)
CLIPS, LENGTH, SIZE, SEED = 3, 4, 32, 11


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six short 64x64 H.264 episodes with B-frames, three to a file, keyframe every 6 frames."""
    return make_dataset(tmp_path_factory.mktemp("overlap"), episodes=6, cameras=1, episodes_per_file=3,
                        min_length=24, max_length=36, width=64, height=64, gop=6, bframes=2)


def requests(root: str, order: list[int] = ORDER, timeout_s: float = 30.0, retries: int = 3) -> list[EpisodeRequest]:
    """Item i's request: its episode, naming the two after it, as a dataset source sends them."""
    return [EpisodeRequest("dataset", root, ep, tuple(order[i + 1 : i + 3]), timeout_s, retries)
            for i, ep in enumerate(order)]


def loader(fetch: str, prefetch: int, **kwargs: object) -> EpisodeLoader:
    return EpisodeLoader(CPU, fetch=fetch, num_clips=CLIPS, clip_length=LENGTH, size=SIZE, seed=SEED,
                         prefetch=prefetch, workers=2, coalesce_gap=0, **kwargs)  # type: ignore[arg-type]


def run(model: EpisodeLoader, reqs: list[EpisodeRequest]) -> tuple[list[torch.Tensor], list[TimeCard]]:
    outputs, cards = [], []
    for item, request in enumerate(reqs):
        card = TimeCard(item)
        (clips,), _, _ = model((), {"request": request}, card)
        outputs.append(clips)
        cards.append(card)
    return outputs, cards


def started_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int], bool]]:
    """Every request a cache starts fetching, as (episode, frame numbers, ahead), recorded."""
    seen: list[tuple[int, list[int], bool]] = []
    original = EpisodeByteCache.start_fetch

    def spy(self: EpisodeByteCache, reqs: list[FrameRequest], **kwargs: object):  # type: ignore[no-untyped-def]
        seen.extend((r.episode, np.asarray(r.frame_numbers).tolist(), bool(kwargs.get("ahead"))) for r in reqs)
        return original(self, reqs, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(EpisodeByteCache, "start_fetch", spy)
    return seen


def drawn_clips(ds_length: int, item: int, clips: int = CLIPS) -> np.ndarray:
    """Item `item`'s clip frames as the loader's sampler draws them: from the seed and the item id alone."""
    rng = np.random.default_rng([SEED, item])
    return sample_clip_frames(ds_length, clips, LENGTH, rng)


@pytest.mark.parametrize("fetch", ["clips", "episode"])
def test_fetching_ahead_gives_exactly_the_frames_and_clips_of_fetching_on_the_spot(
        root: Path, fetch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = started_requests(monkeypatch)
    spot, spot_cards = run(loader(fetch, prefetch=0), requests(str(root)))
    on_the_spot, seen[:] = list(seen), []
    ahead, ahead_cards = run(loader(fetch, prefetch=2), requests(str(root)))
    ds = open_dataset(str(root))
    key = ds.video_keys[0]
    reference = FullFileReference(ds)
    try:
        wanted = []
        for item, ep in enumerate(ORDER):
            frames = drawn_clips(ds.episode_length(ep), item)
            wanted.append((ep, np.unique(frames).tolist()))
            expected = clips_of(frames, reference.frames(ep, key, np.unique(frames)), SIZE)
            assert torch.equal(spot[item], expected) and torch.equal(ahead[item], expected), item
    finally:
        reference.close()
    assert on_the_spot == [(ep, frames, False) for ep, frames in wanted]
    # Ahead: item 0 on the spot, then at item i the two after it (those already started are not started again).
    assert seen[0] == (*wanted[0], False)
    assert seen[1:] == [(*wanted[i], True) for i in range(1, len(ORDER))]
    assert [c.fields["episode"] for c in ahead_cards] == ORDER
    assert all("fetch_start" in c.events and "prefetch_wait_start" not in c.events for c in spot_cards)
    # A whole episode read before is kept: its item fetches nothing (a fetch span of nothing, its bytes reused).
    kept = [fetch == "episode" and ep in ORDER[:item] for item, ep in enumerate(ORDER)]
    assert ["prefetch_wait_start" in c.events for c in ahead_cards] == [item > 0 and not kept[item]
                                                                        for item in range(len(ORDER))]
    assert [c.fields["bytes_fetched"] == 0 for c in ahead_cards] == kept
    for card in ahead_cards:
        span = "prefetch_wait" if "prefetch_wait_start" in card.events else "fetch"
        events = [card.events[f"{span}_start"], card.events[f"{span}_finish"], card.events["decode_start"],
                  card.events["decode_finish"]]
        assert events == sorted(events)


def test_the_byte_budget_decides_how_far_ahead_and_is_never_exceeded(root: Path) -> None:
    spot, spot_cards = run(loader("clips", prefetch=0), requests(str(root)))
    sizes = [int(c.fields["bytes_fetched"]) for c in spot_cards]
    # One byte: no fetch ahead fits, so each item fetches its own, a read larger than the budget alone.
    model = loader("clips", prefetch=2, byte_budget=1)
    clips, cards = run(model, requests(str(root)))
    stats = model.reader.caches()[0].stats()
    assert all(torch.equal(a, b) for a, b in zip(clips, spot))
    assert stats.prefetches_skipped == len(ORDER) - 1 and stats.peak_bytes_held == max(sizes)
    assert all("fetch_start" in c.events for c in cards)
    # What two items' ranges hold: some items are fetched ahead, as many as fit, and the budget is never exceeded.
    budget = 2 * max(sizes)
    model = loader("clips", prefetch=2, byte_budget=budget)
    clips, cards = run(model, requests(str(root)))
    stats = model.reader.caches()[0].stats()
    assert all(torch.equal(a, b) for a, b in zip(clips, spot))
    assert stats.peak_bytes_held <= budget and stats.bytes_held == 0
    assert sum("prefetch_wait_start" in c.events for c in cards) > 0
    # Each item after the first was fetched ahead and waited for, or not started for want of room, or dropped to
    # make room for an item's own fetch (the timing decides which).
    waited = sum("prefetch_wait_start" in c.events for c in cards)
    assert stats.prefetches_skipped + stats.prefetches_dropped + waited == len(ORDER) - 1


def test_an_episode_cache_holds_its_kept_and_fetched_bytes_within_the_budget(root: Path) -> None:
    ds = open_dataset(str(root))
    key = ds.video_keys[0]
    with EpisodeByteCache(ds) as sizing:
        minis = [len(sizing.fetch_frames([FrameRequest(ep, key)])[0].mini.data) for ep in range(ds.num_episodes)]
    budget = 2 * max(minis)
    model = loader("episode", prefetch=2, byte_budget=budget)
    clips, _ = run(model, requests(str(root)))
    spot, _ = run(loader("episode", prefetch=0), requests(str(root)))
    stats = model.reader.caches()[0].stats()
    assert all(torch.equal(a, b) for a, b in zip(clips, spot))
    assert stats.peak_bytes_held <= budget and stats.evictions > 0 and stats.cached_bytes <= budget


def test_a_later_items_bytes_landing_first_keep_every_item_its_own_frames(root: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 1's read is held back until item 2's has landed: each still gets its own clips, in order."""
    spot, _ = run(loader("episode", prefetch=0), requests(str(root)))
    ds = open_dataset(str(root))
    spans = {ep: episode_span_of(ds, ep) for ep in (ORDER[1], ORDER[2])}
    second_landed = threading.Event()
    original = Storage.read_range

    def held_back(self: Storage, rel: str, start: int, end: int) -> bytes:
        if (rel, start, end) == spans[ORDER[1]]:
            assert second_landed.wait(30), "item 2's read never landed"
        data = original(self, rel, start, end)
        if (rel, start, end) == spans[ORDER[2]]:
            second_landed.set()
        return data
    monkeypatch.setattr(Storage, "read_range", held_back)
    clips, cards = run(loader("episode", prefetch=2), requests(str(root)))
    assert second_landed.is_set()
    assert [c.item_id for c in cards] == list(range(len(ORDER))) and [c.fields["episode"] for c in cards] == ORDER
    assert all(torch.equal(a, b) for a, b in zip(clips, spot))


def episode_span_of(ds, ep: int) -> tuple[str, int, int]:  # type: ignore[no-untyped-def]
    """(file, first byte, end byte) of the range a whole-episode fetch of `ep` reads."""
    with EpisodeByteCache(ds) as cache:
        record = ds.episode(ep)
        span = cache._files.span(record, ds.video_keys[0]).span
        return record.videos[ds.video_keys[0]].path, span.byte_start, span.byte_end


FAULTY = "videos/observation.images.cam0/chunk-000/file-001.mp4"   # episodes 3 to 5


@pytest.mark.parametrize("fetch", ["clips", "episode"])
@pytest.mark.parametrize("fault", ["status_503", "stall"])
def test_a_fetch_ahead_that_fails_or_stalls_is_the_error_of_the_item_that_needed_it(
        root: Path, fetch: str, fault: str) -> None:
    """Item 1 reads the one file whose range reads fail (503) or never answer: items 0 and 2 are read, item 1 gets
    the one sentence a direct fetch of its frames gets, within the source's timeout."""
    order = [0, 4, 1, 2]
    failing = threading.Event()

    def by_range(path: str, first: int, last: int) -> str | None:
        return fault if failing.is_set() and path.endswith(FAULTY) else None

    with serve_with_faults(root, lambda n: None, by_range=by_range) as url:
        ds = open_dataset(url, timeout_s=1.0, retries=0)
        with EpisodeByteCache(ds, cache_dir=cache_dir()) as warm:   # the indexes, read before the faults start
            warm.index_files([FAULTY, FAULTY.replace("file-001", "file-000")])
        failing.set()
        frames = np.unique(drawn_clips(ds.episode_length(4), 1, clips=1))
        with EpisodeByteCache(ds, cache_dir=cache_dir(), coalesce_gap=0) as direct, \
                pytest.raises(FetchError) as directly:
            direct.fetch_frames([FrameRequest(4, ds.video_keys[0], frame_numbers=frames)],
                                fetch="windows" if fetch == "clips" else "episode")
        assert re.fullmatch(rf"{re.escape(url)}/{FAULTY}: episode 4, camera observation.images.cam0: read of bytes "
                            r"\[\d+, \d+\) failed.*", str(directly.value))
        model = EpisodeLoader(CPU, fetch=fetch, num_clips=1, clip_length=LENGTH, size=SIZE, seed=SEED, prefetch=2,
                              workers=2, coalesce_gap=0)
        reqs = requests(url, order, timeout_s=1.0, retries=0)
        outputs = [model((), {"request": reqs[0]}, TimeCard(0))[0][0]]
        with pytest.raises(FetchError) as ahead:
            model((), {"request": reqs[1]}, TimeCard(1))
        assert str(ahead.value) == str(directly.value)
        outputs += [model((), {"request": reqs[i]}, TimeCard(i))[0][0] for i in (2, 3)]
    assert [tuple(o.shape) for o in outputs] == [(1, 3, LENGTH, SIZE, SIZE)] * 3


def test_a_request_decodes_its_first_ranges_while_its_last_is_still_on_the_wire(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = open_dataset(str(root))
    key = ds.video_keys[0]
    n = ds.episode_length(2)
    request = FrameRequest(2, key, frame_numbers=[n - 1, 0, 13, 0])   # three GOPs apart, one asked twice
    with EpisodeByteCache(ds, coalesce_gap=0) as cache:
        runs = cache._plan(request).windows.runs   # type: ignore[union-attr]
        assert len(runs) == 3
        last = runs[-1].byte_start
        landed = threading.Event()
        original, decode = Storage.read_range, cache._decoders.decode

        def held_back(self: Storage, rel: str, start: int, end: int) -> bytes:
            if start == last:
                assert landed.wait(30), "the last range was never let through"
            return original(self, rel, start, end)

        def decoded_first(*args, **kwargs):  # type: ignore[no-untyped-def]
            landed.set()   # a part has been decoded: only now may the last range land
            return decode(*args, **kwargs)
        monkeypatch.setattr(Storage, "read_range", held_back)
        monkeypatch.setattr(cache._decoders, "decode", decoded_first)
        read = cache.read_frames([request], fetch="windows")[0]
        parts = cache.stats()
    reference = FullFileReference(ds)
    try:
        assert torch.equal(read.frames, reference.frames(2, key, [n - 1, 0, 13, 0]))
    finally:
        reference.close()
    assert read.frames_decoded == 3 and parts.frames_decoded == 3 and parts.range_requests == 3
    assert read.bytes_fetched == parts.bytes_fetched == sum(r.num_bytes for r in runs)


def test_the_budget_drops_what_nobody_claimed_newest_first_and_waits_for_what_is_on_the_wire() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.keep("old", "kept", 40) and budget.kept_bytes == 40
    first, second = budget.hold_ahead(30), budget.hold_ahead(30)
    assert first is not None and second is not None and budget.held_bytes == budget.peak == 100
    assert budget.hold_ahead(50) is None and budget.skipped == 1   # would not fit even with the kept one dropped
    assert budget.kept_bytes == 40 and budget.evictions == 0       # so it stays
    dropped: list[str] = []
    first.on_drop, second.on_drop = (lambda: dropped.append("first")), (lambda: dropped.append("second"))
    budget.landed(first)
    budget.landed(second)
    assert budget.claim(first)
    now = budget.hold_now(60)   # the kept one goes, then the unclaimed fetch ahead; the claimed one stays
    assert dropped == ["second"] and not budget.claim(second) and budget.evictions == 1
    assert budget.held_bytes == 90 and budget.peak == 100 and budget.get("old") is None
    budget.release(first)
    budget.release(now)
    flying = budget.hold_ahead(70)
    assert flying is not None
    taken: list[object] = []
    reader = threading.Thread(target=lambda: taken.append(budget.hold_now(60)))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not taken   # waits for the bytes on the wire: they are memory until they land
    budget.landed(flying)
    reader.join(30)
    assert taken and budget.held_bytes == 60 and not budget.claim(flying) and budget.dropped == 2


def test_the_nvdec_overlap_line_measures_a_loader_fetching_ahead_through_the_link(root: Path) -> None:
    """bench/gpu_check.py's nvdec-overlap line, with the CPU standing in for NVDEC: what it measures and counts."""
    found = overlap_rates(str(root), "cpu", items=4)
    assert found["devices"] == ["cpu"] and found["fetched_ahead"] == 1.0
    assert min(found["wan_items_per_s"], found["local_items_per_s"], found["link_items_per_s"]) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("fetch", ["clips", "episode"])
def test_a_gpu_loader_fetching_ahead_decodes_on_nvdec_exactly_what_it_decodes_on_the_spot(root: Path,
                                                                                         fetch: str) -> None:
    gpu = torch.device("cuda:0")

    def on_gpu(prefetch: int) -> tuple[list[torch.Tensor], list[TimeCard]]:
        model = EpisodeLoader(gpu, fetch=fetch, num_clips=CLIPS, clip_length=LENGTH, size=SIZE, seed=SEED,
                              prefetch=prefetch, workers=2, coalesce_gap=0)
        return run(model, requests(str(root)))
    spot, _ = on_gpu(0)
    ahead, cards = on_gpu(2)
    assert all(torch.equal(a, b) for a, b in zip(spot, ahead))
    assert {c.fields["decode_device"] for c in cards} == {"nvdec"}
    assert sum("prefetch_wait_start" in c.events for c in cards) > 0


class _Now:
    """An executor that runs what it is given at once, on the caller's thread."""

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        fn(*args)


def test_parts_made_ahead_wait_for_room_in_their_readers_order_and_a_reader_first_makes_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def cut(share, blobs, paid, fetch_s):  # type: ignore[no-untyped-def]
        made.append(share)
        return FetchedFrames(0, "k", np.zeros(0, np.int64), None, False)  # type: ignore[arg-type]
    monkeypatch.setattr(_ready_parts, "window_mini", cut)
    monkeypatch.setattr(_ready_parts, "open_decoder", lambda mini, device, num_threads: "decoder")
    maker = ReadyParts(_Now(), lambda **_: None, room=1, decode_threads=1)  # type: ignore[arg-type]
    reads: dict[str, Future[RangeAnswer]] = {name: Future() for name in "abc"}
    shares = {name: SimpleNamespace(reads={0: reads[name]}, blob=lambda start: b"", charged=0) for name in "abc"}
    ready = {name: maker.later(shares[name]) for name in "abc"}   # readers come in the order a, b, c
    for name in "cba":   # c's reads land first, then b's, then a's
        reads[name].set_result(RangeAnswer(b""))
    assert made == [shares["c"]]   # c began while there was room; b and a wait, a at the head
    first = ready["c"].take()
    assert first is not None and first.decoder == "decoder" and made == [shares["c"]]
    del first
    gc.collect()   # c's reader is done with its part: a's is made, the first its reader needs
    assert made == [shares["c"], shares["a"]]
    assert ready["b"].take() is None   # nobody began b's: its reader makes it itself, not waiting for room
    assert ready["a"].take() is not None
    gc.collect()
    assert made == [shares["c"], shares["a"]]   # b is its reader's now
