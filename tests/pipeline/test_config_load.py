"""Valid configs load into the typed form the harness relies on; file-level failures are one sentence."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from rnb.pipeline.config import DEFAULT_CONFIG_PATH, ConfigError, PipelineConfig, QueueGroup, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, document: Any, name: str = "c.json") -> str:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


THREE_STEPS = {
    "source": {"synthetic": True},
    "run": {"videos": 40, "mean_interval_ms": 0.5, "warmup": 0, "seed": 7},
    "pipeline": [
        {"model": "tests.support.fixture_models.Frames", "num_shared_tensors": 20, "size": 8, "mode": "step",
         "queue_groups": [{"gpus": [-1, -1], "out_queues": [0, 1], "queue_selector": "tests.support.fixture_models.FirstQueue"}]},
        {"model": "tests.support.fixture_models.Frames", "num_segments": 3, "size": 4,
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0], "mode": "group"},
                          {"gpus": [0, 0], "in_queue": 1, "out_queues": [0]}]},
        {"model": "tests.support.fixture_models.Head", "num_segments": 1,
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "weights": None}]},
    ],
}


def test_three_step_config_loads_with_defaults_and_merged_keywords(tmp_path: Path) -> None:
    file = _write(tmp_path, THREE_STEPS)
    config = load_config(file)
    assert config.path == file
    assert config.raw == THREE_STEPS
    assert config.source == {"synthetic": True}
    assert config.run == {"videos": 40, "mean_interval_ms": 0.5, "warmup": 0, "seed": 7}
    first, middle, last = config.steps
    assert (first.num_shared_tensors, first.num_segments) == (20, 1)
    assert (middle.num_shared_tensors, middle.num_segments) == (10, 3)
    assert (last.num_shared_tensors, last.num_segments) == (0, 1)
    assert first.queue_groups == (
        QueueGroup((-1, -1), None, (0, 1), "tests.support.fixture_models.FirstQueue", {"size": 8, "mode": "step"}),
    )
    assert middle.model_kwargs == {"size": 4}
    assert middle.queue_groups == (
        QueueGroup((-1,), 0, (0,), None, {"size": 4, "mode": "group"}),
        QueueGroup((0, 0), 1, (0,), None, {"size": 4}),
    )
    assert last.queue_groups == (QueueGroup((-1,), 0, (), None, {"weights": None}),)


def test_group_keyword_overrides_step_keyword_without_touching_the_step(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, THREE_STEPS))
    assert config.steps[0].model_kwargs == {"size": 8, "mode": "step"}
    assert config.steps[1].queue_groups[0].model_kwargs["mode"] == "group"
    assert "mode" not in config.steps[1].model_kwargs


def test_loaded_config_is_independent_of_raw_and_pickles(tmp_path: Path) -> None:
    document = {**THREE_STEPS, "pipeline": [dict(THREE_STEPS["pipeline"][0], shape=[1, 2]), *THREE_STEPS["pipeline"][1:]]}
    config = load_config(_write(tmp_path, document))
    config.steps[0].queue_groups[0].model_kwargs["shape"].append(3)
    assert config.raw["pipeline"][0]["shape"] == [1, 2]
    assert pickle.loads(pickle.dumps(config)) == config


def test_single_step_pipeline_is_its_own_final_step() -> None:
    only = {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1]}]}
    config = parse_config({"pipeline": [only]}, "one.json")
    [step] = config.steps
    assert step.queue_groups == (QueueGroup((-1,), None, (), None, {}),)
    assert (step.num_shared_tensors, step.num_segments) == (0, 1)
    assert config.path == "one.json"
    assert (config.source, config.run) == ({}, {})


def test_node_labels_and_engine_are_harness_keys_not_model_keywords() -> None:
    document = {"run": {"engine": "ray"}, "pipeline": [
        {"model": "tests.support.fixture_models.Frames", "size": 4,
         "queue_groups": [{"gpus": [-1], "out_queues": [0], "node": "loaders"}]},
        {"model": "tests.support.fixture_models.Head",
         "queue_groups": [{"gpus": [-1], "in_queue": 0, "node": "ray.io/accelerator-type=H100"}]}]}
    config = parse_config(document, "labels.json")
    assert [step.queue_groups[0].node for step in config.steps] == ["loaders", "ray.io/accelerator-type=H100"]
    assert [dict(step.queue_groups[0].model_kwargs) for step in config.steps] == [{"size": 4}, {}]
    assert config.run == {"engine": "ray"}


def test_old_top_level_video_path_iterator_moves_into_source_first(tmp_path: Path) -> None:
    document = {"video_path_iterator": "tests.support.fixture_models.TwoPaths", "source": {"root": "videos"},
                "pipeline": [{"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1]}]}]}
    config = load_config(_write(tmp_path, document))
    assert list(config.source.items()) == [("video_path_iterator", "tests.support.fixture_models.TwoPaths"), ("root", "videos")]
    assert config.raw == document


def test_shipped_configs_load() -> None:
    toy = load_config("config/toy.json")
    assert [s.model for s in toy.steps] == ["models.toy.SyntheticFrames", "models.toy.TinyConvNet"]
    assert toy.steps[0].queue_groups[0].gpus == (-1,)
    default = load_config(None)
    assert default.path == "<default>"
    assert default.raw == json.loads((REPO / "config" / "default.json").read_text())


def test_default_config_is_found_from_any_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_CONFIG_PATH == REPO / "rnb" / "pipeline" / "default.json" == (REPO / "config" / "default.json").resolve()
    assert load_config(None).raw == json.loads(DEFAULT_CONFIG_PATH.read_text())


def _latin1_file(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.json"
    path.write_bytes('{"description": "caf\u00e9"}'.encode("latin-1"))
    return path


@pytest.mark.parametrize("make, expected", [
    (lambda tmp_path: tmp_path / "nope.json",
     "expected a readable UTF-8 JSON file, found an error: No such file or directory"),
    (lambda tmp_path: tmp_path, "expected a regular JSON file, found a directory"),
    (_latin1_file, "expected a readable UTF-8 JSON file, found an error: 'utf-8' codec can't decode byte 0xe9 in "
                   "position 20: invalid continuation byte"),
], ids=["missing", "directory", "not_utf8"])
def test_a_config_file_that_cannot_be_read_is_one_sentence_about_the_file(tmp_path: Path, make, expected: str) -> None:
    file = str(make(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    assert str(caught.value) == f"{file}: (file): {expected}"


def test_model_module_that_fails_at_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exploding_model.py").write_text('raise RuntimeError("no weights here\\nsecond line")\n')
    (tmp_path / "needs_missing.py").write_text("import not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    step = {"queue_groups": [{"gpus": [-1]}]}
    with pytest.raises(ConfigError) as caught:
        parse_config({"pipeline": [dict(step, model="exploding_model.Net")]}, "x.json")
    assert str(caught.value) == (
        'x.json: pipeline[0].model: expected module "exploding_model" to import, found RuntimeError: no weights here'
    )
    with pytest.raises(ConfigError) as caught:
        parse_config({"pipeline": [dict(step, model="needs_missing.Net")]}, "x.json")
    assert caught.value.expected == (
        'expected module "needs_missing" to import, found it needs the missing module "not_installed_anywhere"'
    )


def test_every_run_key_accepts_its_boundary_value() -> None:
    run = {"videos": 1, "mean_interval_ms": 0, "batch_size": 1, "queue_size": 2**31 - 1, "concurrency": 1, "warmup": 0, "seed": 0}
    step = {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1]}]}
    config = parse_config({"run": run, "pipeline": [step]}, "r.json")
    assert config.run == run
    assert isinstance(config, PipelineConfig)


def test_errors_echo_the_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("sub")
    _write(tmp_path / "sub", {"pipeline": []}, "empty.json")
    with pytest.raises(ConfigError) as caught:
        load_config("sub/empty.json")
    assert str(caught.value) == "sub/empty.json: pipeline: expected a non-empty list of steps, found the list []"
