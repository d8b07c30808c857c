"""What an episode loader does with the bytes it read: frames decoded where the runner is, and clips made of them."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from episodes import (
    DecodeBackend,
    FetchInFlight,
    FrameRequest,
)
from models.episode_reader import ClipPlan, EpisodeReader, Request, fetched_span, read_costs
from rnb.core.timecard import TimeCard, now

KINETICS_MEAN = (0.43216, 0.394666, 0.37645)
KINETICS_STD = (0.22803, 0.22145, 0.216989)


def to_clips(frames: torch.Tensor, num_clips: int, size: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 (clips*T, 3, H, W) frames -> normalised float (clips, 3, T, size, size), as R(2+1)D expects.

    With `order` (clips*T indices into `frames`), `frames` are the distinct
    frames and `order` picks each clip frame among them. They are resized
    before the pick: a resize works frame by frame, so picking commutes with
    it exactly, and the pick then moves frames of `size` instead of
    gathering every clip frame at full resolution first (at 640x480, 74 MB
    for 10 clips of 8 frames: 66 ms of a 153 ms item in issue 20's profile).
    """
    # Imported here, not with the module: a job's main process imports this module only to check its keywords, and
    # torchvision costs it 2 CPU-s (torch._dynamo); a loader has it from its fork server.
    from torchvision.transforms.v2 import functional as F

    x = F.resize(frames, [size, size], antialias=True)
    if order is not None:
        x = x[order.to(x.device)]
    x = F.normalize(x.float().div_(255), KINETICS_MEAN, KINETICS_STD)
    return x.reshape(num_clips, -1, *x.shape[1:]).permute(0, 2, 1, 3, 4).contiguous()



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

