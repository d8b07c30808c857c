"""Quick search's moves: the candidates next to one, gathered around its predicted bottleneck."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from rnb.tune.space import Candidate, GroupChoices, TuneSpace

GroupKey: TypeAlias = tuple[int, int]   # (step, group)


@dataclass
class Neighbours:
    """Quick search's moves from one candidate, gathered in order around its bottleneck (`neck`, at `where`)."""

    space: TuneSpace
    busy: Mapping[str, float]
    neck: GroupChoices
    tuned: list[GroupChoices]
    replicas: dict[GroupKey, int]
    batches: dict[GroupKey, int]
    segments: list[int]
    devices: dict[GroupKey, tuple[int, ...]]
    made: list[Candidate]

    @staticmethod
    def of(space: TuneSpace, candidate: Candidate, busy: Mapping[str, float]) -> Neighbours:
        by_name = {g.name: g for g in space.groups}
        tuned = list(space.tuned_groups)
        # The bottleneck among what can change: a tuned group, or the group a Batcher feeds.
        order = sorted(busy, key=lambda name: -busy[name])
        neck = next((by_name[name] for name in order if by_name[name].tuned), tuned[0])
        devices = {(g.step, g.group): candidate.group(g.step, g.group).devices for g in tuned if g.on_gpu}
        return Neighbours(space, busy, neck, tuned, space.replicas_of(candidate), space.batches_of(candidate),
                           list(space.segments_of(candidate)), devices, [])

    @property
    def where(self) -> GroupKey:
        return self.neck.step, self.neck.group

    def add(self, replicas: Mapping[GroupKey, int], batches: Mapping[GroupKey, int] | None = None,
            segments: Sequence[int] | None = None, devices: Mapping[GroupKey, tuple[int, ...]] | None = None) -> None:
        """The candidate of these choices (the current ones where None), GPU lists resized to new replica counts."""
        placed = dict(devices if devices is not None else self.devices)
        for key, count in replicas.items():
            if key in placed and len(placed[key]) != count:
                placed[key] = _resize(placed[key], count, placed, self.space.budget.gpus)
        self.made.append(self.space.candidate(replicas, self.batches if batches is None else batches,
                                              self.segments if segments is None else segments, placed))

    def batches_beside_the_neck(self) -> None:
        """The batch of the Batcher feeding the neck one choice down and up."""
        batcher = self.space.batcher_of(self.neck)
        if batcher is None:
            return
        choices = sorted(batcher.batches)
        at = choices.index(self.batches[(batcher.step, batcher.group)])
        for other in (at - 1, at + 1):
            if 0 <= other < len(choices):
                self.add(self.replicas, {**self.batches, (batcher.step, batcher.group): choices[other]})

    def trades_from_the_idlest(self) -> None:
        """A replica of the least busy group with more than one given to the neck, or given up."""
        idle = sorted((g for g in self.tuned if self.replicas[(g.step, g.group)] > 1 and g is not self.neck),
                      key=lambda g: self.busy.get(g.name, 0.0))
        if not idle:
            return
        replicas, where = self.replicas, self.where
        donor = (idle[0].step, idle[0].group)
        traded = {**replicas, donor: replicas[donor] - 1, where: replicas[where] + 1}
        self.add(traded)
        self.add({**replicas, donor: replicas[donor] - 1})
        # The donor's fewer replicas may keep up at a larger batch: the trade and the batch in one move.
        feeder = self.space.batcher_of(idle[0])
        if feeder is not None:
            choices = sorted(feeder.batches)
            at = choices.index(self.batches[(feeder.step, feeder.group)])
            if at + 1 < len(choices):
                self.add(traded, {**self.batches, (feeder.step, feeder.group): choices[at + 1]})

    def segments_beside_the_neck(self) -> None:
        """The segments of the step before the neck one choice down and up."""
        step = self.neck.step
        if step == 0 or len(self.space.segments[step - 1]) <= 1:
            return
        choices = list(self.space.segments[step - 1])
        at = choices.index(self.segments[step - 1])
        for other in (at - 1, at + 1):
            if 0 <= other < len(choices):
                self.add(self.replicas, self.batches, [*self.segments[: step - 1], choices[other], *self.segments[step:]])

    def the_neck_on_a_freer_gpu(self) -> None:
        """One of the neck's GPU replicas moved from its busiest GPU to the least loaded one, if that is freer."""
        gpus = self.space.budget.gpus
        if not self.neck.on_gpu or len(gpus) <= 1:
            return
        load = _gpu_load(self.devices, gpus)
        mine = self.devices[self.where]
        busiest = max(set(mine), key=lambda d: load[d])
        freest = min(gpus, key=lambda d: load[d])
        if load[freest] < load[busiest]:
            moved = list(mine)
            moved[moved.index(busiest)] = freest
            self.add(self.replicas, devices={**self.devices, self.where: tuple(moved)})


def _gpu_load(devices: Mapping[GroupKey, tuple[int, ...]], gpus: Sequence[int]) -> dict[int, int]:
    load = {gpu: 0 for gpu in gpus}
    for placed in devices.values():
        for device in placed:
            load[device] = load.get(device, 0) + 1
    return load


def _resize(placed: tuple[int, ...], count: int, all_devices: Mapping[GroupKey, tuple[int, ...]],
            gpus: Sequence[int]) -> tuple[int, ...]:
    """A group's devices with one replica more (on the least loaded GPU) or fewer (off the most loaded)."""
    load = _gpu_load(all_devices, gpus)
    devices = list(placed)
    while len(devices) < count:
        freest = min(gpus, key=lambda d: (load[d], d))
        devices.append(freest)
        load[freest] += 1
    while len(devices) > count:
        busiest = max(devices, key=lambda d: (load[d], d))
        devices.remove(busiest)
        load[busiest] -= 1
    return tuple(devices)
