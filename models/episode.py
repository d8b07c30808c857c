"""Step-0 models that turn an episode request into clips: in one step, or as a fetch step and a decode step.

Clips are sampled as RnB's R(2+1)D sampler did: `num_clips` windows of
`clip_length` consecutive frames, evenly spaced across the episode behind one
random offset.  `num_clips` is an int or a weighted choice drawn per request,
written {"choices": [1, 15], "weights": [10, 1]}.  The draw depends only on
`seed` and the item id, so every replica samples an item the same way.

`fetch` says what is read from storage: "episode" (the default) the
episode's whole byte range, kept in the cache for later items; "clips" only
the GOPs that hold the sampled clips (episodes' frame windows), a fraction
of the bytes and of the samples decoded when keyframes are frequent.

The loader decodes while the network fetches: while an item decodes, the
bytes of the items after it are in flight. A request names the episodes
that come next (the source's `lookahead`); they are the next items' (item
ids follow the requests), so the loader draws their clips ahead, from the
same seeded sampler that draws them when they arrive, and starts fetching
them: up to `prefetch` items ahead, each only where its bytes fit the
cache's `byte_budget` beside what is kept and in flight, so how far ahead
it gets is the budget's call. An item another replica took is let go of
when a later one arrives. Within an item, clips decode as their ranges land
while later ones are still on the wire.

The time card gets the events of one of two spans, fetch_start/fetch_finish
(the item waited for a fetch of its own) or prefetch_wait_start/
prefetch_wait_finish (for a fetch started ahead of it: 0 where it had
landed), each until the first of its bytes could be decoded, then
decode_start/decode_finish (decoding, and waiting for the later parts of an
item's bytes), and fields episode, num_clips, frames_decoded, bytes_fetched
(source bytes this item caused to be read: its own fetch, or a prefetch
made for it),
bytes_reused (source bytes it used that an earlier item had paid for) and
decode_device (where its frames were decoded: "cpu", "nvdec", or
"cpu-fallback" when torchcodec fell back to the CPU on a GPU runner).  On a
GPU, decode_finish is stamped once the decoded frames are on the device
(the runner's stream synchronised), not when the decoder's call returned.

Before the start barrier a loader opens its first decoder on its device
and decodes one frame of the source's first episode (`warmup_request`, which
the harness supplies): NVDEC's first open (the decoder library, its
session) stays out of the measured window, and where the frames decode is
known then: a line of the job log's notes says it.  With `require_nvdec`,
a GPU loader whose frames would decode on the CPU stops with one sentence
(at the warm-up, or at the first item that does), and the job fails.

MP4 indexes and usage-format columns persist under RnB's cache directory
(cache_dir(): $RNB_CACHE_DIR, else ~/.cache/rnb), which the steps pass to
the episodes library: it has no default directory of its own.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias, get_args

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from episodes import (
    DEFAULT_COALESCE_GAP,
    DecodeBackend,
    EpisodeByteCache,
    EpisodeDataError,
    EpisodeDataset,
    Fetch,
    FetchInFlight,
    FrameRequest,
    SourceKind,
    decode_backend,
    decode_mini_mp4,
    open_decoder,
    open_episodes,
)
from models.clips import ClipCount, NumClips, clip_shape
from rnb.core.episode_request import READ_RETRIES, READ_TIMEOUT_S, EpisodeRequest
from rnb.core.model import Cards, NonTensors, StepOutput, Tensors
from rnb.core.model_keywords import Count, KeywordError, Natural
from rnb.core.timecard import TimeCard, now, one_card

# What a loader reads for an item: an EpisodeRequest from a dataset or videos source, or an episode number of
# the step's own `dataset`.
Request: TypeAlias = EpisodeRequest | int

# How a loader reads an episode's frames (the module docstring): the whole episode, or the sampled clips' GOPs.
FetchName: TypeAlias = Literal["episode", "clips"]
FETCH: tuple[str, ...] = get_args(FetchName)
CACHE_ENV = "RNB_CACHE_DIR"
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)


def cache_dir() -> Path:
    """Where RnB keeps what it derives from datasets: `$RNB_CACHE_DIR`, else `~/.cache/rnb`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rnb")


def sample_clip_frames(length: int, num_clips: int, clip_length: int, rng: np.random.Generator) -> np.ndarray:
    """(num_clips, clip_length) episode frame numbers; an episode shorter than a clip repeats its last frame."""
    last_start = max(length - clip_length, 0)
    stride = (last_start + 1) / num_clips
    starts = np.floor(rng.uniform(0, stride) + stride * np.arange(num_clips)).astype(np.int64)
    return np.minimum(starts[:, None] + np.arange(clip_length), length - 1)


def to_clips(frames: torch.Tensor, num_clips: int, size: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (clips*T, 3, H, W) frames -> normalised float (clips, 3, T, size, size), as R(2+1)D expects.

    With `order` (clips*T indices into `frames`), `frames` are the distinct
    frames and `order` picks each clip frame among them. They are resized
    before the pick: a resize works frame by frame, so picking commutes with
    it exactly, and the pick then moves frames of `size` instead of
    gathering every clip frame at full resolution first (at 640x480, 74 MB
    for 10 clips of 8 frames: 66 ms of a 153 ms item in issue 20's profile).
    """
    x = F.resize(frames, [size, size], antialias=True)
    if order is not None:
        x = x[order.to(x.device)]
    x = F.normalize(x.float().div_(255), KINETICS_MEAN, KINETICS_STD)
    return x.reshape(num_clips, -1, *x.shape[1:]).permute(0, 2, 1, 3, 4).contiguous()


@dataclass(frozen=True)
class ClipPlan:
    """What to read for one item: where, which frames."""

    ds: EpisodeDataset
    cache: EpisodeByteCache
    episode: int
    camera: str
    frames: np.ndarray            # (num_clips, clip_length) episode frame numbers
    item_id: int = 0

    @property
    def request(self) -> FrameRequest:
        """The frames to read: each distinct clip frame once (clips may overlap in a short episode)."""
        return FrameRequest(self.episode, self.camera, frame_numbers=np.unique(self.frames))

    @property
    def ahead_key(self) -> tuple[int, int, int, str]:
        """What a fetch started ahead for this item is found by: its cache, item, episode and camera."""
        return id(self.cache), self.item_id, self.episode, self.camera


class ItemStride:
    """How far apart the item ids a replica gets lie: 1 when it reads its queue alone, about the number of
    replicas where several share it (the median of its last gaps), so that it fetches ahead the items it is
    likely to get rather than its siblings'."""

    def __init__(self, window: int = 8) -> None:
        self._last: int | None = None
        self._gaps: deque[int] = deque(maxlen=window)

    def saw(self, item_id: int) -> None:
        if self._last is not None and item_id > self._last:
            self._gaps.append(item_id - self._last)
        self._last = item_id

    @property
    def stride(self) -> int:
        return max(1, round(statistics.median(self._gaps))) if self._gaps else 1


class EpisodeReader:
    """The part every episode step shares: one cache per dataset, clip sampling and prefetching."""

    def __init__(self, dataset: str | None, camera: str | None, num_clips: NumClips,
                 clip_length: int, prefetch: int, byte_budget: int, workers: int | None, seed: int,
                 decode_threads: int | None = None, usage_cache: bool = False, fetch: str = "episode",
                 coalesce_gap: int = DEFAULT_COALESCE_GAP) -> None:
        if clip_length < 1 or prefetch < 0:
            raise ValueError(f"clip_length must be >= 1 and prefetch >= 0, got {clip_length} and {prefetch}")
        if fetch not in FETCH:
            raise ValueError(f"fetch must be \"episode\" or \"clips\", got {fetch!r}")
        self.fetch_mode: Fetch = "windows" if fetch == "clips" else "episode"
        self.coalesce_gap = coalesce_gap
        self.dataset = dataset
        self.camera = camera
        self.clip_count = ClipCount.parse(num_clips)
        self.clip_length = clip_length
        self.prefetch = prefetch
        self.byte_budget = byte_budget
        # By default as many fetch and decode threads as the runner's torch threads: its share of the
        # cores (rnb.pipeline.plan), so that replicas side by side do not oversubscribe the machine.
        self.workers = torch.get_num_threads() if workers is None else workers
        self.decode_threads = torch.get_num_threads() if decode_threads is None else decode_threads
        self.seed = seed
        self.usage_cache = usage_cache
        self._open: dict[tuple[str, str], tuple[EpisodeDataset, EpisodeByteCache]] = {}
        self._ahead: dict[tuple[int, int, int, str], FetchInFlight] = {}
        self._stride = ItemStride()

    def _dataset(self, kind: SourceKind, root: str, timeout_s: float = READ_TIMEOUT_S, retries: int = READ_RETRIES,
                 ) -> tuple[EpisodeDataset, EpisodeByteCache]:
        if (kind, root) not in self._open:
            ds = open_episodes(root, kind, usage_cache_dir=cache_dir() if self.usage_cache else None,
                               timeout_s=timeout_s, retries=retries)
            self._open[(kind, root)] = ds, EpisodeByteCache(ds, byte_budget=self.byte_budget, workers=self.workers,
                                                            cache_dir=cache_dir(), decode_threads=self.decode_threads,
                                                            coalesce_gap=self.coalesce_gap)
        return self._open[(kind, root)]

    def caches(self) -> list[EpisodeByteCache]:
        """The caches opened so far, one per dataset read (their stats say what was fetched and held)."""
        return [cache for _, cache in self._open.values()]

    def locate(self, request: Request, item_id: int) -> tuple[EpisodeDataset, EpisodeByteCache, int, str]:
        """A request's dataset, its cache, the episode and the camera (an EpisodeRequest, or an int with `dataset`)."""
        if self.dataset is not None:
            ds, cache = self._dataset("dataset", self.dataset)
            episode = (request.episode if isinstance(request, EpisodeRequest) else int(request)) % ds.num_episodes
        elif isinstance(request, EpisodeRequest):
            ds, cache = self._dataset(request.kind, request.root, request.timeout_s, request.retries)  # the source's limits
            episode = request.episode
        else:
            raise ValueError(f"item {item_id}: the request {request!r} names no dataset; use a dataset or videos "
                             "source, or give the step a `dataset` keyword")
        return ds, cache, episode, self.camera or ds.video_keys[0]

    def plan(self, request: Request, item_id: int) -> ClipPlan:
        """Resolve a request (an EpisodeRequest, or an int when `dataset` is set) and sample its clips."""
        ds, cache, episode, camera = self.locate(request, item_id)
        return self._planned(ds, cache, episode, camera, item_id)

    def _planned(self, ds: EpisodeDataset, cache: EpisodeByteCache, episode: int, camera: str,
                 item_id: int) -> ClipPlan:
        """Item `item_id`'s clips of `episode`: drawn from the seed and the item id alone, whenever it is drawn."""
        rng = np.random.default_rng([self.seed, item_id])
        frames = sample_clip_frames(ds.episode_length(episode), self.clip_count.draw(rng), self.clip_length, rng)
        return ClipPlan(ds, cache, episode, camera, frames, item_id)

    def fetch(self, plan: ClipPlan, device: torch.device | None = None) -> FetchInFlight:
        """The item's fetch: the one started ahead for it, else started now; fetches ahead for earlier items
        (which another replica took) are let go of. `device`: where its frames will decode, if here."""
        self._stride.saw(plan.item_id)
        for key in [key for key in self._ahead if key[1] < plan.item_id]:
            self._ahead.pop(key).cancel()
        started = self._ahead.pop(plan.ahead_key, None)
        return started or plan.cache.start_fetch([plan.request], fetch=self.fetch_mode, device=device)[0]

    def fetch_ahead(self, plan: ClipPlan, request: Request, device: torch.device | None = None) -> None:
        """Start fetching the next items this replica is likely to get after `plan`'s (ItemStride), as far as the
        request names them and `prefetch` allows."""
        upcoming: Sequence[int] = request.upcoming if isinstance(request, EpisodeRequest) else ()
        stride = self._stride.stride
        for ahead_by in range(stride, min(len(upcoming), stride * self.prefetch) + 1, stride):
            later, episode = plan.item_id + ahead_by, upcoming[ahead_by - 1]
            # as locate() maps them: a step's own `dataset` takes the source's episode numbers modulo its size
            ahead = self._planned(plan.ds, plan.cache, episode % plan.ds.num_episodes, plan.camera, later)
            if ahead.ahead_key not in self._ahead:
                self._ahead[ahead.ahead_key] = plan.cache.start_fetch([ahead.request], fetch=self.fetch_mode,
                                                                      ahead=True, device=device)[0]


def fetched_span(card: TimeCard, got: FetchInFlight, began: float) -> float:
    """Stamp the item's wait for its first bytes (its own fetch, or a prefetch's wait) from `began`; when it ended."""
    span = "prefetch_wait" if got.fetched_ahead else "fetch"
    ended = began + got.first_wait_s
    card.record(f"{span}_start", began)
    card.record(f"{span}_finish", ended)
    return ended


def read_costs(card: TimeCard, plan: ClipPlan, bytes_fetched: int, bytes_reused: int) -> None:
    """What the item read, on its card: its episode, its clips and the source bytes it caused or reused."""
    card.set_field("episode", plan.episode)
    card.set_field("num_clips", len(plan.frames))
    card.set_field("bytes_fetched", bytes_fetched)
    card.set_field("bytes_reused", bytes_reused)


class NvdecUnavailable(RuntimeError):
    """A loader with `require_nvdec` whose frames would decode on the CPU."""


class DecodeWatch:
    """Where a loader's frames decode: said once per backend in its notes, per item on its card, refused if asked.

    torchcodec falls back to CPU decoding on a CUDA device without a word
    (episodes.decode_backend); benchmark figures taken that way are the
    CPU's, so the job log says so, and `require_nvdec` turns it into an error.
    """

    def __init__(self, model: str, device: torch.device, require_nvdec: bool) -> None:
        self.where = f"{model} on {device}"
        self.on_cuda = device.type == "cuda"
        self.require_nvdec = require_nvdec and self.on_cuda  # a CPU runner decodes on the CPU by design
        self.notes: list[str] = []
        self._seen: set[DecodeBackend] = set()

    def saw(self, backend: DecodeBackend, what: str, card: TimeCard | None = None) -> None:
        """The backend that decoded `what` (for sentences); on `card`, the item's decode_device."""
        if card is not None:
            card.set_field("decode_device", backend.device)
        if backend.device == "cpu-fallback" and self.require_nvdec:
            raise NvdecUnavailable(f"{self.where}: require_nvdec is set, but torchcodec decodes {what} on the CPU "
                                   f"instead of NVDEC ({backend.detail})")
        if backend in self._seen or not self.on_cuda:
            return
        self._seen.add(backend)
        if backend.device == "nvdec":
            self.notes.append(f"{self.where}: frames decode on NVDEC ({backend.detail})")
        else:
            self.notes.append(f"{self.where}: torchcodec decodes {what} on the CPU instead of NVDEC "
                              f"({backend.detail}), then copies the frames to the GPU: decode times are the CPU's; "
                              "\"require_nvdec\": true refuses this")


def synchronized(frames: torch.Tensor) -> torch.Tensor:
    """`frames`, once the work that produced them on a GPU (NVDEC, the colour conversion) has completed.

    torchcodec queues both on the current stream, the runner's own; the
    decode stage is stamped when they are done, so that it does not leak
    into the next stage's time.
    """
    if frames.device.type == "cuda":
        torch.cuda.current_stream(frames.device).synchronize()
    return frames


def clips_of(frames: np.ndarray, decoded: torch.Tensor, size: int) -> torch.Tensor:
    """The clips of `frames` from `decoded`, their distinct frames in ascending order (clips may overlap in a
    short episode, and each frame is decoded once)."""
    _, inverse = np.unique(frames, return_inverse=True)
    return to_clips(decoded, len(frames), size, order=torch.from_numpy(inverse.reshape(-1)))


def decode_clips(frames: np.ndarray, decode: Callable[[], torch.Tensor], size: int, card: TimeCard) -> torch.Tensor:
    """The clips from `decode()` (clips_of), its time on the card as the decode span."""
    card.record("decode_start")
    decoded = synchronized(decode())
    card.record("decode_finish")
    card.set_field("frames_decoded", len(decoded))
    return clips_of(frames, decoded, size)


def read_clips(plan: ClipPlan, got: FetchInFlight, device: torch.device, size: int, card: TimeCard,
               watch: DecodeWatch) -> torch.Tensor:
    """The item's clips, decoded on `device` as its bytes land: its wait for the first of them, then the decode
    (later parts' waits included), stamped on its card with what it read."""
    began = now()
    read = plan.cache.decode_frames(got, device=device)
    decoded = synchronized(read.frames)
    ended = now()
    card.record("decode_start", fetched_span(card, got, began))
    card.record("decode_finish", ended)
    card.set_field("frames_decoded", len(decoded))
    read_costs(card, plan, read.bytes_fetched, read.bytes_reused)
    watch.saw(read.backend, f"episode {plan.episode} of {plan.ds.root} ({plan.camera})", card)
    return clips_of(plan.frames, decoded, size)


def warm_up(reader: EpisodeReader, request: Request, device: torch.device, size: int, watch: DecodeWatch) -> str:
    """Decode one frame of `request`'s episode on `device` before the start barrier; the job-log note.

    Only that frame's window is fetched (fetch="windows"), which the cache
    does not keep: the measured items fetch and decode what they would have
    without it.  The decoder library, NVDEC's session and the resize
    kernels are loaded now instead of in the first measured item.
    """
    started = time.perf_counter()
    ds, cache, episode, camera = reader.locate(request, 0)
    got = cache.fetch_frames([FrameRequest(episode, camera, frame_numbers=[0])], fetch="windows")[0]
    read = cache.decode_frames(got, device=device)
    watch.saw(read.backend, f"episode {episode} of {ds.root} ({camera})")
    to_clips(synchronized(read.frames), 1, size)
    return (f"{watch.where}: warm-up decoded one frame of episode {episode} before the start "
            f"({(time.perf_counter() - started) * 1000:.0f} ms)")


def warmup_from(request: EpisodeRequest | None, dataset: str | None) -> Request | None:
    """What a loader warms up on: the harness's `warmup_request`, else episode 0 of its own `dataset`, else None."""
    if request is not None:
        return request
    return 0 if dataset is not None else None


def check_reads(source: EpisodeDataset | None, dataset: str | None, camera: str | None,
                tabular: Sequence[str] | None) -> None:
    """The dataset a loader reads (its own `dataset`, else the source's) must have its camera and data columns."""
    if dataset is not None:
        try:
            source = open_episodes(dataset, "dataset")
        except EpisodeDataError as error:
            raise KeywordError("dataset", f"expected a LeRobot v3.0 dataset, found an error: {error}") from None
    if source is None:
        return
    if camera is not None and camera not in source.video_keys:
        raise KeywordError("camera", f"expected one of the cameras of {source.root} "
                                     f"({', '.join(source.video_keys)}), found {camera!r}")
    features = getattr(source, "features", None)  # plain video files have no data table
    for i, column in enumerate(tabular or ()):
        if features is None:
            raise KeywordError("tabular", f"expected no data columns, since {source.root} is plain video files "
                                          f"without a data table, found {column!r}")
        columns = [name for name, feature in features.items() if feature.get("dtype") != "video"]
        if column not in columns:
            raise KeywordError(f"tabular[{i}]", f"expected a data column of {source.root} ({', '.join(columns)}), "
                                                f"found {column!r}")


class EpisodeLoader:
    """Request -> (clips, 3, clip_length, size, size) float clips, fetched and decoded on this step's device.

    `fetch` is "episode" or "clips" (see the module docstring); with
    "clips", GOP windows at most `coalesce_gap` bytes apart are read as one
    range (LeRobot's 256 KiB suits a network; 0 reads only the windows). `tabular`
    names data columns (e.g. ["observation.state", "action"]) to
    pass on as (frames, dim) numpy arrays in non_tensors["tabular"]; with
    `tabular_cache` (the default) they are sliced from usage-format copies
    of the data files (the episodes usage-format cache) instead of decoded from Parquet.
    `require_nvdec` refuses CPU decoding on a GPU runner; `warmup_request` is
    supplied by the harness (the module docstring says both).
    """

    def __init__(self, device: torch.device, dataset: str | None = None, camera: str | None = None,
                 num_clips: NumClips = 10, clip_length: Count = 8, size: Count = 112,
                 tabular: list[str] | None = None, prefetch: Natural = 2, byte_budget: Count = 2**30,
                 workers: Count | None = None, seed: Natural = 0, decode_threads: Count | None = None,
                 tabular_cache: bool = True, fetch: FetchName = "episode", coalesce_gap: Natural = DEFAULT_COALESCE_GAP,
                 require_nvdec: bool = False, warmup_request: EpisodeRequest | None = None) -> None:
        self.device = device
        self.size = size
        self.tabular = list(tabular or [])
        self.reader = EpisodeReader(dataset, camera, num_clips, clip_length, prefetch, byte_budget, workers, seed,
                                    decode_threads, usage_cache=bool(self.tabular) and tabular_cache, fetch=fetch,
                                    coalesce_gap=coalesce_gap)
        self.watch = DecodeWatch(type(self).__name__, device, require_nvdec)
        self.notes = self.watch.notes
        request = warmup_from(warmup_request, dataset)
        if request is not None:
            self.notes.append(warm_up(self.reader, request, device, size, self.watch))

    @staticmethod
    def output_shape(num_clips: NumClips = 10, clip_length: int = 8, size: int = 112,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return (clip_shape(num_clips, clip_length, size),)

    @staticmethod
    def check_dataset(source: EpisodeDataset | None, dataset: str | None = None, camera: str | None = None,
                      tabular: list[str] | None = None, **kwargs: object) -> None:
        check_reads(source, dataset, camera, tabular)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        request = non_tensors["request"]
        plan = self.reader.plan(request, card.item_id)
        got = self.reader.fetch(plan, self.device)
        self.reader.fetch_ahead(plan, request, self.device)
        clips = read_clips(plan, got, self.device, self.size, card, self.watch)
        out = {"request": non_tensors["request"], "episode": plan.episode, "num_clips": len(plan.frames)}
        if self.tabular:
            out["tabular"] = plan.ds.episode_columns(plan.episode, self.tabular)
        return StepOutput((clips,), out, card)


class EpisodeFetcher:
    """The I/O half of a split loader: mini-MP4 bytes as a uint8 tensor, on the CPU.

    With `fetch` "episode" the mini-MP4 holds the whole episode; with
    "clips" only the GOPs of the sampled clips.

    The bytes travel through the shared slot (`max_bytes` bounds one
    episode), which stays in host memory wherever the step runs; the
    mini-MP4's frame table and the sampled frame numbers, both small, travel
    as non-tensors.
    """

    output_device = "cpu"  # the decoder reads bytes from host memory (rnb.core.model.PlacesOutputs)

    def __init__(self, device: torch.device, dataset: str | None = None, camera: str | None = None,
                 num_clips: NumClips = 10, clip_length: Count = 8, prefetch: Natural = 2,
                 byte_budget: Count = 2**30, workers: Count | None = None, seed: Natural = 0, max_bytes: Count = 2**24,
                 fetch: FetchName = "episode", coalesce_gap: Natural = DEFAULT_COALESCE_GAP) -> None:
        self.max_bytes = max_bytes
        self.reader = EpisodeReader(dataset, camera, num_clips, clip_length, prefetch, byte_budget, workers, seed,
                                    fetch=fetch, coalesce_gap=coalesce_gap)

    @staticmethod
    def output_shape(max_bytes: int = 2**24, **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return ((max_bytes,),)

    @staticmethod
    def output_dtypes(**kwargs: object) -> tuple[torch.dtype, ...]:
        return (torch.uint8,)

    @staticmethod
    def check_dataset(source: EpisodeDataset | None, dataset: str | None = None, camera: str | None = None,
                      **kwargs: object) -> None:
        check_reads(source, dataset, camera, ())

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        request = non_tensors["request"]
        plan = self.reader.plan(request, card.item_id)
        got = self.reader.fetch(plan)
        self.reader.fetch_ahead(plan, request)
        began = now()
        fetched = got.result()
        fetched_span(card, got, began)
        read_costs(card, plan, fetched.bytes_fetched, fetched.bytes_reused)
        mini = fetched.mini
        if len(mini.data) > self.max_bytes:
            raise ValueError(f"item {card.item_id}: episode {plan.episode}'s mini-MP4 has {len(mini.data)} bytes, "
                             f"more than max_bytes ({self.max_bytes}); raise the step's max_bytes")
        data = torch.frombuffer(bytearray(mini.data), dtype=torch.uint8)
        out = {"request": non_tensors["request"], "episode": plan.episode, "num_clips": len(plan.frames),
               "mini": dataclasses.replace(mini, data=b""), "frames": plan.frames}
        return StepOutput((data,), out, card)


class EpisodeDecoder:
    """The decode half of a split loader: mini-MP4 bytes -> clips, decoded on this step's device.

    The bytes arrive in host memory even on a GPU runner: the decoder (NVDEC
    too) reads them from there, so a copy to the GPU would only come back.
    """

    input_device = "cpu"  # rnb.core.model.PlacesInputs

    def __init__(self, device: torch.device, num_clips: NumClips = 10, clip_length: Count = 8,
                 size: Count = 112, require_nvdec: bool = False, warmup_request: EpisodeRequest | None = None,
                 camera: str | None = None) -> None:
        self.device = device
        self.size = size
        self.watch = DecodeWatch(type(self).__name__, device, require_nvdec)
        self.notes = self.watch.notes
        if warmup_request is not None:  # the fetcher's source: a reader of its own, for the warm-up only
            reader = EpisodeReader(None, camera, 1, 1, 0, 2**26, 1, 0)
            self.notes.append(warm_up(reader, warmup_request, device, size, self.watch))

    @staticmethod
    def output_shape(num_clips: NumClips = 10, clip_length: int = 8, size: int = 112,
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return (clip_shape(num_clips, clip_length, size),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        card = one_card(time_card, type(self).__name__)
        mini = dataclasses.replace(non_tensors["mini"], data=tensors[0].cpu().numpy().tobytes())
        frames = non_tensors["frames"]

        def decode() -> torch.Tensor:
            decoder = open_decoder(mini, self.device)
            decoded = decode_mini_mp4(mini, np.unique(frames), decoder=decoder)
            self.watch.saw(decode_backend(decoder, self.device), f"episode {non_tensors['episode']}", card)
            return decoded
        clips = decode_clips(frames, decode, self.size, card)
        out = {key: value for key, value in non_tensors.items() if key not in ("mini", "frames")}
        return StepOutput((clips,), out, card)
