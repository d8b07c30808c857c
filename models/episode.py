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

import numpy as np
import torch

from episodes import (
    DEFAULT_COALESCE_GAP,
    EpisodeDataset,
    decode_backend,
    decode_mini_mp4,
    open_decoder,
)
from models.clips import NumClips, clip_shape
from models.episode_decode import DecodeWatch, decode_clips, read_clips, warm_up
from models.episode_reader import EpisodeReader, FetchName, check_reads, fetched_span, read_costs, warmup_from
from rnb.core.episode_request import EpisodeRequest
from rnb.core.model import Cards, NonTensors, StepOutput, Tensors
from rnb.core.model_keywords import Count, Natural
from rnb.core.timecard import now, one_card


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
