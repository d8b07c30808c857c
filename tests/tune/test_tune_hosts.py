"""The estimator's cores on a Ray cluster: nodes of one host share its cores, separate hosts do not.

Cases worked by hand, as tests/tune/test_tune_cores.py works them for one host:
two steps of 6 and 3 ms of CPU per item.  On one host of 2 cores (the
simulated two-node cluster) they serve at most 2 / 9 ms = 222 items/s
whatever the replicas; on two hosts of 2 cores each, the loaders' host
bounds them at 2 / 6 ms = 333 items/s.
"""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from rnb.engines.ray.cluster import NodeInfo, simulated_node_cpus
from rnb.tune.cores import HostCores
from rnb.tune.estimate import Estimator
from rnb.tune.hosts import HostPools, cluster_pools, hosts_of, simulated_pools
from rnb.tune.profile import Bench, CpuUse, Profile, ProfileKey
from rnb.tune.profile_plan import plan_profiles
from rnb.tune.sim_records import Arrivals, Background, SimPipeline
from rnb.tune.simulation import simulate
from rnb.tune.space import Budget, TuneSpace
from rnb.tune.tuning_config import read_space
from tests.support.tune_support import REPO, cpu_chain

CPU_EXAMPLE = REPO / "config" / "tune-cpu-example.json"


def on_pools(pipeline: SimPipeline, *pools: int, other_pools: tuple[float, ...] = ()) -> SimPipeline:
    """The pipeline with its groups, in order, on these pools of cores."""
    groups = tuple(dataclasses.replace(g, pool=pool) for g, pool in zip(pipeline.groups, pools))
    return dataclasses.replace(pipeline, groups=groups, other_pools=other_pools)


def bulk(pipeline: SimPipeline, items: int = 3000) -> float:
    return simulate(pipeline, Arrivals("bulk"), items=items, warmup=0).throughput_items_per_s


def test_two_nodes_of_one_host_share_its_cores_as_the_local_engine_s_runners_do() -> None:
    for replicas in ((2, 1), (3, 2), (4, 4)):
        pipeline = on_pools(cpu_chain((6, 1.0, replicas[0]), (3, 1.0, replicas[1]), cores=2), 0, 0)
        assert pipeline.capacity_per_s() == pytest.approx(2000 / 9)
        assert bulk(pipeline) == pytest.approx(2000 / 9, rel=0.01), replicas


def test_two_hosts_each_share_their_own_cores_so_the_slower_step_s_pool_bounds_them() -> None:
    # Three loaders on host 0 take 9 ms a call (2 cores for 3), 333 items/s; two networks on host 1 run free at
    # 667. On one host the same replicas would serve 222.
    pipeline = on_pools(cpu_chain((6, 1.0, 3), (3, 1.0, 2), cores=2), 0, 1, other_pools=(2.0,))
    assert pipeline.cpu_by_pool() == pytest.approx([0.006, 0.003])
    assert pipeline.capacity_per_s() == pytest.approx(1000 / 3) and pipeline.bound_by_cores()
    prediction = simulate(pipeline, Arrivals("bulk"), items=3000, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(1000 / 3, rel=0.01)
    assert prediction.cores_busy == pytest.approx(1.0, abs=0.01)     # the busiest pool: the loaders' host
    # Networks that compute 9 ms per item make host 1 the bound instead: 2 / 9 ms.
    slow_nets = on_pools(cpu_chain((6, 1.0, 3), (9, 1.0, 3), cores=2), 0, 1, other_pools=(2.0,))
    assert bulk(slow_nets) == pytest.approx(2000 / 9, rel=0.01)


def test_ray_s_daemons_per_hop_are_background_on_the_pool_of_each_hop_s_receiving_end() -> None:
    # 0.5 ms of daemon CPU per item and hop; two steps have three hops: into step 0, into step 1, to main.
    daemons = Background(hop_s=0.0005)
    # One host: 6 + 3 + 3 x 0.5 = 10.5 ms per item on 2 cores, 190.5 items/s (222 without the daemons).
    one_host = on_pools(cpu_chain((6, 1.0, 3), (3, 1.0, 2), cores=2, background=daemons), 0, 0)
    assert one_host.capacity_per_s() == pytest.approx(2 / 0.0105)
    assert bulk(one_host) == pytest.approx(2 / 0.0105, rel=0.02)
    # Two hosts: host 0 carries the loaders, the hop into them and the hop to main (7 ms: 285.7 items/s), host 1
    # the networks and the hop into them (3.5 ms: 571).
    two_hosts = on_pools(cpu_chain((6, 1.0, 3), (3, 1.0, 2), cores=2, background=daemons), 0, 1, other_pools=(2.0,))
    assert two_hosts.cpu_by_pool() == pytest.approx([0.007, 0.0035])
    assert two_hosts.capacity_per_s() == pytest.approx(2 / 0.007)
    assert bulk(two_hosts) == pytest.approx(2 / 0.007, rel=0.02)


def node(ip: str, label: str | None, cpus: int = 2) -> NodeInfo:
    return NodeInfo(f"{ip}-{label}", ip, {"node": label} if label else {}, {"CPU": float(cpus)})


def test_the_simulated_cluster_puts_every_label_on_the_driver_s_host() -> None:
    pools = simulated_pools(["nets", "loaders", "nets"])
    assert pools.pool_of("loaders") == pools.pool_of("nets") == pools.pool_of(None) == 0
    assert pools.cores == ()
    assert pools.cpus_of("nets") == simulated_node_cpus(2)


def test_nodes_are_pooled_by_host_and_a_label_that_reaches_two_hosts_joins_them() -> None:
    # A head and a loaders node on the driver's host 10.0.0.1 (2 usable cores measured there), two nets nodes on
    # 10.0.0.2 (8 CPUs each: one host's cores, reported by both), an encoders node on 10.0.0.3 (4 CPUs).
    nodes = [node("10.0.0.1", None), node("10.0.0.1", "loaders"), node("10.0.0.2", "nets", 8),
             node("10.0.0.2", "nets", 8), node("10.0.0.3", "encoders", 4)]
    pools = cluster_pools(nodes, ["loaders", "nets", "encoders"], "10.0.0.1", 2.0)
    assert (pools.pool_of("loaders"), pools.pool_of("nets"), pools.pool_of("encoders")) == (0, 1, 2)
    assert pools.cores == (2.0, 8.0, 4.0)
    assert pools.cpus_of("nets") == 8
    # "gpu=yes" reaches a node of 10.0.0.2 and one of 10.0.0.3: Ray may place its replicas on either, so the two
    # hosts' cores are one pool of 12.
    nodes[3] = dataclasses.replace(nodes[3], labels={"node": "nets", "gpu": "yes"})
    nodes[4] = dataclasses.replace(nodes[4], labels={"node": "encoders", "gpu": "yes"})
    joined = cluster_pools(nodes, ["loaders", "gpu=yes", "encoders"], "10.0.0.1", 2.0)
    assert joined.pool_of("gpu=yes") == joined.pool_of("encoders") == 1
    assert joined.cores == (2.0, 12.0)
    # A group with no label goes anywhere: every host is one pool, the driver's.
    anywhere = cluster_pools(nodes, ["loaders", None], "10.0.0.1", 2.0)
    assert anywhere.pool_of(None) == anywhere.pool_of("loaders") == 0 and anywhere.cores == (14.0,)
    # A host whose nodes report no CPU resource: its cores are not known, so they bound nothing.
    bare = cluster_pools([node("10.0.0.1", None), node("10.0.0.9", "nets", 0)], ["nets"], "10.0.0.1", 2.0)
    assert bare.cores == (2.0, math.inf)


def ray_space(labels: tuple[str, str]) -> TuneSpace:
    document = json.loads(CPU_EXAMPLE.read_text())
    for step, label in zip(document["pipeline"], labels):
        step["queue_groups"][0]["node"] = label
    return read_space(document, str(CPU_EXAMPLE), Budget(cpu_slots=6))


def hand_profiles(space: TuneSpace, bench: Bench, daemons_per_hop_s: float) -> dict[ProfileKey, Profile]:
    """Each step's 6 or 3 ms of CPU per call, plus 0.3 ms of the harness's (tests/tune/test_tune_cpu_search.py)."""
    profiles = {}
    for job in plan_profiles(space, bench, calls=1):
        seconds = job.document["pipeline"][job.position]["ms_per_item"] / 1000.0 + 0.0003
        profiles[job.key] = Profile(job.key, (seconds,), (), (seconds,), 24576, 2**20, None, "hand",
                                    CpuUse(fraction=1.0, per_call_s=seconds, daemons_per_hop_s=daemons_per_hop_s))
    return profiles


def test_a_ray_candidate_computes_on_its_labels_pools_with_its_nodes_thread_share() -> None:
    space = ray_space(("loaders", "nets"))
    simulated = Bench("cpu", "ray", host="test-host", cores=HostCores(2, None), hosts=simulated_pools(["loaders", "nets"]))
    candidate = space.candidate({(0, 0): 3, (1, 0): 2}, {})
    # The simulated cluster on this 2-core host: one pool, 6.3 + 3.3 + 3 x 0.2 ms per item = 10.2 ms, 196 items/s;
    # each simulated node has 1 CPU (2 cores over a head and two nodes), so every runner computes on 1 thread.
    pipeline = Estimator(space, hand_profiles(space, simulated, 0.0002), simulated, 100.0, 99.0).pipeline(candidate)
    assert [g.pool for g in pipeline.groups] == [0, 0] and pipeline.other_pools == ()
    assert [g.threads for g in pipeline.groups] == [1, 1]
    assert pipeline.background.hop_s == pytest.approx(0.0002)
    assert pipeline.capacity_per_s() == pytest.approx(2 / 0.0102)
    # The nets on a host of their own with 4 CPUs: the loaders' host bounds it at 2 / (6.3 + 2 x 0.2) ms = 299;
    # each network's thread share is its node's 4 CPUs over 2 runners.
    two_hosts = dataclasses.replace(simulated, hosts=cluster_pools(
        [node("127.0.0.1", None), node("127.0.0.1", "loaders", 2), node("10.0.0.2", "nets", 4)],
        ["loaders", "nets"], "127.0.0.1", 2.0))
    pipeline = Estimator(space, hand_profiles(space, two_hosts, 0.0002), two_hosts, 100.0, 99.0).pipeline(candidate)
    assert [g.pool for g in pipeline.groups] == [0, 1] and pipeline.other_pools == (4.0,)
    assert [g.threads for g in pipeline.groups] == [1, 2]
    assert pipeline.capacity_per_s() == pytest.approx(2 / 0.0067)
    # The local engine ignores node labels: one host, the affinity's share over all five runners.
    local = dataclasses.replace(simulated, engine="local", hosts=HostPools())
    pipeline = Estimator(space, hand_profiles(space, local, 0.0), local, 100.0, 99.0).pipeline(candidate)
    assert [g.pool for g in pipeline.groups] == [0, 0] and pipeline.capacity_per_s() == pytest.approx(2 / 0.0096)


def test_labels_are_a_simulated_cluster_on_ray_without_an_address_and_nothing_on_the_local_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = ray_space(("loaders", "nets")).config
    assert hosts_of(config, "ray", None, 2.0) == simulated_pools(["loaders", "nets"])
    assert hosts_of(config, "local", None, 2.0) == HostPools()
    unlabelled = read_space(json.loads(CPU_EXAMPLE.read_text()), str(CPU_EXAMPLE), Budget(cpu_slots=6)).config
    assert hosts_of(unlabelled, "ray", None, 2.0) == HostPools()     # a Ray of the job's own, on this host
