"""Where each runner goes on a Ray cluster, checked against the cluster before anything starts.

A queue group's "node" pins its runners to the nodes that carry that label
("loaders" means the label node=loaders; "key=value" any label) or, failing
that, that custom resource.  A `gpus` entry N >= 0 asks for a GPU: entries
that name the same index on the same nodes share one GPU, as they share
GPU N on the local engine, so each distinct (node, index) is one bundle of
the job's placement group and its runners split that bundle's GPU.  A
label no node carries, or more GPUs than the matching nodes have, is a
config error (exit 2) before any actor exists.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rnb.engines.ray.cluster import NodeInfo, split_label
from rnb.pipeline.config import ConfigError, PipelineConfig
from rnb.pipeline.gpus import DEVICE_ORDER
from rnb.pipeline.plan import Placement

# Ray's own zero-copy path for CPU tensors: the consumer reads them straight out of the object store; and
# CUDA numbering GPUs as NVML does, so that the index Ray puts in CUDA_VISIBLE_DEVICES is the GPU it checked.
ACTOR_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1", **DEVICE_ORDER}
PLACE_TIMEOUT_S = 120.0   # an actor or GPU bundle not placed by then will not be: the cluster lacks room
# What a runner pinned by a custom resource asks of it: a sliver, so any number fit on one node.
RESOURCE_SLIVER = 0.001


@dataclass(frozen=True)
class NodeChoice:
    """How the runners of one queue group find their nodes: a label selector, a custom resource, or anywhere."""

    node: str | None                       # the group's "node" as written; None = wherever Ray puts it
    label: tuple[str, str] | None = None   # (key, value) of a node label
    resource: str | None = None            # a custom resource's name

    def actor_options(self) -> dict[str, Any]:
        if self.label is not None:
            return {"label_selector": {self.label[0]: self.label[1]}}
        if self.resource is not None:
            return {"resources": {self.resource: RESOURCE_SLIVER}}
        return {}

    def bundle(self) -> tuple[dict[str, float], dict[str, str]]:
        """A placement-group bundle holding one GPU on such a node, and its label selector."""
        resources = {"GPU": 1.0}
        if self.resource is not None:
            resources[self.resource] = RESOURCE_SLIVER
        return resources, ({self.label[0]: self.label[1]} if self.label is not None else {})

    def matches(self, node: NodeInfo) -> bool:
        if self.label is not None:
            return node.labels.get(self.label[0]) == self.label[1]
        if self.resource is not None:
            return node.resources.get(self.resource, 0) > 0
        return True


@dataclass(frozen=True)
class Seat:
    """One runner's place: its node choice and, for a GPU runner, its bundle and share of that bundle's GPU."""

    placement: Placement
    choice: NodeChoice
    bundle: int | None = None     # index into the job's GPU bundles; None for a CPU runner
    gpu_share: float = 0.0        # num_gpus: 1 / the runners sharing the bundle
    gpus_path: str = ""           # JSON path of its gpus entry, for error sentences


def seat_runners(config: PipelineConfig, placements: Sequence[Placement],
                 nodes: Sequence[NodeInfo]) -> tuple[list[Seat], list[NodeChoice]]:
    """Every runner's seat, and the GPU bundles (one NodeChoice each) the job's placement group must hold."""
    choices: dict[str | None, NodeChoice] = {}
    bundles: dict[tuple[str | None, int], list[Placement]] = {}
    paths: dict[tuple[int, int, int], str] = {}
    for p in placements:
        group = config.steps[p.step].queue_groups[p.group]
        path = f"pipeline[{p.step}].queue_groups[{p.group}]"
        paths[(p.step, p.group, p.instance)] = f"{path}.gpus[{p.instance}]"
        if group.node not in choices:
            choices[group.node] = _choose(config.path, f"{path}.node", group.node, nodes)
        if p.device.startswith("cuda"):
            bundles.setdefault((group.node, int(p.device.split(":")[1])), []).append(p)
    _check_gpu_counts(config.path, bundles, choices, nodes, paths)
    order = list(bundles)
    seats = []
    for p in placements:
        node = config.steps[p.step].queue_groups[p.group].node
        path = paths[(p.step, p.group, p.instance)]
        if p.device.startswith("cuda"):
            key = (node, int(p.device.split(":")[1]))
            seats.append(Seat(p, choices[node], order.index(key), 1.0 / len(bundles[key]), path))
        else:
            seats.append(Seat(p, choices[node], gpus_path=path))
    return seats, [choices[node] for node, _ in order]


def _choose(file: str, where: str, node: str | None, nodes: Sequence[NodeInfo]) -> NodeChoice:
    if node is None:
        return NodeChoice(None)
    key, value = split_label(node)
    if any(n.labels.get(key) == value for n in nodes):
        return NodeChoice(node, label=(key, value))
    if "=" not in node and any(n.resources.get(node, 0) > 0 for n in nodes):
        return NodeChoice(node, resource=node)
    known = sorted({f"{k}={v}" for n in nodes for k, v in n.labels.items() if not k.startswith("ray.io/")})
    raise ConfigError(file, where, f"expected a label ({key}={value}) or custom resource of a node of the Ray cluster, "
                                   f"found no node with it (its nodes' labels: {', '.join(known) or 'none'})")


def _check_gpu_counts(file: str, bundles: dict[tuple[str | None, int], list[Placement]],
                      choices: dict[str | None, NodeChoice], nodes: Sequence[NodeInfo],
                      paths: dict[tuple[int, int, int], str]) -> None:
    """The GPUs the config asks for on each kind of node, against what the matching nodes have in all."""
    wanted: dict[str | None, list[Placement]] = {}
    for (node, _), runners in bundles.items():
        wanted.setdefault(node, []).append(runners[0])
    for node, firsts in wanted.items():
        have = sum(n.gpus for n in nodes if choices[node].matches(n))
        if len(firsts) > have:
            p = firsts[have]
            where = "the Ray cluster's nodes" if node is None else f'the Ray nodes "{node}" selects'
            raise ConfigError(file, paths[(p.step, p.group, p.instance)],
                              f"expected at most {have} distinct GPUs on {where} (they have {have}), "
                              f"found the config asks for {len(firsts)}")
