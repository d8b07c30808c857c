"""The Ray a job runs on: a cluster it is given, or one it starts on this machine and stops again.

    --ray-address ADDR (or RAY_ADDRESS)   connect to that cluster; the job leaves it running
    neither, no node labels in the config  start a one-node Ray on 127.0.0.1 for the job
    neither, node labels in the config     start a simulated cluster on 127.0.0.1: a head node
                                            for the driver, plus one node per label
                                            (ray.cluster_utils.Cluster), so a cluster config
                                            runs here as it would on the real cluster

What this module starts listens on the loopback address only.  Ray rewrites
a loopback address given to `ray.init` into this machine's network address
(it assumes a cluster spans machines), which a loopback-only cluster does
not listen on; Ray's own setting RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it
take 127.0.0.1 as this machine's address instead.  Ray reads that setting
when it is imported, so `use_loopback_if_local` must run before anything
imports ray.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

LOOPBACK = "127.0.0.1"
NAMESPACE = "rnb"            # the Ray namespace of every job's named actors
LABEL_KEY = "node"           # a group's "node": "loaders" selects nodes labelled node=loaders
SIMULATED_OBJECT_STORE_BYTES = 200 * 2**20  # per simulated node (they share this machine); past it Ray spills to disk
# For a Ray of the job's own: Ray's memory monitor would kill our actors when this machine's memory runs
# short whoever uses it, where the local engine's processes would carry on; the job's own Ray does without.
OWN_SYSTEM_CONFIG = {"memory_monitor_refresh_ms": 0}

log = logging.getLogger(__name__)


class ClusterStartError(RuntimeError):
    """The job's own Ray could not be started, or the given cluster could not be reached."""


def is_loopback_address(address: str | None) -> bool:
    """Whether a Ray address (host:port) names this machine's loopback interface."""
    host = (address or "").rpartition(":")[0] or address or ""
    return host.strip("[]") in ("127.0.0.1", "localhost", "::1")


def resolve_address(given: str | None) -> str | None:
    """The cluster to connect to: --ray-address, else RAY_ADDRESS (as "auto"), else None: start our own."""
    if given:
        return given
    return "auto" if os.environ.get("RAY_ADDRESS") else None


def use_loopback_if_local(address: str | None) -> None:
    """Before ray is imported: if the cluster lives on this machine's loopback, make Ray see this machine there."""
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if target is None or is_loopback_address(target):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


@dataclass(frozen=True)
class NodeInfo:
    """One alive node of the cluster, as placement needs it."""

    node_id: str
    ip: str
    labels: Mapping[str, str]
    resources: Mapping[str, float]   # totals: "CPU", "GPU", custom resources

    @property
    def cpus(self) -> int:
        return int(self.resources.get("CPU", 0))

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0))


@dataclass
class JobRay:
    """A context manager: connected to Ray inside, and on exit nothing of the job's own Ray left running.

    `labels` are the node labels the config names (simulated nodes when the
    job starts its own Ray); `gpu_labels` those of them that host GPU runners
    (their simulated nodes get this machine's GPUs).
    """

    address: str | None
    labels: Sequence[str] = ()
    gpu_labels: frozenset[str] = frozenset()
    machine_gpus: int = 0
    cluster: Any = field(default=None, init=False)   # ray.cluster_utils.Cluster when simulated

    @property
    def own(self) -> bool:
        """True when this job started the Ray it runs on (and so stops it)."""
        return self.address is None

    @property
    def simulated(self) -> bool:
        return self.cluster is not None

    def __enter__(self) -> JobRay:
        import ray

        init = {"namespace": NAMESPACE, "logging_level": logging.WARNING}
        try:
            if self.address is not None:
                ray.init(address=self.address, **init)
            elif self.labels:
                self.cluster = _simulated_cluster(self.labels, self.gpu_labels, self.machine_gpus)
                ray.init(address=self.cluster.address, **init)
            else:
                ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False,
                         num_cpus=len(os.sched_getaffinity(0)), num_gpus=self.machine_gpus,
                         _system_config=OWN_SYSTEM_CONFIG, **init)
        except Exception as error:
            self._shutdown()
            where = f"the Ray cluster at {self.address}" if self.address else "a Ray instance for the job on 127.0.0.1"
            raise ClusterStartError(f"could not start or reach {where} ({type(error).__name__}: "
                                    f"{(str(error).splitlines() or [''])[0]})") from None
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None

    def nodes(self) -> list[NodeInfo]:
        """The alive nodes, head first as Ray lists them."""
        import ray

        return [NodeInfo(node["NodeID"], node["NodeManagerAddress"], dict(node.get("Labels") or {}),
                         dict(node["Resources"])) for node in ray.nodes() if node["Alive"]]


def _simulated_cluster(labels: Sequence[str], gpu_labels: frozenset[str], machine_gpus: int) -> Any:
    """A head node (the driver's) and one node per label, all on 127.0.0.1, sharing this machine's cores."""
    from ray.cluster_utils import Cluster

    cores = len(os.sched_getaffinity(0))
    common = {"node_ip_address": LOOPBACK, "num_cpus": max(1, cores // (len(labels) + 1)),
              "object_store_memory": SIMULATED_OBJECT_STORE_BYTES}
    cluster = Cluster(initialize_head=True, head_node_args={**common, "num_gpus": 0, "include_dashboard": False,
                                                            "_system_config": OWN_SYSTEM_CONFIG})
    try:
        for label in labels:
            key, value = split_label(label)
            cluster.add_node(**common, labels={key: value}, num_gpus=machine_gpus if label in gpu_labels else 0)
    except BaseException:
        cluster.shutdown()
        raise
    log.info("started a simulated Ray cluster on 127.0.0.1: a head node and %d labelled nodes (%s)",
             len(labels), ", ".join(labels))
    return cluster


def split_label(node: str) -> tuple[str, str]:
    """A group's "node" as a (label key, value) pair: "loaders" is node=loaders, "key=value" is itself."""
    key, sep, value = node.partition("=")
    return (key, value) if sep else (LABEL_KEY, node)
