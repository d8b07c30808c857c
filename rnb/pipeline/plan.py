"""Where every runner goes and what it gets, decided before anything is spawned.

Resolving models and their output shapes here means a model that cannot say
what it outputs is a config error (exit 2), not a failed job.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import torch

from rnb.core.episode_request import EpisodeRequest
from rnb.core.model import ChecksDataset, DeclaresDtypes, Keywords, Shapes, StepModelClass, input_side, output_side
from rnb.core.model_keywords import KeywordError
from rnb.core.records import Json, json_at
from rnb.pipeline.config_records import ConfigError, PipelineConfig, QueueGroup
from rnb.pipeline.dataset_source import KINDS, parse_options
from rnb.pipeline.dotted import load_object


@dataclass(frozen=True)
class Placement:
    """One runner: its step, group, replica index, device, and what its model needs."""

    name: str
    step: int
    group: int
    instance: int
    device: str                       # "cpu" or "cuda:N"
    model: str                        # dotted class path
    model_kwargs: Keywords            # the model's keywords: whatever its constructor takes
    in_queue: int | None              # None = the request queue (step 0)
    out_queues: tuple[int, ...]       # empty for the final step
    selector: str | None = None       # dotted class path; None = round robin
    selector_kwargs: Mapping[str, Json] = field(default_factory=dict)  # keywords of the selector's constructor
    num_segments: int = 1
    num_slots: int = 0                # output slots (num_shared_tensors); 0 on the final step
    output_shapes: Shapes = ()        # empty for the final step
    output_dtypes: tuple[torch.dtype, ...] = ()  # empty = all float32
    input_shapes: Shapes | None = None  # the largest input; None for step 0
    threads: int | None = None  # torch intra-op and inter-op threads; None = torch's default
    input_device: str = ""      # where the runner receives its inputs; "" = its device (rnb.core.model.input_side)
    output_device: str = ""     # where its output slots live; "" = its device
    device_uuid: str = ""       # NVML's UUID of its GPU, which the runner checks torch's against; "" = not checked

    def __post_init__(self) -> None:
        if not self.input_device:
            object.__setattr__(self, "input_device", self.device)
        if not self.output_device:
            object.__setattr__(self, "output_device", self.device)

    @property
    def is_final(self) -> bool:
        return not self.out_queues


def cpu_threads(config: PipelineConfig) -> int:
    """Intra-op threads of each CPU runner without a "threads" keyword: an equal share of this process's cores.

    Every runner busy at once with torch's default (all cores each) would
    oversubscribe the machine, and adding a replica would only add contention.
    A CUDA runner keeps torch's default: its arithmetic runs on the device.
    """
    runners = sum(1 for step in config.steps for group in step.queue_groups for gpu in group.gpus if gpu < 0)
    return thread_share(len(os.sched_getaffinity(0)), runners)


def thread_share(cores: int, cpu_runners: int) -> int:
    """Each of `cpu_runners` CPU runners' equal share of `cores` (the tuner assumes the same of a candidate)."""
    return max(1, cores // max(1, cpu_runners))


def limit_replicas(config: PipelineConfig, most: int) -> PipelineConfig:
    """At most `most` runners per queue group (--max-replicas), each group keeping its first gpus entries.

    For trying a config written for many GPUs on a small machine; what was left out becomes a note of the job log.
    """
    steps = tuple(
        dataclasses.replace(step, queue_groups=tuple(
            dataclasses.replace(group, gpus=group.gpus[:most]) for group in step.queue_groups))
        for step in config.steps)
    before = sum(len(group.gpus) for step in config.steps for group in step.queue_groups)
    after = sum(len(group.gpus) for step in steps for group in step.queue_groups)
    if after == before:
        return config
    note = f"--max-replicas {most}: {after} of the config's {before} runners ran, each queue group keeping its first {most}"
    return dataclasses.replace(config, steps=steps, notes=(*config.notes, note))


def runner_name(step: int, group: int, instance: int) -> str:
    return f"step{step}-g{group}-r{instance}"


def plan_runners(config: PipelineConfig, batch_size: int) -> list[Placement]:
    """One placement per gpus entry of every queue group, in step order.

    Each step's model learns the previous step's output shapes (the largest
    over the producers of its in_queue, per segment if the producer splits
    its outputs), so it can size its own outputs from them.
    """
    placements: list[Placement] = []
    share = cpu_threads(config)
    warmup = warmup_request(config.source, config.path)
    produced: dict[int, list[Shapes]] = {}   # out_queue of the previous step -> shapes of what lands in it
    for k, step in enumerate(config.steps):
        model = load_object(step.model)
        outputs: dict[int, list[Shapes]] = {}
        final = k == len(config.steps) - 1
        for g, group in enumerate(step.queue_groups):
            # only step 0 reads the request queue (in_queue None)
            inputs = None if group.in_queue is None else _input_shapes(config, k, g, group.in_queue, produced[group.in_queue])
            kwargs = _model_kwargs(model, group, batch_size, inputs, warmup)
            threads = kwargs.pop("threads", None)
            if group.queue_selector is not None and len(group.out_queues) > 0:
                _check_selector(config, k, g, group.queue_selector, len(group.out_queues), group.queue_selector_kwargs)
            shapes = _output_shapes(config, k, model, kwargs, inputs, final)
            dtypes = () if final else _output_dtypes(config, k, model, kwargs, inputs, len(shapes))
            for q in group.out_queues:
                outputs.setdefault(q, []).append(_per_segment(shapes, step.num_segments))
            placements.extend(Placement(
                name=runner_name(k, g, i), step=k, group=g, instance=i, device=_device(gpu),
                input_device=input_side(model, _device(gpu)), output_device=output_side(model, _device(gpu)),
                model=step.model, model_kwargs=kwargs, selector=group.queue_selector,
                selector_kwargs=dict(group.queue_selector_kwargs), in_queue=group.in_queue,
                out_queues=tuple(group.out_queues), num_segments=step.num_segments,
                num_slots=step.num_shared_tensors, output_shapes=shapes, output_dtypes=dtypes, input_shapes=inputs,
                threads=threads if threads is not None else (share if gpu < 0 else None),
            ) for i, gpu in enumerate(group.gpus))
        produced = outputs
    return host_slots_for_host_readers(placements)


def consumers(placements: list[Placement], producer: Placement) -> list[Placement]:
    """The runners that read `producer`'s output slots: the next step's groups whose in_queue it writes."""
    return [p for p in placements if p.step == producer.step + 1 and p.in_queue in producer.out_queues]


def host_slots_for_host_readers(placements: list[Placement]) -> list[Placement]:
    """A GPU runner whose every consumer reads into host memory keeps its output slots there too.

    A CPU runner that read a CUDA slot would open a CUDA context on the
    producer's GPU for it (hundreds of MB, and a process on a GPU it never
    computes on; a CPU aggregator behind seven GPU replicas opened seven),
    and its copy would go through the GPU anyway.  Written to host memory
    by the producer (one device-to-host copy into a pinned slot), the data
    reach CPU consumers without any CUDA.
    """
    return [dataclasses.replace(p, output_device="cpu") if p.output_shapes and p.output_device.startswith("cuda")
            and all(q.input_device == "cpu" for q in consumers(placements, p)) else p for p in placements]


def with_device_uuids(placements: list[Placement], uuids: Mapping[int, str]) -> list[Placement]:
    """Each GPU runner told NVML's UUID of its GPU (logical index -> UUID), for its check at start."""
    return [dataclasses.replace(p, device_uuid=uuids[_gpu_index(p.device)]) if _gpu_index(p.device) in uuids else p
            for p in placements]


def _gpu_index(device: str) -> int:
    """N of "cuda:N"; -1 for the CPU."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else -1


def slot_bytes(p: Placement) -> int:
    """The bytes of one of the runner's output slots."""
    dtypes = p.output_dtypes or (torch.float32,) * len(p.output_shapes)
    return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in zip(p.output_shapes, dtypes))


def _model_kwargs(model: type, group: QueueGroup, batch_size: int, inputs: Shapes | None,
                  warmup: EpisodeRequest | None) -> dict[str, Any]:
    """The group's model keywords, plus what the harness supplies to constructors that take it.

    -b is the default `batch` of batching steps; `input_shapes` is the previous step's output shapes;
    `warmup_request` the source's first request, which a loader decodes before the start barrier.
    """
    kwargs = dict(group.model_kwargs)
    accepted = inspect.signature(model).parameters  # the constructor's, as config validation reads them
    if "batch" in accepted and "batch" not in kwargs:
        kwargs["batch"] = batch_size
    if "input_shapes" in accepted and inputs is not None:
        kwargs["input_shapes"] = inputs
    if "warmup_request" in accepted and warmup is not None and "warmup_request" not in kwargs:
        kwargs["warmup_request"] = warmup
    return kwargs


def warmup_request(source: Mapping[str, Json], config_path: str) -> EpisodeRequest | None:
    """The first episode a dataset or videos source can send, as a request; None for other sources.

    A local relative root is made absolute, as every node of a Ray cluster must see it.
    """
    if next(iter(source), None) not in KINDS:
        return None
    options = parse_options(source, config_path)
    root = options.root
    if "://" not in root and not os.path.isabs(root):
        root = os.path.abspath(root)
    # The source's read limits too: the loader keeps the dataset the warm-up opened, and reads every item through it.
    return EpisodeRequest(options.kind, root, options.episodes[0] if options.episodes else 0,
                          timeout_s=options.timeout_s, retries=options.retries)


def _per_segment(shapes: Shapes, num_segments: int) -> Shapes:
    """What one segment of an output can hold: torch.tensor_split's largest piece of the first dimension."""
    return tuple((-(-shape[0] // num_segments), *shape[1:]) for shape in shapes)


def _input_shapes(config: PipelineConfig, k: int, g: int, in_queue: int, producers: list[Shapes]) -> Shapes:
    """The elementwise largest of the shapes the producers of `in_queue` write: what any input can be."""
    first = producers[0]
    for other in producers[1:]:
        if len(other) != len(first) or any(len(a) != len(b) for a, b in zip(first, other)):
            raise ConfigError(config.path, f"pipeline[{k}].queue_groups[{g}].in_queue",
                              f"expected the groups of pipeline[{k - 1}] that write queue {in_queue} to output "
                              f"tensors of the same number and rank, found shapes {first} and {other}")
    return tuple(tuple(max(dims) for dims in zip(*same)) for same in zip(*producers))


def _static_call(method: Callable[..., object], kwargs: Keywords, inputs: Shapes | None) -> object:
    """Call a model's static output_shape/output_dtypes with the step's keywords, and input_shapes if it takes them."""
    arguments = {key: value for key, value in kwargs.items() if key != "input_shapes"}
    if "input_shapes" in inspect.signature(method).parameters:
        arguments["input_shapes"] = inputs
    return method(**arguments)


def check_against_dataset(config: PipelineConfig, placements: list[Placement], dataset: object) -> None:
    """Let each model with a `check_dataset(dataset, **kwargs)` hook vet its keywords against the data it will read.

    `dataset` is the source's opened dataset, or None (e.g. a synthetic
    source); a camera or data column the dataset lacks is then exit 2, not
    a failure at the first item.
    """
    for p in placements:
        model = load_object(p.model)
        if not isinstance(model, ChecksDataset) or p.instance > 0:  # replicas of a group share its keywords
            continue
        try:
            model.check_dataset(dataset, **p.model_kwargs)
        except KeywordError as error:
            group = json_at(config.raw, "pipeline", p.step, "queue_groups", p.group)
            in_group = isinstance(group, dict) and error.keyword.split("[")[0] in group
            place = f"pipeline[{p.step}].queue_groups[{p.group}]" if in_group else f"pipeline[{p.step}]"
            raise ConfigError(config.path, f"{place}.{error.keyword}", error.expected) from None


def _device(gpu: int) -> str:
    return "cpu" if gpu < 0 else f"cuda:{gpu}"


def check_slot_memory(config: PipelineConfig, placements: list[Placement],
                      gpu_memory: Mapping[int, int]) -> None:
    """Refuse output slots that cannot be allocated: shared memory on the CPU, device memory on a GPU.

    Sizes come from keywords (frames, height, max_bytes, ...), so a typo of a
    few digits asks for more memory than exists; torch would fail part way
    through setting up, or its size arithmetic would overflow.  `gpu_memory`
    maps a logical GPU index to its total bytes (from NVML).
    """
    need: dict[str, int] = {}
    largest: dict[str, tuple[int, Placement]] = {}
    for p in placements:
        slot = slot_bytes(p)
        need[p.output_device] = need.get(p.output_device, 0) + slot * p.num_slots
        if slot * p.num_slots > largest.get(p.output_device, (-1, p))[0]:
            largest[p.output_device] = (slot * p.num_slots, p)
    for device, total in need.items():
        limit: int | None
        if device == "cpu":
            limit, place = _shared_memory_bytes(), "free in /dev/shm"
        else:
            limit, place = gpu_memory.get(int(device.split(":")[1])), f"of {device}"
        if limit is None or total <= limit:
            continue
        p = largest[device][1]
        raise ConfigError(config.path, f"pipeline[{p.step}].num_shared_tensors",
                          f"expected output slots that fit in memory, found {p.num_slots} slots of shapes "
                          f"{list(p.output_shapes)} per runner and {_gib(total)} for all slots on {device}, "
                          f"more than the {_gib(limit)} {place}")


def _shared_memory_bytes() -> int:
    """What CPU slots may use: torch shares them through /dev/shm, else they are bounded by physical memory."""
    try:
        stats = os.statvfs("/dev/shm")
        return stats.f_bavail * stats.f_frsize
    except OSError:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(count: int) -> str:
    return f"{count / 2**30:.3g} GiB"


def _check_selector(config: PipelineConfig, k: int, g: int, selector: str, num_queues: int,
                    kwargs: Mapping[str, Json]) -> None:
    """Build the selector once here, so a keyword it rejects is a config error (exit 2), not a failed job."""
    try:
        load_object(selector)(num_queues, **kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(config.path, f"pipeline[{k}].queue_groups[{g}].queue_selector_kwargs",
                          f"expected keywords that {selector} accepts, found {type(error).__name__}: {error}") from None


def _output_shapes(config: PipelineConfig, k: int, model: StepModelClass, kwargs: Keywords, inputs: Shapes | None,
                   final: bool) -> Shapes:
    """The shapes of a step's output slots; on the final step output_shape() is only asked, to vet the keywords."""
    where = f"pipeline[{k}].model"
    try:
        shapes = _static_call(model.output_shape, kwargs, inputs)
    except Exception as error:  # the model's own complaint about its keywords is the config error
        raise ConfigError(config.path, where, f"expected output_shape() to accept the step's keywords, "
                          f"found {type(error).__name__}: {error}") from None
    if final:
        return ()
    if not _are_shapes(shapes):
        raise ConfigError(config.path, where, f"expected output_shape() to give a non-empty tuple of shapes (tuples of "
                          f"positive ints) because the step feeds another, found {shapes!r}")
    return shapes


def _are_shapes(value: object) -> TypeGuard[Shapes]:
    """A non-empty tuple of shapes, each a non-empty tuple of positive ints."""
    return isinstance(value, tuple) and len(value) > 0 and all(
        isinstance(shape, tuple) and len(shape) > 0 and all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                            for d in shape) for shape in value)


def _output_dtypes(config: PipelineConfig, k: int, model: StepModelClass, kwargs: Keywords, inputs: Shapes | None,
                   count: int) -> tuple[torch.dtype, ...]:
    """The optional `output_dtypes(**kwargs)` of a model whose outputs are not float32 (e.g. raw bytes)."""
    if not isinstance(model, DeclaresDtypes):
        return ()
    where = f"pipeline[{k}].model"
    try:
        dtypes = _static_call(model.output_dtypes, kwargs, inputs)
    except Exception as error:
        raise ConfigError(config.path, where, f"expected output_dtypes() to accept the step's keywords, "
                          f"found {type(error).__name__}: {error}") from None
    if not isinstance(dtypes, tuple) or len(dtypes) != count or not all(isinstance(d, torch.dtype) for d in dtypes):
        raise ConfigError(config.path, where, f"expected output_dtypes() to give one torch dtype per output shape "
                          f"({count}), found {dtypes!r}")
    return dtypes
