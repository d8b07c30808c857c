"""The contract between RnB and a step's model, in code that mypy checks.

A model is a class built once per runner as `cls(device, **keywords)`:

- `StepModelClass` is what the class itself must offer: the constructor and a
  static `output_shape(**keywords)`, the largest shape of each output
  tensor (None on a final step that outputs none);
- `StepModel` is what an instance must offer: `__call__(tensors,
  non_tensors, time_card)` returning a `StepOutput`, whose time card is
  None for "no output yet" (a batch filling, segments waiting).

Every model class shipped in `models/` is checked against the contract by
mypy (models/shipped.py).  A step that is not the final one hands each
output to a `Selector`, built from a `SelectorClass` (selector.py ships two).

Everything else is an optional hook, each its own small protocol, so the
harness asks `isinstance(model, Flushes)` rather than looking a name up:
`Flushes` (hand over what is held while the input is idle), `HasNotes`
(lines for the job log), `HasDeviceQueue` (device work of the model's own
that the runner must wait for, rnb.core.device), and on the class
`DeclaresDtypes` (outputs other than float32), `ChecksDataset` (vet
keywords against the source's dataset before start), and the class
attributes of `PlacesInputs`, `PlacesOutputs` and `MergesSegments`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

from rnb.core.timecard import Cards, TimeCard

if TYPE_CHECKING:
    import torch

    from rnb.core.device import DeviceQueue

Tensors: TypeAlias = "tuple[torch.Tensor, ...]"
Shapes: TypeAlias = tuple[tuple[int, ...], ...]
# What a model passes on besides tensors: its payload, whatever it likes (picklable values), by name.
NonTensors: TypeAlias = dict[str, Any]
# A model's keywords, as its constructor and static hooks take them: the config's JSON values plus what the
# harness supplies (`batch`, `input_shapes`). Each model knows its own; to the harness they are arbitrary.
Keywords: TypeAlias = Mapping[str, Any]


class StepOutput(NamedTuple):
    """What a model's call returns; a None time card means "no output yet"."""

    tensors: Sequence[torch.Tensor]
    non_tensors: NonTensors
    time_card: Cards | Sequence[TimeCard] | None


NOTHING_YET = StepOutput((), {}, None)


class StepModel(Protocol):
    def __call__(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> StepOutput: ...


class StepModelClass(Protocol):
    """A model class: built as `cls(device, **keywords)`, its instances StepModels.

    Only the device is typed here: each class takes keywords of its own, and
    `*args: Any, **keywords: Any` is the form mypy reads as "whatever comes
    after the device", so a constructor with named keywords meets it (a
    `**keywords: Any` alone would promise to take every keyword).
    rnb.pipeline.config checks a config's keywords against the constructor's.
    """

    def __call__(self, device: torch.device, /, *args: Any, **keywords: Any) -> StepModel: ...

    @staticmethod
    def output_shape(**keywords: Any) -> Shapes | None: ...


class Selector(Protocol):
    """An output-queue policy (a group's `queue_selector`): which of the group's out_queues gets an output."""

    def select(self, tensors: Tensors, non_tensors: NonTensors, time_card: Cards) -> int: ...


class SelectorClass(Protocol):
    """A selector class: built once per runner as `cls(num_queues, **queue_selector_kwargs)` (see StepModelClass)."""

    def __call__(self, num_queues: int, /, *args: Any, **keywords: Any) -> Selector: ...


@runtime_checkable
class Flushes(Protocol):
    """A model that may hold inputs (a batcher) and hands them over when asked while its input is idle."""

    def flush(self) -> StepOutput: ...


@runtime_checkable
class HasNotes(Protocol):
    """A model with lines for the job log's notes (e.g. which weights a network runs with)."""

    notes: Sequence[str]


@runtime_checkable
class HasDeviceQueue(Protocol):
    """A model whose call queues device work of its own, which the runner waits for before it stamps the finish."""

    device_queue: DeviceQueue


@runtime_checkable
class DeclaresDtypes(Protocol):
    """A model class whose outputs are not all float32: one torch dtype per output shape."""

    @staticmethod
    def output_dtypes(**keywords: Any) -> tuple[torch.dtype, ...]: ...


@runtime_checkable
class ChecksDataset(Protocol):
    """A model class that vets its keywords against the dataset it will read (raising rnb.core.model_keywords.KeywordError)."""

    @staticmethod
    def check_dataset(dataset: Any, **keywords: Any) -> None: ...


@runtime_checkable
class PlacesInputs(Protocol):
    """A model class that takes its inputs in host memory even on a GPU runner (`input_device = "cpu"`)."""

    input_device: str


@runtime_checkable
class PlacesOutputs(Protocol):
    """A model class whose output slots stay in host memory even on a GPU runner (`output_device = "cpu"`)."""

    output_device: str


@runtime_checkable
class MergesSegments(Protocol):
    """A model class that merges an item's segments (`merges_segments = True`).

    A step with num_segments > 1 needs one after it.
    """

    merges_segments: bool


def input_side(model: type, device: str) -> str:
    """Where a runner of `model` on `device` receives its inputs: "cpu" where the class says so, else its device.

    Some data only passes through a GPU runner on its way to host code: the
    bytes of a mini-MP4 go to the decoder library from host memory, NVDEC
    included. Keeping them on the host spares a copy to the GPU and back.
    """
    return "cpu" if isinstance(model, PlacesInputs) and model.input_device == "cpu" else device


def output_side(model: type, device: str) -> str:
    """Where a runner of `model` on `device` keeps its output slots (see input_side)."""
    return "cpu" if isinstance(model, PlacesOutputs) and model.output_device == "cpu" else device


def merges_segments(model: type) -> bool:
    """Whether a model class declares that it merges an item's segments."""
    return isinstance(model, MergesSegments) and model.merges_segments is True
