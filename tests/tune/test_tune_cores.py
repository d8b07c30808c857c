"""The estimator's model of the host's cores against cases worked out by hand (no processes, no clocks)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rnb.tune.cores import HostCores, host_cores, quota_cores, shares
from rnb.tune.sim_records import Arrivals, Background, Service, SimPipeline
from rnb.tune.simulation import simulate
from tests.support.tune_support import cpu_chain


def bulk(pipeline: SimPipeline, items: int = 3000) -> float:
    return simulate(pipeline, Arrivals("bulk"), items=items, warmup=0).throughput_items_per_s


def test_two_cpu_bound_steps_on_two_cores_serve_at_most_222_items_per_s_whatever_the_replicas() -> None:
    # 6 + 3 ms of CPU per item on 2 cores: 2 / 0.009 = 222.2 items/s. One replica each needs 1.5 cores and
    # serves the loader's 166.7; from (2, 1) on the cores are the bound.
    assert bulk(cpu_chain((6, 1.0, 1), (3, 1.0, 1), cores=2)) == pytest.approx(1000 / 6, rel=0.002)
    for replicas in ((2, 1), (3, 2), (4, 4), (6, 3)):
        pipeline = cpu_chain((6, 1.0, replicas[0]), (3, 1.0, replicas[1]), cores=2)
        assert pipeline.capacity_per_s() == pytest.approx(2000 / 9)
        assert bulk(pipeline) == pytest.approx(2000 / 9, rel=0.01), replicas
    # Not modelled (cores 0), four loaders would be predicted at the second step's 333 items/s.
    assert bulk(cpu_chain((6, 1.0, 4), (3, 1.0, 1), cores=0)) == pytest.approx(1000 / 3, rel=0.002)


def test_a_sleeping_step_takes_no_core_from_a_cpu_bound_one() -> None:
    # Three loaders of 6 ms of CPU share 2 cores: 9 ms a call each, 333 items/s. The sleeping step's two
    # replicas of 5 ms could serve 400 and hold no core.
    pipeline = cpu_chain((6, 1.0, 3), (5, 0.0, 2), cores=2)
    assert pipeline.capacity_per_s() == pytest.approx(1000 / 3)
    prediction = simulate(pipeline, Arrivals("bulk"), items=3000, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(1000 / 3, rel=0.01)
    assert prediction.cores_busy == pytest.approx(1.0, abs=0.01)
    assert prediction.busy["step 0"] == pytest.approx(1.0, abs=0.01)          # stretched to 9 ms, not 6 ms of 9
    # Six sleeping replicas of 8 ms each on 2 cores: 750 items/s, as if the cores were not there.
    assert bulk(cpu_chain((8, 0.0, 6), cores=2)) == pytest.approx(750.0, rel=0.01)


def test_a_step_that_computes_part_of_its_call_stretches_only_that_part() -> None:
    # 10 ms calls of which 4 ms compute, on 1 core: the core allows 250 items/s. Four replicas of exactly equal
    # calls run in step: 4 x 4 ms shared (16 ms), then 6 ms asleep together, 4 items per 22 ms.
    assert bulk(cpu_chain((10, 0.4, 4), cores=1)) == pytest.approx(4000 / 22, rel=0.001)
    # Calls of 6 or 14 ms fall out of step; eight replicas then keep the core busy and serve close to 250.
    varied = cpu_chain((10, 0.4, 8), cores=1)
    varied = dataclasses.replace(varied, groups=(dataclasses.replace(varied.groups[0], service=Service((0.006, 0.014))),))
    assert bulk(varied, items=6000) == pytest.approx(250.0, rel=0.01)
    # One replica alone: 100 items/s, the core busy 40%.
    alone = simulate(cpu_chain((10, 0.4, 1), cores=1), Arrivals("bulk"), items=1000, warmup=0)
    assert alone.throughput_items_per_s == pytest.approx(100.0, rel=0.005)
    assert alone.cores_busy == pytest.approx(0.4, abs=0.01)


def test_cpu_spent_outside_the_runners_is_background_on_the_same_cores() -> None:
    # Two loaders of 4 ms of CPU on 2 cores serve 500 items/s; 1.8 ms of CPU per item elsewhere (a Ray hop's
    # cost, the client's and main's) leaves them 2 / (0.004 + 0.0018) = 344.8 items/s.
    hop = Background(client_s=0.0008, main_s=0.001)
    assert bulk(cpu_chain((4, 1.0, 2), cores=2)) == pytest.approx(500.0, rel=0.01)
    pipeline = cpu_chain((4, 1.0, 2), cores=2, background=hop)
    assert pipeline.capacity_per_s() == pytest.approx(2 / 0.0058)
    assert bulk(pipeline) == pytest.approx(2 / 0.0058, rel=0.02)


def test_a_candidate_s_threads_set_how_fast_its_cpu_work_runs() -> None:
    # Profiled on one thread, 6 ms of CPU; in a candidate that gives the one replica both cores: 3 ms a call.
    one = cpu_chain((6, 1.0, 1), cores=2)
    two = SimPipeline(tuple(dataclasses.replace(g, threads=2) for g in one.groups), 1, 2.0)
    assert bulk(one) == pytest.approx(1000 / 6, rel=0.005)
    assert bulk(two) == pytest.approx(1000 / 3, rel=0.005)


def test_processor_sharing_gives_equal_shares_and_leaves_what_a_task_cannot_use_to_the_others() -> None:
    assert shares([1, 1, 1], 2.0) == pytest.approx([2 / 3] * 3)
    assert shares([1, 4], 3.0) == pytest.approx([1.0, 2.0])
    assert shares([1, 1], 4.0) == pytest.approx([1.0, 1.0])


def test_the_host_s_usable_cores_are_the_fewer_of_its_affinity_and_its_cgroup_quota(tmp_path: Path) -> None:
    assert quota_cores("max 100000\n") is None
    assert quota_cores("150000 100000\n") == pytest.approx(1.5)
    v2 = tmp_path / "cpu.max"
    v2.write_text("50000 100000\n")
    found = host_cores(v2, tmp_path / "absent")
    assert found.quota == pytest.approx(0.5) and found.usable == pytest.approx(0.5)
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert host_cores(tmp_path / "absent", v1).quota is None
    assert HostCores(8, 2.5).usable == 2.5 and HostCores(2, None).usable == 2.0
    assert HostCores(2, None).describe() == "2 cores"
