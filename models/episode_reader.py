"""What an episode loader reads for an item: the clips it samples, planned, fetched, and fetched ahead for the next items.

models.episode's docstring says how the loaders read; this is the part
that decides which frames and gets their bytes, apart from decoding them
(models.episode_decode).
"""
from __future__ import annotations

import os
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias, get_args

import numpy as np
import torch

from episodes import (
    DEFAULT_COALESCE_GAP,
    EpisodeByteCache,
    EpisodeDataError,
    EpisodeDataset,
    Fetch,
    FetchInFlight,
    FrameRequest,
    SourceKind,
    open_episodes,
)
from models.clips import ClipCount, NumClips
from rnb.core.episode_request import READ_RETRIES, READ_TIMEOUT_S, EpisodeRequest
from rnb.core.model_keywords import KeywordError
from rnb.core.timecard import TimeCard

# the step's own `dataset`.
Request: TypeAlias = EpisodeRequest | int

# How a loader reads an episode's frames (the module docstring): the whole episode, or the sampled clips' GOPs.
FetchName: TypeAlias = Literal["episode", "clips"]
FETCH: tuple[str, ...] = get_args(FetchName)
CACHE_ENV = "RNB_CACHE_DIR"


def cache_dir() -> Path:
    """Where RnB keeps what it derives from datasets: `$RNB_CACHE_DIR`, else `~/.cache/rnb`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rnb")


def sample_clip_frames(length: int, num_clips: int, clip_length: int, rng: np.random.Generator) -> np.ndarray:
    """(num_clips, clip_length) episode frame numbers; an episode shorter than a clip repeats its last frame."""
    last_start = max(length - clip_length, 0)
    stride = (last_start + 1) / num_clips
    starts = np.floor(rng.uniform(0, stride) + stride * np.arange(num_clips)).astype(np.int64)
    return np.minimum(starts[:, None] + np.arange(clip_length), length - 1)


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

