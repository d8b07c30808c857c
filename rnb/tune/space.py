"""What the tuner may choose, and one choice of it: the budget, the tuning space of a config, a candidate.

A tuning config is an ordinary pipeline config in which a Batcher's `batch`
or a step's `num_segments` may be a list of choices.  The tuner decides
every queue group's replicas and their devices, every Batcher group's batch
and every segmentable step's `num_segments`; everything else (models,
keywords, queues, selectors, slots) stays as written.  A candidate has the
shape of the config itself, step by step and group by group, so turning it
back into a runnable config is a substitution, never a rebuild.

Batchers: batching in RnB is a step of its own (`models.batcher.Batcher`,
or any model that flushes what it holds and takes a `batch` keyword)
placed before the step that takes batches.  Its batch is a setting of the
Batcher's group; the replicas are the following step's.  A Batcher group
keeps exactly one runner (one batcher fills batches fastest: several would
split the items between them), placed on the device of the first replica
it feeds, and it takes no slot of the budget: its work is a copy per item.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rnb.core.records import Json, JsonObject
from rnb.pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

GroupKind = Literal["work", "batcher"]


def digest(record: DataclassInstance, length: int) -> str:
    """A short stable hash of a frozen dataclass record: what names its files (a profile, a finalist's trials)."""
    text = json.dumps(dataclasses.asdict(record), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:length]


class TuneRequestError(ValueError):
    """A tuning request that cannot be met whatever is measured (exit 2); `str()` is one sentence."""


@dataclass(frozen=True)
class Budget:
    """What candidates may use: GPUs by index (replicas of several steps may share one, within its
    memory), and/or replica slots on the CPU (one per replica of a work group on gpu -1)."""

    gpus: tuple[int, ...] = ()
    cpu_slots: int = 0

    def __post_init__(self) -> None:
        if not self.gpus and self.cpu_slots <= 0:
            raise TuneRequestError("the budget names no device: give --gpus or --cpu-slots N (N >= 1).")

    @property
    def cpu_only(self) -> bool:
        """No GPUs: every work group runs on the CPU, as `benchmark.py --cpu` would place it."""
        return not self.gpus

    def describe(self) -> str:
        parts = []
        if self.gpus:
            parts.append(f"GPUs {','.join(str(g) for g in self.gpus)}")
        if self.cpu_slots:
            parts.append(f"{self.cpu_slots} CPU slots")
        return " and ".join(parts)


@dataclass(frozen=True)
class GroupChoices:
    """One queue group of the config and what the tuner may choose for it."""

    step: int
    group: int
    model: str
    kind: GroupKind
    batches: tuple[int, ...] = ()        # a Batcher group's batch sizes to try; () for a work group
    on_gpu: bool = False                 # a work group whose replicas go on the budget's GPUs
    fixed: tuple[int, ...] | None = None  # a CPU group the budget gives no slots for: its gpus as written
    final: bool = False                  # on the final step (writes no output slots)

    @property
    def name(self) -> str:
        return f"step {self.step}" if self.group == 0 else f"step {self.step} group {self.group}"

    @property
    def tuned(self) -> bool:
        """Whether the tuner chooses this group's replicas (a work group not held as written)."""
        return self.kind == "work" and self.fixed is None


@dataclass(frozen=True)
class GroupSettings:
    """One group's choice: a runner per entry of `devices` (a GPU index, or -1), and a Batcher's batch."""

    devices: tuple[int, ...]
    batch: int | None = None

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class StepSettings:
    groups: tuple[GroupSettings, ...]
    segments: int = 1


@dataclass(frozen=True)
class Candidate:
    """One configuration: the settings of every step of the pipeline, in order, Batchers included."""

    steps: tuple[StepSettings, ...]

    @property
    def key(self) -> str:
        """A short stable id (file names, tables): a hash of the settings."""
        return digest(self, 10)

    def group(self, step: int, group: int) -> GroupSettings:
        return self.steps[step].groups[group]


@dataclass(frozen=True)
class TuneSpace:
    """A tuning config read and checked: its steps, what may be chosen for each group, the budget."""

    config: PipelineConfig             # the config with every list replaced by its first choice, validated
    document: Mapping[str, Any]        # that config's JSON document
    groups: tuple[GroupChoices, ...]   # every group of every step, in order
    segments: tuple[tuple[int, ...], ...]  # per step, the num_segments to try
    budget: Budget
    max_replicas: int                  # per work group

    @property
    def num_steps(self) -> int:
        return len(self.config.steps)

    def choices(self, step: int, group: int) -> GroupChoices:
        return next(g for g in self.groups if g.step == step and g.group == group)

    @property
    def tuned_groups(self) -> tuple[GroupChoices, ...]:
        return tuple(g for g in self.groups if g.tuned)

    @property
    def batcher_groups(self) -> tuple[GroupChoices, ...]:
        return tuple(g for g in self.groups if g.kind == "batcher")

    def feeds(self, batcher: GroupChoices) -> tuple[GroupChoices, ...]:
        """The groups of the next step that read what a Batcher group writes: the batched groups."""
        written = set(self.config.steps[batcher.step].queue_groups[batcher.group].out_queues)
        return tuple(g for g in self.groups if g.step == batcher.step + 1
                     and self.config.steps[g.step].queue_groups[g.group].in_queue in written)

    def batcher_of(self, choices: GroupChoices) -> GroupChoices | None:
        """The Batcher group feeding a group directly, if any."""
        if choices.step == 0:
            return None
        in_queue = self.config.steps[choices.step].queue_groups[choices.group].in_queue
        for g in self.groups:
            if g.step == choices.step - 1 and g.kind == "batcher" and \
                    in_queue in self.config.steps[g.step].queue_groups[g.group].out_queues:
                return g
        return None

    # ------------------------------------------------------------ budget

    def cpu_slots_used(self, candidate: Candidate) -> int:
        return sum(candidate.group(g.step, g.group).replicas for g in self.tuned_groups if not g.on_gpu)

    def gpus_used(self, candidate: Candidate) -> tuple[int, ...]:
        return tuple(sorted({d for g in self.tuned_groups if g.on_gpu
                             for d in candidate.group(g.step, g.group).devices}))

    def devices_used(self, candidate: Candidate) -> int:
        """What the devices objective minimises: GPUs used, plus CPU slots where the budget has them."""
        return len(self.gpus_used(candidate)) + self.cpu_slots_used(candidate)

    def within_budget(self, candidate: Candidate) -> bool:
        if self.cpu_slots_used(candidate) > self.budget.cpu_slots:
            return False
        if any(d not in self.budget.gpus for d in self.gpus_used(candidate)):
            return False
        return all(1 <= candidate.group(g.step, g.group).replicas <= self.max_replicas for g in self.tuned_groups)

    # ------------------------------------------------------------ candidates

    def candidate(self, replicas: Mapping[tuple[int, int], int], batches: Mapping[tuple[int, int], int],
                  segments: Sequence[int] | None = None,
                  devices: Mapping[tuple[int, int], tuple[int, ...]] | None = None) -> Candidate:
        """A candidate from replica counts per tuned group and batches per Batcher group (others as fixed).

        GPU groups without explicit `devices` are spread over the budget's GPUs
        by `spread`; Batcher groups sit on the first device they feed.
        """
        devices = dict(devices or {})
        gpu_groups = [g for g in self.tuned_groups if g.on_gpu and (g.step, g.group) not in devices]
        devices.update(spread({(g.step, g.group): replicas[(g.step, g.group)] for g in gpu_groups}, self.budget.gpus))
        chosen: dict[tuple[int, int], GroupSettings] = {}
        for g in self.groups:
            where = (g.step, g.group)
            if g.kind == "work":
                if g.fixed is not None:
                    chosen[where] = GroupSettings(g.fixed)
                elif g.on_gpu:
                    chosen[where] = GroupSettings(tuple(devices[where]))
                else:
                    chosen[where] = GroupSettings((-1,) * replicas[where])
        for g in self.batcher_groups:
            fed = self.feeds(g)
            device = chosen[(fed[0].step, fed[0].group)].devices[0] if fed else -1
            chosen[(g.step, g.group)] = GroupSettings((device,), batches[(g.step, g.group)])
        seg = tuple(segments) if segments is not None else tuple(choices[0] for choices in self.segments)
        return Candidate(tuple(
            StepSettings(tuple(chosen[(k, gi)] for gi in range(len(step.queue_groups))), seg[k])
            for k, step in enumerate(self.config.steps)))

    def minimal(self, batches: Mapping[tuple[int, int], int] | None = None) -> Candidate:
        """One replica per tuned group, each Batcher at `batches` (default its smallest choice)."""
        chosen = {(g.step, g.group): min(g.batches) for g in self.batcher_groups}
        chosen.update(batches or {})
        return self.candidate({(g.step, g.group): 1 for g in self.tuned_groups}, chosen)

    def replicas_of(self, candidate: Candidate) -> dict[tuple[int, int], int]:
        return {(g.step, g.group): candidate.group(g.step, g.group).replicas for g in self.tuned_groups}

    def batches_of(self, candidate: Candidate) -> dict[tuple[int, int], int]:
        return {(g.step, g.group): int(candidate.group(g.step, g.group).batch or 1) for g in self.batcher_groups}

    def segments_of(self, candidate: Candidate) -> tuple[int, ...]:
        return tuple(step.segments for step in candidate.steps)

    def grid(self) -> Iterator[Candidate]:
        """Every candidate within the budget: replica counts x batches x segments (GPU placement by `spread`)."""
        tuned = self.tuned_groups
        cpu_groups = [g for g in tuned if not g.on_gpu]
        counts = range(1, self.max_replicas + 1)
        batchers = self.batcher_groups
        for replica_counts in itertools.product(counts, repeat=len(tuned)):
            replicas = {(g.step, g.group): n for g, n in zip(tuned, replica_counts)}
            if sum(replicas[(g.step, g.group)] for g in cpu_groups) > self.budget.cpu_slots:
                continue
            for batch_values in itertools.product(*(g.batches for g in batchers)):
                batches = {(g.step, g.group): b for g, b in zip(batchers, batch_values)}
                for segments in itertools.product(*self.segments):
                    yield self.candidate(replicas, batches, segments)

    def grid_size(self) -> int:
        return sum(1 for _ in self.grid())

    def label(self, candidate: Candidate) -> str:
        """The settings as a person reads them, e.g. `step 0: 4 x cpu; step 1: batch 8; step 2: 1 x cpu`."""
        parts = []
        for g in self.groups:
            settings = candidate.group(g.step, g.group)
            if g.kind == "batcher":
                text = f"batch {settings.batch}"
            else:
                text = f"{settings.replicas} x {_devices(settings.devices)}"
            segments = candidate.steps[g.step].segments
            if g.group == len(self.config.steps[g.step].queue_groups) - 1 and len(self.segments[g.step]) > 1:
                text += f", {segments} segments"
            parts.append(f"{g.name}: {text}")
        return "; ".join(parts)

    def short_label(self, candidate: Candidate) -> str:
        """The settings in a few characters, group by group: `4 | b8 | 1 | 1`."""
        parts = []
        for g in self.groups:
            settings = candidate.group(g.step, g.group)
            text = f"b{settings.batch}" if g.kind == "batcher" else _short_devices(settings.devices)
            if g.group == len(self.config.steps[g.step].queue_groups) - 1 and len(self.segments[g.step]) > 1:
                text += f" s{candidate.steps[g.step].segments}"
            parts.append(text)
        return " | ".join(parts)

    def document_for(self, candidate: Candidate, run: Mapping[str, Json] | None = None,
                     description: str | None = None) -> JsonObject:
        """The candidate as a config document that benchmark.py runs as is."""
        document = copy.deepcopy(dict(self.document))
        for k, step in enumerate(document["pipeline"]):
            settings = candidate.steps[k]
            if settings.segments != 1 or "num_segments" in step:
                step["num_segments"] = settings.segments
            for gi, group in enumerate(step["queue_groups"]):
                chosen = settings.groups[gi]
                group["gpus"] = list(chosen.devices)
                if chosen.batch is not None:
                    step.pop("batch", None)
                    group["batch"] = chosen.batch
        if run is not None:
            document["run"] = {**document.get("run", {}), **run}
        if description is not None:
            document["description"] = description
        return document


def _devices(devices: tuple[int, ...]) -> str:
    if all(d < 0 for d in devices):
        return "cpu"
    return "GPU " + ",".join("cpu" if d < 0 else str(d) for d in devices)


def _short_devices(devices: tuple[int, ...]) -> str:
    if all(d < 0 for d in devices):
        return str(len(devices))
    return "[" + ",".join("c" if d < 0 else str(d) for d in devices) + "]"


def spread(replicas: Mapping[tuple[int, int], int], gpus: Sequence[int]) -> dict[tuple[int, int], tuple[int, ...]]:
    """Replicas of GPU groups dealt over the GPUs in turn, continuing where the previous group stopped.

    Each group's replicas land on distinct GPUs while it has no more than
    there are, and the GPUs' replica counts differ by at most one: the
    placement a person would write first.  The quick search moves replicas
    from there when a GPU is the bottleneck.
    """
    placed: dict[tuple[int, int], tuple[int, ...]] = {}
    turn = 0
    for where, count in replicas.items():
        placed[where] = tuple(gpus[(turn + i) % len(gpus)] for i in range(count))
        turn += count
    return placed
