"""The Ray engine on a real Ray cluster of simulated nodes on 127.0.0.1 (tests/support/ray_testing.py).

Jobs run as `benchmark.py --engine ray --ray-address ...` processes against
the module's cluster: items finish exactly once, runners land on the nodes
their group's label names, outputs equal the local engine's item for item,
failures end the job with exit 1 within the stop bound and leave no actor,
and what the cluster cannot host is exit 2 in one sentence.  The cluster's
processes start under CUDA_DEVICE_ORDER=FASTEST_FIRST, so a runner actor or
GPU check that sees PCI_BUS_ID was given it by the driver.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import ray
import torch

from rnb import cli
from rnb.engines.ray import gpu_bundles
from rnb.engines.ray.cluster import DAEMON_SAMPLES, NAMESPACE, JobRay
from rnb.engines.ray.placement import seat_runners
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.plan import plan_runners
from rnb.tune.hosts import HostPools
from tests.support.model_support import tiny_dataset
from tests.support.ray_testing import device_order_seen

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
STOP_BOUND_S = 10.0   # the bound from a failure to the job's end
JOB_TIMEOUT_S = 240   # a hang guard for one job on a loaded two-core machine


def toy_config(tmp_path: Path, **faults: Any) -> str:
    """Frames on the loaders (two replicas), a network on the nets, a digest of its logits on any node."""
    document = {"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyntheticFrames", "num_shared_tensors": 3, "clips": 2, "frames": 4, "height": 16,
         "width": 16, "queue_groups": [{"gpus": [-1, -1], "out_queues": [0], "node": "loaders"}]},
        {"model": "models.toy.TinyConvNet", "num_shared_tensors": 3, "clips": 2, "threads": 1, **faults,
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0], "node": "nets"}]},
        {"model": "tests.support.fixture_models.Digest", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
    return write(tmp_path / "toy.json", document)


def small_config(tmp_path: Path, **faults: Any) -> str:
    """The toy pipeline cut to what a failure needs (three actors start faster than five): frames, then the network."""
    document = json.loads(Path(toy_config(tmp_path, **faults)).read_text())
    del document["pipeline"][2]
    document["pipeline"][0]["queue_groups"][0]["gpus"] = [-1]
    network = document["pipeline"][1]
    del network["num_shared_tensors"], network["queue_groups"][0]["out_queues"]
    return write(tmp_path / "small.json", document)


def write(path: Path, document: dict) -> str:
    path.write_text(json.dumps(document))
    return str(path)


def benchmark(args: list[str], **popen: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "benchmark.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def run_on_ray(cluster: Any, config: str, log_dir: Path, *args: str) -> tuple[int, str]:
    done = benchmark(["-c", config, "--engine", "ray", "--ray-address", cluster.address, "-mi", "0",
                      "--warmup", "0", "--log-dir", str(log_dir), *args])
    _, err = done.communicate(timeout=JOB_TIMEOUT_S)
    return done.returncode, err


def labels_of(meta: dict) -> dict[str, str | None]:
    """The node label of each process that its group pins (the client and unpinned runners go where Ray puts them)."""
    nodes = meta["engine"]["nodes"]
    labels = {p["name"]: nodes[p["node"]]["labels"].get("node") for p in meta["processes"]}
    return {name: label for name, label in labels.items() if name.startswith(("step0", "step1"))}


def test_the_shipped_two_node_config_runs_here_on_a_simulated_cluster_and_predicts_as_the_local_engine_does(
        tmp_path, job_log):
    """config/ray-two-nodes.json with a digest step after its network: the job starts and stops its own cluster.

    First in the module, before the module's cluster starts, so that cluster's daemons do not compete with it."""
    dataset = tiny_dataset(tmp_path / "tiny")
    document = json.loads((REPO / "config" / "ray-two-nodes.json").read_text())
    network = document["pipeline"][1]
    network.update(num_shared_tensors=2, threads=1)
    network["queue_groups"][0]["out_queues"] = [0]
    document["pipeline"].append({"model": "tests.support.fixture_models.Digest", "queue_groups": [{"gpus": [-1], "in_queue": 0}]})
    config = write(tmp_path / "episodes.json", document)
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    job = benchmark(["-c", config, "--engine", "ray", "-v", "6", "--dataset", str(dataset),
                     "--log-dir", str(tmp_path / "ray")], env=env)
    _, err = job.communicate(timeout=JOB_TIMEOUT_S)
    assert job.returncode == 0, err
    assert cli.main(["-c", config, "-v", "6", "--dataset", str(dataset), "--log-dir", str(tmp_path / "local")]) == 0
    on_ray, local = job_log(tmp_path / "ray"), job_log(tmp_path / "local")
    assert on_ray.meta["engine"]["cluster"] == "simulated"
    assert [row["item_id"] for row in on_ray.rows] == list(range(6))
    # (bytes_fetched is not compared: it depends on which replica's cache an item met)
    for key in ("episode", "digest", "frames_decoded"):
        assert [row[key] for row in on_ray.rows] == [row[key] for row in local.rows], key
    assert labels_of(on_ray.meta) == {"step0-g0-r0": "loaders", "step0-g0-r1": "loaders", "step1-g0-r0": "nets"}
    assert [p["pid"] for p in on_ray.meta["processes"] if Path(f"/proc/{p['pid']}").exists()] == []


def test_toy_pipeline_across_labelled_nodes_finishes_every_item_once_as_the_local_engine_does(
        ray_cluster, tmp_path, job_log):
    config = toy_config(tmp_path)
    code, err = run_on_ray(ray_cluster, config, tmp_path / "ray", "-v", "16")
    ray_log = job_log(tmp_path / "ray")
    assert code == 0, err
    assert cli.main(["-c", config, "-v", "16", "-mi", "0", "--warmup", "0", "--log-dir", str(tmp_path / "local")]) == 0
    local_log = job_log(tmp_path / "local")
    assert [row["item_id"] for row in ray_log.rows] == list(range(16))
    assert [row["digest"] for row in ray_log.rows] == [row["digest"] for row in local_log.rows]
    meta = ray_log.meta
    assert (meta["termination_reason"], meta["finished_items"], meta["engine"]["cluster"]) == ("target reached", 16, "given")
    assert labels_of(meta) == {"step0-g0-r0": "loaders", "step0-g0-r1": "loaders", "step1-g0-r0": "nets"}
    assert {row["device0"] for row in ray_log.rows} == {"cpu"}
    # The final step's actor numbers GPUs as NVML does: its node started it under FASTEST_FIRST (tests/support/ray_testing.py).
    assert {row["cuda_device_order"] for row in ray_log.rows} == {"PCI_BUS_ID"}
    for node in meta["engine"]["nodes"].values():
        assert node["round_trip_s"] > 0 and abs(node["offset_s"]) <= node["round_trip_s"]
    assert all(p["status"] == "ok" for p in meta["processes"])
    # The client sends requests, never tensors: on Ray its process never loads torch (about 2 CPU-s), so it reports no
    # torch threads, where every runner and the local engine's client (forked from a server that has torch) do.
    threads = {p["name"]: p["intra_op_threads"] for p in meta["processes"]}
    assert threads.pop("client") is None and None not in threads.values(), threads
    assert {p["name"]: p["intra_op_threads"] is None for p in local_log.meta["processes"]}["client"] is False
    assert ray_cluster.alive_actors(meta["job_id"]) == []
    # The cluster's own processes on this machine are sampled beside the actors: its three raylets and the GCS.
    sampled = set(pq.read_table(ray_log.dir / "samples.parquet").column("process").to_pylist())
    daemons = sorted(name.split(":")[1] for name in sampled if name and name.startswith(DAEMON_SAMPLES))
    assert daemons.count("raylet") == 3 and "gcs_server" in daemons, sorted(sampled - {None})


def test_the_leftover_check_lists_a_job_s_live_actor_and_not_once_it_is_killed(ray_cluster) -> None:
    """Every Ray test ends on `alive_actors(job) == []`: it must be able to see an actor that is left."""
    @ray.remote(num_cpus=0)
    class Idle:
        def ping(self) -> int:
            return 1

    job = "leftover-check"
    left = Idle.options(name=f"{job}/step0-g0-r0", namespace=NAMESPACE).remote()
    elsewhere = Idle.options(name=f"{job}/other-namespace").remote()   # the test process's namespace, not the jobs'
    assert ray.get([left.ping.remote(), elsewhere.ping.remote()], timeout=JOB_TIMEOUT_S) == [1, 1]
    assert ray_cluster.alive_actors(job) == [f"{job}/step0-g0-r0"]
    for actor in (left, elsewhere):
        ray.kill(actor)
    deadline = time.time() + 60
    while ray_cluster.alive_actors(job) and time.time() < deadline:
        time.sleep(0.2)
    assert ray_cluster.alive_actors(job) == []


def test_the_tuner_finds_every_node_of_the_cluster_on_this_host_one_pool_of_its_cores(ray_cluster) -> None:
    # In a process of its own, as rnb-tune asks (this one is connected to the cluster already).
    ask = ("import sys; from rnb.pipeline.config import parse_config; from rnb.tune.hosts import hosts_of; "
           "config = parse_config({'source': {'synthetic': True}, 'pipeline': ["
           "{'model': 'models.toy.SyntheticFrames', 'queue_groups': [{'gpus': [-1], 'out_queues': [0], "
           "'node': 'loaders'}]}, {'model': 'models.toy.TinyConvNet', 'queue_groups': [{'gpus': [-1], "
           "'in_queue': 0, 'node': 'nets'}]}]}, 'ask.json'); print(hosts_of(config, 'ray', sys.argv[1], 2.0))")
    done = subprocess.run([sys.executable, "-c", ask, ray_cluster.address], cwd=REPO, capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(HostPools((("loaders", 0), ("nets", 0)), (("loaders", 1), ("nets", 1)), (2.0,)))


@pytest.mark.gpu
def test_gpu_runners_sharing_one_gpu_entry_share_their_nodes_gpu_checked_there(ray_cluster, tmp_path, job_log):
    """The network and the digest both name GPU 0 on the nets node: one bundle, one NVML check, half a GPU each."""
    document = json.loads(Path(toy_config(tmp_path)).read_text())
    document["pipeline"][1]["queue_groups"][0]["gpus"] = [0]
    document["pipeline"][2]["queue_groups"][0].update(gpus=[0], node="nets")
    code, err = run_on_ray(ray_cluster, write(tmp_path / "gpu.json", document), tmp_path / "logs", "-v", "8")
    assert code == 0, err
    log = job_log(tmp_path / "logs")
    assert [row["item_id"] for row in log.rows] == list(range(8))
    assert {(row["device1"], row["device2"]) for row in log.rows} == {("cuda:0", "cuda:0")}
    on_gpu = [p for p in log.meta["processes"] if p["name"] in ("step1-g0-r0", "step2-g0-r0")]
    assert [(p["gpu_ids"], log.meta["engine"]["nodes"][p["node"]]["labels"]["node"]) for p in on_gpu] == [
        (["0"], "nets"), (["0"], "nets")]
    assert len(log.meta["gpus"]) == 1 and ray_cluster.alive_actors(log.meta["job_id"]) == []


def test_the_gpu_check_task_numbers_the_gpus_as_nvml_does(ray_cluster, tmp_path, monkeypatch):
    """The driver's own reservation and check of a GPU bundle on the nets node, with the check swapped for one that
    says what CUDA_DEVICE_ORDER its task sees: the cluster's processes start with FASTEST_FIRST."""
    monkeypatch.setattr(gpu_bundles, "_check_gpu_here", device_order_seen)
    document = json.loads(Path(small_config(tmp_path)).read_text())
    document["pipeline"][1]["queue_groups"][0]["gpus"] = [0]
    config = parse_config(document, "gpu.json")
    cluster = JobRay(ray_cluster.address)   # not entered: the test process is connected already
    seats, bundles = seat_runners(config, plan_runners(config, 1), cluster.nodes())
    with pytest.raises(ConfigError) as caught:
        gpu_bundles.reserve_gpus(config, seats, bundles, allow_busy=False)   # which removes its placement group
    assert str(caught.value) == "gpu.json: pipeline[1].queue_groups[0].gpus[0]: CUDA_DEVICE_ORDER=PCI_BUS_ID"


@pytest.mark.parametrize("faults, error", [
    ({"fail_at_item": 5}, "RuntimeError: TinyConvNet failed on item 5 on purpose (fail_at_item)"),
    ({"exit_at_item": 5}, "its Ray actor died (ActorDiedError: "),
    ({"fail_at_init": True}, "RuntimeError: TinyConvNet failed at init on purpose (fail_at_init)"),
], ids=["item", "os_exit", "init"])
def test_a_failing_actor_ends_the_job_with_exit_1_and_leaves_no_actor(ray_cluster, tmp_path, job_log, faults, error):
    code, err = run_on_ray(ray_cluster, small_config(tmp_path, **faults), tmp_path / "logs", "-v", "40")
    returned = time.time()
    assert code == 1, err
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert (meta["termination_reason"], meta["failed_process"]) == ("process failed", "step1-g0-r0")
    assert meta["error"].startswith(f"process step1-g0-r0 failed: {error}")
    assert f"benchmark.py: {meta['error']}" in err and "Traceback" not in err
    assert returned - meta["end_time"] < STOP_BOUND_S
    assert ray_cluster.alive_actors(meta["job_id"]) == []
    assert len(log.rows) == meta["finished_items"] < 40 and 5 not in [row["item_id"] for row in log.rows]
    if "fail_at_init" in faults:
        assert meta["start_time"] is None


def started_job(process: subprocess.Popen) -> str:
    """Read the job's stderr up to its start line; the job id."""
    seen = []
    for line in process.stderr:
        found = re.search(r"started (\S+) on Ray", line)
        if found:
            return found.group(1)
        seen.append(line)
    raise AssertionError(f"the job ended before it started (exit code {process.wait()}): {''.join(seen[-30:])}")


def long_job(cluster: Any, config: str, log_dir: Path) -> tuple[subprocess.Popen, str]:
    """A job of far more Poisson requests than a test waits for, once it has started; and its id."""
    job = benchmark(["-c", config, "--engine", "ray", "--ray-address", cluster.address, "-v", "100000",
                     "-mi", "5", "--log-dir", str(log_dir)])
    return job, started_job(job)


def ended(job: subprocess.Popen) -> tuple[int, str]:
    err = job.stderr.read()
    return job.wait(timeout=JOB_TIMEOUT_S), err


@pytest.mark.parametrize("how", ["kill_actor", "lose_node"])
def test_an_actor_killed_from_outside_or_its_node_lost_ends_the_job_with_exit_1(ray_cluster, tmp_path, job_log, how):
    document = json.loads(Path(small_config(tmp_path)).read_text())
    if how == "lose_node":
        doomed = ray_cluster.add_node("doomed").node_id
        document["pipeline"][1]["queue_groups"][0]["node"] = "doomed"
    job, name = long_job(ray_cluster, write(tmp_path / "long.json", document), tmp_path / "logs")
    if how == "lose_node":
        ray_cluster.remove_node("doomed")
    else:
        ray.kill(ray.get_actor(f"{name}/step1-g0-r0", namespace="rnb"))
    struck = time.time()
    code, err = ended(job)
    assert code == 1, err
    meta = job_log(tmp_path / "logs").meta
    assert meta["end_time"] - struck < STOP_BOUND_S
    assert meta["failed_process"] == "step1-g0-r0"
    if how == "lose_node":  # one short sentence naming the node and who died with it
        assert meta["error"] == "node 127.0.0.1 (node=doomed) was lost: runner step1-g0-r0 died with it", meta["error"]
    else:
        assert meta["error"].startswith("process step1-g0-r0 failed: its Ray actor died (") and "\n" not in meta["error"]
        assert len(meta["error"]) < 250, meta["error"]
    assert ray_cluster.alive_actors(name) == []
    if how == "lose_node":
        ray_cluster.wait_until_known_dead(doomed)


@pytest.mark.parametrize("stop, code, reason", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
                         ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_job_with_its_exit_code_and_keeps_what_finished(ray_cluster, tmp_path, job_log,
                                                                                   stop, code, reason):
    job, name = long_job(ray_cluster, small_config(tmp_path), tmp_path / "logs")
    time.sleep(2)
    job.send_signal(stop)
    returned, err = ended(job)
    assert returned == code, err
    log = job_log(tmp_path / "logs")
    assert log.meta["termination_reason"] == reason and len(log.rows) == log.meta["finished_items"] > 0
    assert ray_cluster.alive_actors(name) == []


@pytest.mark.parametrize("change, sentence", [
    ({"node": "nowhere"}, "pipeline[1].queue_groups[0].node: expected a label (node=nowhere) or custom resource of "
                          "a node of the Ray cluster, found no node with it (its nodes' labels: node=loaders, node=nets)"),
    ({"gpus": [0, 1]}, 'pipeline[1].queue_groups[0].gpus[1]: expected at most 1 distinct GPUs on the Ray nodes "nets" '
                       "selects (they have 1), found the config asks for 2"),
    pytest.param({"gpus": [0, 0]}, "pipeline[1].queue_groups[0].gpus[0]: expected a usable NVIDIA GPU 0, found no "
                                   "usable NVIDIA GPU or driver on this machine",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the nets node's GPU is not real only here")),
], ids=["unknown_label", "too_many_gpus", "gpu_checked_on_its_node"])
def test_what_the_cluster_cannot_host_is_exit_2_in_one_sentence(ray_cluster, tmp_path, change, sentence):
    document = json.loads(Path(small_config(tmp_path)).read_text())
    document["pipeline"][1]["queue_groups"][0].update(change)
    config = write(tmp_path / "bad.json", document)
    code, err = run_on_ray(ray_cluster, config, tmp_path / "logs", "-v", "4")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"{config}: {sentence}")
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


@pytest.mark.parametrize("k", [2, 20])
def test_a_final_step_that_hangs_after_k_items_on_ray_stalls_and_leaves_exactly_k_rows(ray_cluster, tmp_path, job_log, k):
    document = json.loads(Path(small_config(tmp_path)).read_text())
    document["pipeline"][1].update(model="bench.fault_models.Hangs", inner="models.toy.TinyConvNet", at_item=k)
    job = benchmark(["-c", write(tmp_path / "hangs.json", document), "--engine", "ray", "--ray-address",
                     ray_cluster.address, "-v", "200", "-mi", "5", "--warmup", "0", "--stall-s", "3",
                     "--log-dir", str(tmp_path / "logs")])
    _, err = job.communicate(timeout=JOB_TIMEOUT_S)
    assert job.returncode == 1, err
    log = job_log(tmp_path / "logs")
    meta = log.meta
    assert [row["item_id"] for row in log.rows] == list(range(k)) and meta["counted_items"] == k
    assert (meta["termination_reason"], meta["failed_process"]) == ("stalled", "step1-g0-r0")
    assert re.match(rf"step 1 replica 0 \(pid \d+, on 127\.0\.0\.1, cpu\) has held item {k} for [\d.]+ s with no item "
                    r"finished since, and its process has not computed since the job started; the Python stacks of every "
                    rf"process are in {re.escape(str(log.dir))}/stacks/ "
                    r"\(step1-g0-r0\.txt is its own\)$", meta["error"]), meta["error"]
    assert "in hang" in (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    assert f"benchmark.py: {meta['error']}" in err and "Traceback" not in err
    assert ray_cluster.alive_actors(meta["job_id"]) == []


def test_max_duration_ends_a_ray_job_at_its_measured_seconds_keeping_all_it_measured(ray_cluster, tmp_path, job_log):
    code, err = run_on_ray(ray_cluster, small_config(tmp_path), tmp_path / "logs", "-v", "1000000", "-mi", "5",
                           "--max-duration", "3")
    assert code == 0, err
    meta = job_log(tmp_path / "logs").meta
    assert meta["termination_reason"] == "max duration" and 3.0 <= meta["elapsed_s"] < 4.0
    assert meta["finished_items"] == meta["counted_items"] > 0
    assert ray_cluster.alive_actors(meta["job_id"]) == []


def test_a_runner_that_hangs_while_loading_its_model_on_ray_ends_start_up_as_stalled(ray_cluster, tmp_path, job_log):
    document = json.loads(Path(small_config(tmp_path)).read_text())
    document["pipeline"][1].update(model="bench.fault_models.Hangs", inner="models.toy.TinyConvNet", at_init=True)
    code, err = run_on_ray(ray_cluster, write(tmp_path / "hangs.json", document), tmp_path / "logs", "-v", "20",
                           "--stall-s", "3")
    assert code == 1, err
    log = job_log(tmp_path / "logs")
    assert (log.meta["termination_reason"], log.meta["start_time"], log.rows) == ("stalled", None, [])
    assert log.meta["error"].startswith("step 1 replica 0 (pid ") and "has not become ready" in log.meta["error"]
    assert "in __init__" in (log.dir / "stacks" / "step1-g0-r0.txt").read_text()
    assert ray_cluster.alive_actors(log.meta["job_id"]) == []


def test_a_ray_stream_job_logs_every_frame_offered_and_says_who_missed_the_dropped(ray_cluster, tmp_path, job_log):
    """2 streams at 30 fps into a 20 ms step under drop: the client actor's Offered reaches the log through the
    JobControl, so offered.parquet holds every frame with its fate, as on the local engine."""
    done = benchmark(["-c", "config/streams-example.json", "--engine", "ray", "--ray-address", ray_cluster.address,
                      "--streams", "2", "--stream-policy", "drop", "-v", "90", "--warmup", "0", "--log-dir",
                      str(tmp_path / "logs")])
    out, err = done.communicate(timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, err
    log = job_log(tmp_path / "logs")
    streams = log.meta["streams"]
    offered = pq.read_table(log.dir / "offered.parquet").to_pylist()
    assert [row["item_id"] for row in offered] == list(range(90))
    assert sorted((row["stream"], row["frame"]) for row in offered) == [(s, f) for s in (0, 1) for f in range(45)]
    assert {row["item_id"] for row in offered if row["fate"] == "processed"} == {row["item_id"] for row in log.rows}
    assert sum(row["fate"] == "dropped" for row in offered) == streams["dropped"] > 0
    assert streams["offered"] == 90 == streams["processed"] + streams["dropped"]
    (bottleneck,) = [line for line in out.splitlines() if line.startswith("bottleneck: ")]
    assert "served the offered load" not in bottleneck and f"{streams['dropped']} dropped" in bottleneck
