"""The Ray cluster a test module shares: a head and labelled nodes, all on 127.0.0.1 (ray.cluster_utils.Cluster).

Starting Ray costs tens of seconds on a small machine, so one cluster serves
every Ray test of a module; each job creates its own actors and must remove
them.  The cluster's processes start with CUDA_DEVICE_ORDER=FASTEST_FIRST,
so what an actor or task sees is what the driver gave it (PCI_BUS_ID), never
what this test process happened to hold.  What a job left behind is asked of
the GCS (its registry of named actors), so the head runs no dashboard
(measured: it cost 6 CPU-s more to start, and the idle cluster 2.8 CPU-s per
30 s instead of 1.9).  The GCS health-checks the raylets every half second
instead of every 3 s, so a lost node is known dead in about 3 s, not 15.  No
test runs on a cluster that listens beyond the loopback address: the fixture
checks every listening socket of the cluster's processes first.
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from rnb.engines.ray.cluster import LOOPBACK, NAMESPACE, OWN_SYSTEM_CONFIG

LABELS = ("loaders", "nets")
OBJECT_STORE_BYTES = 150 * 2**20  # per node: the tests' tensors are small, and the nodes share this machine
NETS_GPUS = 1  # a GPU Ray is told the "nets" node has: there is none, which the GPU checks must find
CLUSTER_DEVICE_ORDER = "FASTEST_FIRST"  # what a worker of the cluster sees unless the driver sets its own
# A killed raylet refuses each check at once, so it is declared dead after 5 periods; a live one, however loaded,
# still has Ray's 10 s per check.  No worker is started ahead for this test process, the first driver: its tasks
# run on other nodes, and each job's actors get workers of their own.
SYSTEM_CONFIG = {**OWN_SYSTEM_CONFIG, "health_check_period_ms": 500, "prestart_worker_first_driver": False}


@dataclass
class TestCluster:
    cluster: Cluster
    nodes: dict[str, Any] = field(default_factory=dict)   # label -> ray's Node

    @property
    def address(self) -> str:
        return self.cluster.address

    def alive_actors(self, job: str) -> list[str]:
        """Names of a job's actors that are not dead: the GCS drops an actor's name when the actor dies for good."""
        named = ray.util.list_named_actors(all_namespaces=True)
        return sorted(a["name"] for a in named if a["namespace"] == NAMESPACE and a["name"].startswith(f"{job}/"))

    def add_node(self, label: str, gpus: int = 0) -> Any:
        with device_order(CLUSTER_DEVICE_ORDER):
            node = self.cluster.add_node(node_ip_address=LOOPBACK, num_cpus=1, num_gpus=gpus, labels={"node": label},
                                         object_store_memory=OBJECT_STORE_BYTES)
        self.nodes[label] = node
        return node

    def remove_node(self, label: str) -> None:
        """Kill a node's processes at once, as a lost machine goes."""
        self.cluster.remove_node(self.nodes.pop(label), allow_graceful=False)

    def wait_until_known_dead(self, node_id: str, timeout_s: float = 60.0) -> None:
        """Until Ray's health checks have marked a lost node dead (about 3 s here): till then Ray may still lease
        workers on it for the next job, whose actors would then die with it."""
        deadline = time.time() + timeout_s
        while any(node["NodeID"] == node_id and node["Alive"] for node in ray.nodes()):
            if time.time() > deadline:
                raise TimeoutError(f"Ray still counts node {node_id} alive {timeout_s:.0f} s after it was killed")
            time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def device_order_seen(file: str, json_path: str, allow_busy: bool) -> str:
    """A stand-in for the Ray driver's GPU check task (rnb.engines.ray.gpu_bundles._check_gpu_here): what it would
    have checked under, returned where the check returns what is wrong."""
    return f"CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER', 'unset')}"


@contextlib.contextmanager
def device_order(order: str) -> Iterator[None]:
    """CUDA_DEVICE_ORDER set to `order` in this process for the block (what processes started in it inherit)."""
    before = os.environ.get("CUDA_DEVICE_ORDER")
    os.environ["CUDA_DEVICE_ORDER"] = order
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUDA_DEVICE_ORDER"]
        else:
            os.environ["CUDA_DEVICE_ORDER"] = before


def start_test_cluster() -> Iterator[TestCluster]:
    """Yield the running cluster, the pytest process connected to it as a driver; shut it down after."""
    with device_order(CLUSTER_DEVICE_ORDER):
        cluster = Cluster(initialize_head=True, head_node_args={
            "node_ip_address": LOOPBACK, "num_cpus": 1, "num_gpus": 0, "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False, "_system_config": SYSTEM_CONFIG})
    try:
        test = TestCluster(cluster)
        test.add_node("loaders")
        test.add_node("nets", gpus=NETS_GPUS)
        ray.init(address=cluster.address, namespace="rnb-tests", logging_level="WARNING")
        wide = listeners_beyond_loopback()
        if wide:
            raise RuntimeError(f"the test Ray cluster listens beyond the loopback address: {wide}")
        yield test
    finally:
        ray.shutdown()
        cluster.shutdown()


def listeners_beyond_loopback() -> list[str]:
    """Listening TCP sockets of this process and its descendants (Ray's) bound to anything but the loopback address."""
    listing = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    wide = []
    for line in listing.splitlines():
        fields = line.split()
        local, users = fields[3], " ".join(fields[5:])
        host = local.rpartition(":")[0].strip("[]")
        pids = [int(pid) for pid in re.findall(r"pid=(\d+)", users)]
        if any(_descends_from(pid, os.getpid()) for pid in pids) and host not in ("127.0.0.1", "::ffff:127.0.0.1", "::1"):
            wide.append(f"{local} {users}")
    return wide


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])
    return False
