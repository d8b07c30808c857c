"""The job's GPUs on a Ray cluster: one placement-group bundle per GPU, each checked free by NVML on its node."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rnb.core.records import GpuRecord
from rnb.engines.ray.placement import ACTOR_ENV, PLACE_TIMEOUT_S, NodeChoice, Seat
from rnb.pipeline.config import ConfigError, PipelineConfig
from rnb.pipeline.gpus import GpuRequestError, check_assigned_gpu


@dataclass(frozen=True)
class Reservation:
    """The job's GPU bundles: their placement group (None for a job without GPUs) and each bundle's GPU as checked."""

    group: Any
    gpus: tuple[GpuRecord, ...] = ()

    def uuid_of(self, bundle: int) -> str:
        """NVML's UUID of a bundle's GPU, as its check found it."""
        return self.gpus[bundle].uuid

    def release(self) -> None:
        if self.group is not None:
            remove_placement_group(self.group)


def reserve_gpus(config: PipelineConfig, seats: Sequence[Seat], bundles: Sequence[NodeChoice],
                 allow_busy: bool) -> Reservation:
    """The placement group of the GPU bundles, each GPU checked free by NVML on its node; ConfigError (exit 2, the
    group removed) where the cluster does not give them or a GPU is busy or not the one asked for."""
    if not bundles:
        return Reservation(None)
    shapes = [choice.bundle() for choice in bundles]
    group = placement_group([s for s, _ in shapes], strategy="PACK", bundle_label_selector=[label for _, label in shapes])
    try:
        return Reservation(group, _checked(config, seats, group, len(bundles), allow_busy))
    except BaseException:
        remove_placement_group(group)
        raise


def _checked(config: PipelineConfig, seats: Sequence[Seat], group: Any, count: int,
             allow_busy: bool) -> tuple[GpuRecord, ...]:
    ready, _ = ray.wait([group.ready()], timeout=PLACE_TIMEOUT_S)
    if not ready:
        first = next(seat for seat in seats if seat.bundle is not None)
        raise ConfigError(config.path, first.gpus_path, f"expected the Ray cluster to give the job {count} GPUs, "
                                                        f"found them not free within {PLACE_TIMEOUT_S:.0f} s")
    firsts = [next(seat for seat in seats if seat.bundle == index) for index in range(count)]
    checks = [ray.remote(_check_gpu_here).options(num_cpus=0, num_gpus=1, runtime_env={"env_vars": ACTOR_ENV},
                                                  scheduling_strategy=PlacementGroupSchedulingStrategy(
                                                      group, placement_group_bundle_index=index))
              .remote(config.path, seat.gpus_path, allow_busy) for index, seat in enumerate(firsts)]
    infos = []
    for seat, found in zip(firsts, ray.get(checks)):
        if isinstance(found, str):
            raise ConfigError(config.path, seat.gpus_path, found)
        infos.append(found)
    return tuple(infos)


def _check_gpu_here(file: str, json_path: str, allow_busy: bool) -> GpuRecord | str:
    """A Ray task on a GPU bundle's node: the GPU Ray gave it, checked; or what is wrong with it.

    What is wrong comes back as a value: Ray cannot carry a ConfigError back raised.
    """
    try:
        return check_assigned_gpu(file, json_path, allow_busy=allow_busy)
    except GpuRequestError as error:
        return f"{error.expected} (on the Ray node at {ray.util.get_node_ip_address()})"
