"""Every shipped config validates and runs end to end on the CPU; the embedded default runs with no arguments."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rnb import cli
from rnb.pipeline.config import load_config
from tests.support.model_support import episode_range_bytes, tiny_dataset, whole_model_predictions

TUNING = Path("config/tune-example.json")   # lists of choices: rnb-tune's input, refused by benchmark.py
CONFIGS = sorted(path for path in Path("config").glob("*.json") if path != TUNING)
# The R(2+1)D configs, which read episodes: default.json runs below with no arguments; toy.json and the tuner's
# example make synthetic frames.
EPISODE_CONFIGS = [path for path in CONFIGS if path.name != "default.json"
                   and "synthetic" not in json.loads(path.read_text()).get("source", {})]
SMALL = {"num_clips": 2, "clip_length": 4, "size": 32}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_dataset(tmp_path_factory.mktemp("tiny")))


def shrunk(path: Path, tmp_path: Path) -> str:
    """The config with small clips, one replica per group and no warm-up, so the suite stays fast on two cores.

    Steps, groups, queues, segments and selectors stay as shipped.
    """
    document = json.loads(path.read_text())
    for step in document["pipeline"]:
        for key, value in SMALL.items():
            if key in step:
                # 6 clips is above LargeSmallSelector's threshold of 4, so both of its queues see items
                step[key] = {"choices": [1, 6], "weights": [2, 1]} if isinstance(step[key], dict) else value
        if step["model"] == "models.r2p1d.R2P1DRunner":
            step["warmup"] = 0
        for group in step["queue_groups"]:
            group["gpus"] = group["gpus"][:1]
    target = tmp_path / path.name
    target.write_text(json.dumps(document))
    return str(target)


@pytest.mark.parametrize("path", CONFIGS, ids=[path.name for path in CONFIGS])
def test_every_shipped_config_validates_and_says_what_it_is(path):
    config = load_config(str(path))
    assert config.steps
    if path.name != "toy.json":
        assert len(config.raw["description"]) > 40


def test_a_tuning_config_given_to_the_benchmark_says_that_its_lists_are_for_rnb_tune(capsys):
    assert cli.main(["-c", str(TUNING), "--check"]) == 2
    assert capsys.readouterr().err == (
        f"{TUNING}: pipeline[1].batch: expected an integer >= 1, found the list [1, 2, 4, 8]; a list of choices is "
        "for rnb-tune (docs/tuner.md), which tries each and picks one\n")


@pytest.mark.slow
@pytest.mark.parametrize("path", EPISODE_CONFIGS, ids=[path.name for path in EPISODE_CONFIGS])
def test_every_config_runs_on_the_cpu_with_the_target_count(path, dataset, tmp_path, job_log):
    # rnb batches by -b: 10 items in batches of 3 end with a partial batch that only an idle flush hands over
    videos, batch = (10, 3) if path.name == "r2p1d-rnb.json" else (4, 1)
    config = shrunk(path, tmp_path)
    code = cli.main(["-c", config, "--cpu", "-v", str(videos), "-b", str(batch), "-mi", "0",
                     "--dataset", dataset, "--log-dir", str(tmp_path / "logs"), "--warmup", "0"])
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert code == 0, meta["error"]
    assert meta["termination_reason"] == "target reached" and [row["item_id"] for row in rows] == list(range(videos))
    held = set()   # (loader group, replica, episode): what a step-0 replica's byte cache holds
    for row in rows:
        assert row["payload"].startswith(dataset + "#") and row["episode"] == int(row["payload"].rsplit("#", 1)[1])
        # The first item of an episode on a replica fetches the episode's byte range (its own fetch or a prefetch it
        # is the first to use); every later one there fetches nothing and reuses those bytes.
        size, key = episode_range_bytes(dataset, row["episode"]), (row["group0"], row["instance0"], row["episode"])
        assert (row["bytes_fetched"], row["bytes_reused"]) == ((0, size) if key in held else (size, 0)), row
        held.add(key)
        waited = row["fetch_start"] if row["fetch_start"] is not None else row["prefetch_wait_start"]  # fetched ahead
        assert row["frames_decoded"] > 0 and waited <= row["decode_finish"]
    if "segment" in path.name:
        assert [row["prediction"] for row in rows] == whole_model_predictions(config, "dataset", dataset, rows)
    if "rnb" in path.name:
        assert {row["num_clips"] for row in rows} == {1, 6}
    assert any(note.startswith("R2P1DRunner stages 1-5: random weights") for note in meta["notes"])


def test_dataset_flag_and_missing_dataset_are_one_sentence_config_errors(tmp_path, capsys):
    assert cli.main(["-c", "config/toy.json", "--dataset", "x", "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        "command line: --dataset: expected a config whose source is a dataset or videos, "
        "but config/toy.json has a synthetic source")
    missing = str(tmp_path / "none")
    assert cli.main(["-c", "config/r2p1d-whole.json", "--cpu", "--dataset", missing, "--check"]) == 2
    err = capsys.readouterr().err.strip()
    # The root came from the flag, so the flag is named, not the config file that holds another.
    assert err == (f"command line: --dataset: expected a LeRobot v3.0 dataset, found an error: {missing}/meta/info.json: "
                   "file not found")
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_no_arguments_runs_the_default_config_generating_its_missing_dataset(tmp_path, monkeypatch, capsys, job_log):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--log-dir", "logs"]) == 0
    err = capsys.readouterr().err
    assert "benchmark.py: dataset data/synthetic is missing: generating the synthetic dataset there" in err
    assert (tmp_path / "data/synthetic/meta/info.json").exists()
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert meta["config_path"] == "<default>" and meta["finished_items"] == 40 and len(rows) == 40
    assert {row["device0"] for row in rows} == {"cpu"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["r2p1d-whole.json", "split-fetch-decode.json", "r2p1d-nopipeline.json"])
def test_single_gpu_configs_run_on_gpu_0(name, dataset, tmp_path, job_log, benchmark_process):
    """Decoding on NVDEC and CUDA slots, uint8 ones included, on one GPU as shipped (clips shrunk)."""
    done = benchmark_process(["-c", shrunk(Path("config") / name, tmp_path), "-v", "4", "-mi", "0", "--dataset", dataset,
                              "--log-dir", str(tmp_path / "logs"), "--warmup", "0"])
    log = job_log(tmp_path / "logs")
    meta, rows = log.meta, log.rows
    assert done.returncode == 0, meta["error"]
    assert len(rows) == 4 and all(row[f"device{meta['num_steps'] - 1}"] == "cuda:0" for row in rows)
    assert {row["decode_device"] for row in rows} == {"nvdec"}  # 128x128 H.264: NVDEC, no CPU fallback
    assert "Producer process has been terminated" not in done.stderr
