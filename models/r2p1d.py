"""R(2+1)D-18 (torchvision's r2plus1d_18) as five stages, so a config can cut the network across steps.

Stages: 1 stem, 2 layer1, 3 layer2, 4 layer3, 5 layer4 + avgpool + flatten + fc.
`start_index`..`end_index` (inclusive) says which a step runs.  Nothing can
be downloaded, so weights come from `checkpoint` (a local state_dict of the
whole r2plus1d_18) or are random from `seed`: every step built with one seed
holds the same weights, so cut steps compute exactly what the whole network
does.  The job log's notes say which weights ran.

`dtype` ("float32", "float16" or "bfloat16") casts the weights and each
input to that type, so the network runs in it as a deployed half-precision
model does; it is not autocast, which keeps float32 weights and casts them
again at every call (inference caches no casts), paying a weight copy per
layer per item and measuring a mixed network.  A step's outputs travel in
its dtype (`output_dtypes`), so cut steps hand half as many bytes on.
`channels_last` keeps weights and activations in torch's channels-last 3D
layout (NDHWC), which cuDNN's tensor-core convolutions prefer.  The notes
say both.
"""
from __future__ import annotations

import os
from typing import Annotated, TypeAlias

import torch
from annotated_types import Interval
from torch import nn

from models.clips import ClipCount, NumClips, clip_shape
from models.episode import EpisodeLoader
from rnb.core.episode_request import EpisodeRequest
from rnb.core.model import Cards, NonTensors, StepOutput, Tensors
from rnb.core.model_keywords import Count, Natural

NUM_STAGES = 5
DEFAULT_CLIPS = 10  # clips per item a network assumes when neither its input nor its keywords say
# most input sizes warmed up with cudnn.benchmark on; beyond it the autotuner would stall measured items
MAX_WARM_SIZES = 16
# output channels of stages 1..4; stage 5 gives num_classes logits
_CHANNELS = (64, 64, 128, 256)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
Stage: TypeAlias = Annotated[int, Interval(ge=1, le=NUM_STAGES)]


def compute_dtype(dtype: str) -> torch.dtype:
    """The torch dtype a network runs in, by its keyword's name."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _half(size: int) -> int:
    """Length after a stride-2 convolution of kernel 3 and padding 1 (or kernel 7 and padding 3)."""
    return (size - 1) // 2 + 1


def stage_output(stage: int, clip: tuple[int, ...], num_classes: int = 400) -> tuple[int, ...]:
    """Shape of one clip (C, T, H, W) after running `stage` on it."""
    if stage == NUM_STAGES:
        return (num_classes,)
    _, t, h, w = clip
    if stage == 1:    # the stem halves height and width only
        return (_CHANNELS[0], t, _half(h), _half(w))
    if stage == 2:    # layer1 keeps the shape
        return (_CHANNELS[1], t, h, w)
    return (_CHANNELS[stage - 1], _half(t), _half(h), _half(w))  # layer2 and layer3 halve all three


def run_stages(clip: tuple[int, ...], start_index: int, end_index: int, num_classes: int = 400) -> tuple[int, ...]:
    """Shape of one clip entering stage `start_index`, after stages start_index..end_index."""
    for stage in range(start_index, end_index + 1):
        clip = stage_output(stage, clip, num_classes)
    return clip


def stage_shape(stage: int, clip_length: int, size: int, num_classes: int = 400) -> tuple[int, ...]:
    """Shape of one clip of the network's input after `stage` (0 = the input clip itself)."""
    return run_stages((3, clip_length, size, size), 1, stage, num_classes)


def input_clip(start_index: int, input_shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """One clip of the previous step's output, checked to be what stage `start_index` takes."""
    (rows, *clip), *rest = input_shapes
    channels = 3 if start_index == 1 else _CHANNELS[start_index - 2]
    if rest or len(clip) != 4 or clip[0] != channels:
        raise ValueError(f"stage {start_index} takes one tensor of (clips, {channels}, frames, height, width), "
                         f"but the previous step outputs {input_shapes}")
    return tuple(clip)


def input_rows(num_clips: NumClips, batch: int) -> list[int]:
    """Every first dimension an input can have: the clip counts of 1 to `batch` items stacked together.

    A batcher hands over a partial batch when its input is idle, so every count of items up to `batch`
    occurs. (Segments of a split item are not foreseen.)
    """
    choices = ClipCount.parse(num_clips).choices
    totals: set[int] = set()
    current = {0}
    for _ in range(batch):
        current = {rows + clips for rows in current for clips in choices}
        totals |= current
    return sorted(totals)


def warm_up_rows(num_clips: NumClips | None, batch: int,
                 input_shapes: tuple[tuple[int, ...], ...] | None) -> list[int]:
    """The input sizes to warm up: exactly those the loader's clip counts allow, when the step is told them;
    else every row count up to the largest input (any may come); else those of the default 10 clips."""
    if num_clips is None and input_shapes is not None:
        return list(range(1, input_shapes[0][0] + 1))
    return input_rows(DEFAULT_CLIPS if num_clips is None else num_clips, batch)


def check_cut(start_index: int, end_index: int) -> None:
    if not 1 <= start_index <= end_index <= NUM_STAGES:
        raise ValueError(f"start_index and end_index must satisfy 1 <= start_index <= end_index <= {NUM_STAGES}, "
                         f"got {start_index} and {end_index}")


def build_stages(num_classes: int, checkpoint: str | None, seed: int) -> tuple[nn.Module, ...]:
    # Imported here, as in models.episode_decode: the job's main process, which only checks this module's keywords,
    # need not pay for torchvision.
    from torchvision.models.video import r2plus1d_18

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = r2plus1d_18(weights=None, num_classes=num_classes)
    if checkpoint is not None:
        net.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return (net.stem, net.layer1, net.layer2, net.layer3,
            nn.Sequential(net.layer4, net.avgpool, nn.Flatten(1), net.fc))


class R2P1DRunner:
    """Stages start_index..end_index on (rows, *stage input) tensors.

    In a pipeline the input's shape is the previous step's output
    (`input_shapes`, given by the harness), so a config names only the cut.
    Without it (a model built by hand, or an old config) `num_clips`,
    `clip_length`, `size` and `batch` describe the input: rows are at most
    `batch` times the largest `num_clips`.  Given, `num_clips` (the loader's
    clip counts) also tells the warm-up exactly which input sizes can come.
    """

    def __init__(self, device: torch.device, start_index: Stage = 1, end_index: Stage = 5,
                 num_clips: NumClips | None = None, clip_length: Count = 8, size: Count = 112,
                 num_classes: Count = 400, batch: Count = 1, checkpoint: str | None = None, seed: Natural = 0,
                 warmup: Natural = 1, input_shapes: tuple[tuple[int, ...], ...] | None = None,
                 dtype: str = "float32", channels_last: bool = False) -> None:
        check_cut(start_index, end_index)
        self.dtype = compute_dtype(dtype)
        self.layout = torch.channels_last_3d if channels_last else torch.contiguous_format
        stages = build_stages(num_classes, checkpoint, seed)[start_index - 1: end_index]
        self.net = nn.Sequential(*stages).to(device=device, dtype=self.dtype).to(memory_format=self.layout).eval()
        clip = (input_clip(start_index, input_shapes) if input_shapes is not None
                else stage_shape(start_index - 1, clip_length, size, num_classes))
        self.output = run_stages(clip, start_index, end_index, num_classes)
        weights = f"checkpoint {checkpoint}" if checkpoint else f"random weights (seed {seed}; no checkpoint given)"
        layout = ", channels_last (NDHWC)" if channels_last else ""
        self.notes = [f"R2P1DRunner stages {start_index}-{end_index}: {weights}; {dtype} (weights and inputs cast, "
                      f"not autocast){layout}"]
        if warmup > 0:
            rows = warm_up_rows(num_clips, batch, input_shapes)
            self.notes.append(self._warm_up(torch.device(device), rows, clip, warmup))

    def _warm_up(self, device: torch.device, rows: list[int], clip: tuple[int, ...], passes: int) -> str:
        """Run the network before the clock starts, on a GPU at every input size the run can bring.

        With cudnn.benchmark, cuDNN times its algorithms for each new input shape on first sight; warming
        every size up front keeps that out of the measured items. When too many sizes are possible it stays
        off, so no item pays for a search. On the CPU one pass at the smallest size loads the kernels.
        """
        if device.type != "cuda":
            sizes, how = rows[:1], "on the CPU"
        elif len(rows) <= MAX_WARM_SIZES:
            torch.backends.cudnn.benchmark = True
            sizes, how = rows, "cudnn.benchmark on"
        else:
            sizes, how = rows[-1:], f"cudnn.benchmark off: {len(rows)} input sizes possible"
        with torch.inference_mode():
            for n in sizes:
                for _ in range(passes):
                    self.net(self._shaped(torch.zeros((n, *clip), device=device)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return f"R2P1DRunner warm-up ({how}): {passes} pass(es) at {', '.join(map(str, sizes))} rows"

    @staticmethod
    def output_shape(start_index: int = 1, end_index: int = 5, num_clips: NumClips | None = None,
                     clip_length: int = 8, size: int = 112, num_classes: int = 400, batch: int = 1,
                     checkpoint: str | None = None, input_shapes: tuple[tuple[int, ...], ...] | None = None,
                     dtype: str = "float32", **kwargs: object) -> tuple[tuple[int, ...], ...]:
        check_cut(start_index, end_index)
        compute_dtype(dtype)
        if checkpoint is not None and not os.path.isfile(checkpoint):
            raise ValueError(f"checkpoint {checkpoint} is not a file")
        if input_shapes is not None:
            rows, clip = input_shapes[0][0], input_clip(start_index, input_shapes)
        else:
            rows = batch * clip_shape(DEFAULT_CLIPS if num_clips is None else num_clips, clip_length, size)[0]
            clip = stage_shape(start_index - 1, clip_length, size, num_classes)
        return ((rows, *run_stages(clip, start_index, end_index, num_classes)),)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        x = tensors[0]
        if x.shape[0] == 0:  # an empty segment (fewer clips than segments) has nothing to compute
            return StepOutput((x.new_zeros((0, *self.output), dtype=self.dtype),), non_tensors, time_card)
        with torch.inference_mode():
            out = self.net(self._shaped(x))
            # Some CPU kernels (float16 convolutions here) return a contiguous tensor from a channels-last input;
            # the next step is promised the layout asked for.
            return StepOutput((out.contiguous(memory_format=self.layout) if out.dim() == 5 else out,),
                              non_tensors, time_card)

    def _shaped(self, x: torch.Tensor) -> torch.Tensor:
        """An input in the network's dtype and layout (itself when it already is)."""
        return x.to(dtype=self.dtype, memory_format=self.layout) if x.dim() == 5 else x.to(self.dtype)

    @staticmethod
    def output_dtypes(dtype: str = "float32", **kwargs: object) -> tuple[torch.dtype, ...]:
        """Outputs travel in the network's dtype."""
        return (compute_dtype(dtype),)


class R2P1DSingleStep:
    """Loader and the whole network in one step: RnB's no-pipeline baseline. Outputs (clips, num_classes) logits."""

    def __init__(self, device: torch.device, dataset: str | None = None, camera: str | None = None,
                 num_clips: NumClips = 10, clip_length: Count = 8, size: Count = 112,
                 prefetch: Natural = 2, byte_budget: Count = 2**30, workers: Count = 4, seed: Natural = 0,
                 num_classes: Count = 400, checkpoint: str | None = None, warmup: Natural = 1,
                 dtype: str = "float32", channels_last: bool = False, require_nvdec: bool = False,
                 warmup_request: EpisodeRequest | None = None) -> None:
        self.loader = EpisodeLoader(device, dataset, camera, num_clips, clip_length, size, None, prefetch,
                                    byte_budget, workers, seed, require_nvdec=require_nvdec,
                                    warmup_request=warmup_request)
        self.net = R2P1DRunner(device, 1, NUM_STAGES, num_clips, clip_length, size, num_classes, 1, checkpoint,
                               seed, warmup, dtype=dtype, channels_last=channels_last)
        self.notes = [*self.loader.notes, *self.net.notes]

    @staticmethod
    def output_shape(num_clips: NumClips = 10, clip_length: int = 8, size: int = 112,
                     num_classes: int = 400, checkpoint: str | None = None, dtype: str = "float32",
                     **kwargs: object) -> tuple[tuple[int, ...], ...]:
        return R2P1DRunner.output_shape(1, NUM_STAGES, num_clips, clip_length, size, num_classes, 1, checkpoint,
                                        dtype=dtype)

    @staticmethod
    def output_dtypes(dtype: str = "float32", **kwargs: object) -> tuple[torch.dtype, ...]:
        return R2P1DRunner.output_dtypes(dtype)

    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput:
        clips, passed, _ = self.loader(tensors, non_tensors, time_card)
        return self.net(tuple(clips), passed, time_card)
