"""Which cores a queue group computes on, when a Ray cluster spreads the pipeline over nodes.

A node of a Ray cluster is a raylet, not a machine: the simulated cluster
that a job starts here puts a head and one node per label on this one
host, and a real cluster may run several nodes on one machine.  Runners on
nodes of one host share its cores; runners on separate hosts do not.  So
the estimator shares cores per *pool*: the hosts (node addresses) that one
node label reaches, joined with every other host a label reaches together
with them (Ray places a group's replicas on any of its label's nodes, so
their hosts' cores count as one).  Pool 0 is always the driver's host:
the client and main run there.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rnb.engines.ray.cluster import JobRay, NodeInfo, prepare, resolve_address, simulated_node_cpus, split_label
from rnb.engines.registry import spans_hosts
from rnb.pipeline.config import PipelineConfig


@dataclass(frozen=True)
class HostPools:
    """Each node label's pool of cores and its nodes' CPU resource; each pool's cores.

    The default, no labels and no cores, puts every group on the driver's
    host at the cores measured there (the local engine, a Ray of the job's
    own on this machine, or its simulated cluster).
    """

    pools: tuple[tuple[str, int], ...] = ()        # node label -> its pool (0: the driver's host)
    node_cpus: tuple[tuple[str, int], ...] = ()    # node label -> the CPU resource of one of its nodes
    cores: tuple[float, ...] = ()                  # usable cores of pool 0, 1, ...; (): pool 0 only, the host's

    def pool_of(self, label: str | None) -> int:
        return dict(self.pools).get(label or "", 0)

    def cpus_of(self, label: str | None) -> int | None:
        """The CPU resource the Ray driver shares among a label's CPU runners (None: not known, or no label)."""
        return dict(self.node_cpus).get(label or "")


def simulated_pools(labels: Iterable[str]) -> HostPools:
    """The simulated cluster of a job with these node labels: every node on this host (pool 0)."""
    distinct = sorted(set(labels))
    cpus = simulated_node_cpus(len(distinct))
    return HostPools(tuple((label, 0) for label in distinct), tuple((label, cpus) for label in distinct))


def _selects(label: str | None, node: NodeInfo) -> bool:
    """Whether Ray may place a group with this "node" on `node` (as rnb.engines.ray.placement reads it)."""
    if label is None:
        return True
    key, value = split_label(label)
    return node.labels.get(key) == value or ("=" not in label and node.resources.get(label, 0) > 0)


def cluster_pools(nodes: Sequence[NodeInfo], labels: Iterable[str | None], driver_ip: str,
                  driver_cores: float) -> HostPools:
    """The pools of a running cluster: hosts are node addresses, joined where one label reaches several.

    A host's cores are `driver_cores` (measured) for the driver's own, else
    the largest CPU resource of its nodes (Ray counts a node's CPUs from its
    host's, so two nodes of one host each report all of them; a host whose
    nodes report none is not modelled: infinite cores).  A label no
    node carries is left out: the job's placement refuses it (exit 2).
    """
    parent: dict[str, str] = {node.ip: node.ip for node in nodes}
    parent.setdefault(driver_ip, driver_ip)

    def root(ip: str) -> str:
        while parent[ip] != ip:
            ip = parent[ip]
        return ip

    reached = {label: [node for node in nodes if _selects(label, node)] for label in set(labels)}
    for chosen in reached.values():
        for node in chosen[1:]:
            parent[root(node.ip)] = root(chosen[0].ip)
    cores: dict[str, float] = {}
    for ip in parent:
        here = driver_cores if ip == driver_ip else max((float(n.cpus) for n in nodes if n.ip == ip), default=0.0)
        here = here or math.inf   # a host whose nodes report no CPU resource: its cores are not modelled
        cores[root(ip)] = cores.get(root(ip), 0.0) + here
    order = [root(driver_ip)] + sorted({root(ip) for ip in parent} - {root(driver_ip)})
    pools = tuple((label or "", order.index(root(chosen[0].ip))) for label, chosen in reached.items() if chosen)
    node_cpus = tuple((label or "", min(n.cpus for n in chosen)) for label, chosen in reached.items() if chosen)
    return HostPools(tuple(sorted(pools)), tuple(sorted(node_cpus)), tuple(cores[ip] for ip in order))


def running_cluster_pools(address: str, labels: Iterable[str | None], driver_cores: float) -> HostPools:
    """The pools of the cluster at `address`, asked of Ray once (a connection of a few seconds).

    `prepare` asks its GCS first (a ClusterStartError where nothing answers),
    so a wrong address does not hang the tuner in `ray.init`'s retries.
    """
    prepare(address)
    import ray  # only now: prepare() sets what Ray reads when it is imported

    with JobRay(address) as joined:
        return cluster_pools(joined.nodes(), labels, ray.util.get_node_ip_address(), driver_cores)



def hosts_of(config: PipelineConfig, engine: str, address: str | None, cores: float) -> HostPools:
    """Where a config's groups compute on an engine: the local engine and a Ray of the job's own are this host;
    node labels without an address are the simulated cluster, on this host too; a cluster is asked."""
    labels = [group.node for step in config.steps for group in step.queue_groups]
    if not spans_hosts(engine) or not any(labels) and resolve_address(address) is None:
        return HostPools()
    given = resolve_address(address)
    if given is None:
        return simulated_pools(label for label in labels if label is not None)
    return running_cluster_pools(given, labels, cores)
