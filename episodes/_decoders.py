"""The decode phase of a cache's reads: a mini-MP4's frames decoded, and whole episodes' decoders kept.

Opening a decoder over a whole episode's mini-MP4 costs about as much as
decoding a few of its frames, and reads of a kept episode come back to
it: so the decoder of each such mini-MP4 is kept (up to `max_decoders`,
least recently used dropped first) for later reads of that episode on the
same device. A frame-window mini-MP4 is read once: its decoder is opened
for that read, or was opened already by the fetch threads.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from episodes._decode import decode_backend, decode_mini_mp4, open_decoder
from episodes._errors import Mp4FormatError
from episodes._indexes import FileIndexes
from episodes._mp4 import MiniMp4
from episodes._reads import Counts, FetchedFrames, FrameRead

if TYPE_CHECKING:
    from torchcodec.decoders import VideoDecoder  # torchcodec is imported where a decoder opens (episodes._decode)


@dataclass
class _Decoder:
    mini: MiniMp4
    decoder: VideoDecoder
    lock: threading.Lock


class Decoders:
    """How a cache decodes what it fetched (see the module)."""

    def __init__(self, files: FileIndexes, counts: Counts, *, max_decoders: int, decode_threads: int) -> None:
        self._files, self._counts = files, counts
        self._max_decoders, self._decode_threads = max_decoders, decode_threads
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[int, str, str], _Decoder] = OrderedDict()

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def decode(self, fetched: FetchedFrames, device: str, opened: VideoDecoder | None = None) -> FrameRead:
        """One mini-MP4's frames decoded on `device` (by `opened`, a CPU decoder already open over a frame-window
        mini-MP4, where given), with the cost of the read that fetched it."""
        ep, key, mini = int(fetched.episode), fetched.key, fetched.mini
        t0 = time.perf_counter()
        try:
            if mini.whole_episode:
                entry = self._kept_decoder((ep, key, device), mini)
                with entry.lock:
                    frames = decode_mini_mp4(mini, fetched.frame_numbers, decoder=entry.decoder)
                    backend = decode_backend(entry.decoder, device)
            else:
                decoder = opened if opened is not None and device == "cpu" else \
                    open_decoder(mini, device, num_threads=self._decode_threads)
                frames = decode_mini_mp4(mini, fetched.frame_numbers, decoder=decoder)
                backend = decode_backend(decoder, device)
        except (RuntimeError, ValueError) as exc:
            where = self._files.where(self._files.record(ep, key), key)
            raise Mp4FormatError(f"{where}: decoding failed ({type(exc).__name__}: {exc})") from exc
        decode_s = time.perf_counter() - t0
        count = len(fetched.frame_numbers)
        self._counts.add(frames_decoded=count, decode_s=decode_s)
        return FrameRead(frames, fetched.cache_hit, fetched.bytes_fetched, fetched.bytes_reused, count,
                         fetched.lookup_s, fetched.fetch_s, fetched.synthesize_s, decode_s, backend)

    def _kept_decoder(self, dkey: tuple[int, str, str], mini: MiniMp4) -> _Decoder:
        """The decoder kept for this episode's mini-MP4 on this device, opened if missing or stale."""
        with self._lock:
            entry = self._kept.get(dkey)
            if entry is not None and entry.mini is mini:
                self._kept.move_to_end(dkey)
                return entry
        entry = _Decoder(mini, open_decoder(mini, dkey[2], num_threads=self._decode_threads), threading.Lock())
        with self._lock:
            self._kept[dkey] = entry
            while len(self._kept) > self._max_decoders:
                self._kept.popitem(last=False)
        return entry


def in_order(reads: Sequence[tuple[FetchedFrames, FrameRead]], numbers: np.ndarray) -> torch.Tensor:
    """The frames of a read's parts, each part's distinct frames ascending, in the order the request asked: `numbers`."""
    held = np.concatenate([part.frame_numbers for part, _ in reads])
    frames = torch.cat([read.frames for _, read in reads])
    order = np.argsort(held, kind="stable")
    pick = order[np.searchsorted(held[order], numbers)]
    return frames[torch.from_numpy(pick).to(frames.device)]
