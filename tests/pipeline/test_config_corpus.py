"""The broken-config corpus: every file must fail validation with its own JSON path.

Each case names the JSON path the error must point at and a piece of the
sentence that says what was wrong, so a message that points at the wrong key
or explains the wrong problem fails the test.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rnb import cli
from rnb.pipeline.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "pipeline" / "broken_configs"

CASES: dict[str, tuple[str, str]] = {
    "deeply_nested": ("(top level)", "expected JSON nested at most 64 levels deep, found deeper nesting"),
    "description_not_string": ("description", 'expected a string, found the list ["toy"]'),
    "duplicate_key": ('key "gpus"', "expected each key at most once per object, found it twice"),
    "empty_file": ("line 1 column 1", "expected valid JSON, found a syntax error (Expecting value)"),
    "empty_gpus": ("pipeline[0].queue_groups[0].gpus", "non-empty list of GPU indices (-1 = CPU), found the list []"),
    "empty_out_queues": ("pipeline[0].queue_groups[0].out_queues", "non-empty list of queue indices"),
    "empty_pipeline": ("pipeline", "expected a non-empty list of steps, found the list []"),
    "empty_queue_groups": ("pipeline[1].queue_groups", "expected a non-empty list of queue groups, found the list []"),
    "gpu_below_minus_one": ("pipeline[1].queue_groups[0].gpus[1]", "expected an integer >= -1, found -2"),
    "gpu_boolean": ("pipeline[0].queue_groups[0].gpus[0]", "expected an integer >= -1, found true"),
    "gpu_float": ("pipeline[1].queue_groups[0].gpus[0]", "expected an integer >= -1, found 0.0"),
    "gpu_string": ("pipeline[0].queue_groups[0].gpus[2]", 'expected an integer >= -1, found the string "0"'),
    "gpus_not_list": ("pipeline[0].queue_groups[0].gpus", "non-empty list of GPU indices (-1 = CPU), found 0"),
    "group_not_object": ("pipeline[0].queue_groups[0]", "expected an object, found the list [-1]"),
    "in_queue_mismatch": ("pipeline[1].queue_groups[0].in_queue", "expected one of the out_queues of pipeline[0] {0}, found 3"),
    "in_queue_negative": ("pipeline[1].queue_groups[0].in_queue", "expected an integer >= 0, found -1"),
    "in_queue_on_step0": ("pipeline[0].queue_groups[0].in_queue", "expected no in_queue on step 0"),
    "in_queue_string": ("pipeline[1].queue_groups[0].in_queue", 'expected an integer >= 0, found the string "0"'),
    "invalid_json": ("line 3 column 53", "expected valid JSON, found a syntax error (Expecting property name"),
    "missing_gpus": ("pipeline[1].queue_groups[0].gpus", "found no such key"),
    "missing_in_queue": ("pipeline[1].queue_groups[0].in_queue", "out_queues of pipeline[0], found no such key"),
    "missing_model": ("pipeline[0].model", "expected a dotted class path of the step's model, found no such key"),
    "missing_out_queues": ("pipeline[0].queue_groups[0].out_queues", "found no such key"),
    "missing_pipeline": ("pipeline", "expected a non-empty list of steps, found no such key"),
    "missing_queue_groups": ("pipeline[0].queue_groups", "expected a non-empty list of queue groups, found no such key"),
    "model_keyword_missing": ("pipeline[1].queue_groups[1].width",
                              "expected the keyword width, which tests.support.fixture_models.NeedsWidth requires"),
    "model_keyword_typo": ("pipeline[0].clip", 'takes (clips, frames, height, width), found an unknown keyword '
                                               '(did you mean "clips"?)'),
    "group_keyword_typo": ("pipeline[1].queue_groups[0].clases", 'found an unknown keyword (did you mean "classes"?)'),
    "model_missing_class": ("pipeline[1].model", 'class "NoSuchClass" in module "tests.support.fixture_models", found nothing'),
    "model_missing_module": ("pipeline[1].model", 'found no module named "models.no_such_module"'),
    "model_no_dot": ("pipeline[0].model",
                     'expected a dotted class path such as "package.module.Class", found the string "Frames"'),
    "model_not_class": ("pipeline[0].model", 'expected a class "NOT_A_CLASS"'),
    "model_not_string": ("pipeline[1].model", "expected a dotted class path"),
    "model_without_output_shape": ("pipeline[1].model", "to have a callable output_shape, found none"),
    "node_not_string": ("pipeline[0].queue_groups[0].node", 'expected a string, found the list ["loaders"]'),
    "node_with_space": ("pipeline[1].queue_groups[0].node", 'expected a node label such as "loaders" or "key=value"'),
    "nan_interval": ("value NaN", "expected a finite JSON number, found NaN"),
    "num_segments_on_final": ("pipeline[1].num_segments", "expected 1 on the final step"),
    "num_segments_string": ("pipeline[0].num_segments", 'expected an integer >= 1, found the string "2"'),
    "num_segments_zero": ("pipeline[0].num_segments", "expected an integer >= 1, found 0"),
    "num_shared_tensors_float": ("pipeline[0].num_shared_tensors", "expected an integer >= 1, found 2.5"),
    "num_shared_tensors_on_final": ("pipeline[1].num_shared_tensors", "expected no num_shared_tensors on the final step"),
    "num_shared_tensors_zero": ("pipeline[0].num_shared_tensors", "expected an integer >= 1, found 0"),
    "old_video_path_iterator_missing": ("video_path_iterator", 'found no module named "video_path_provider"'),
    "out_queue_string": ("pipeline[0].queue_groups[0].out_queues[0]", 'expected an integer >= 0, found the string "0"'),
    "out_queue_unread": ("pipeline[1].queue_groups", "expected a group with in_queue 1"),
    "out_queues_duplicate": ("pipeline[0].queue_groups[0].out_queues[1]", "expected each queue index once, found 0 twice"),
    "out_queues_on_final": ("pipeline[1].queue_groups[0].out_queues",
                            "expected no out_queues on the final step, found the list [0]"),
    "pipeline_object": ("pipeline", "expected a non-empty list of steps, found the object"),
    "run_batch_size_float": ("run.batch_size", "expected an integer >= 1, found 1.5"),
    "run_concurrency_zero": ("run.concurrency", "expected an integer from 1 to 2147483647, found 0"),
    "run_concurrency_huge": ("run.concurrency", "expected an integer from 1 to 2147483647, found 2147483648"),
    "run_interval_infinite": ("value 1e999", "expected a finite JSON number, found one beyond the range of a double"),
    "run_videos_5000_digits": ("value 999999999999... (5000 digits)",
                               "expected an integer of at most 19 digits, found a longer one"),
    "run_engine_unknown": ("run.engine", 'expected one of "local", "ray", found the string "dask"'),
    "run_interval_negative": ("run.mean_interval_ms", "expected a number from 0 to 8.64e+07, found -1"),
    "run_not_object": ("run", "expected an object, found the list [40]"),
    "run_queue_size_null": ("run.queue_size", "expected an integer from 1 to 2147483647, found null"),
    "run_queue_size_huge": ("run.queue_size", "expected an integer from 1 to 2147483647, found 2147483648"),
    "run_seed_boolean": ("run.seed", "expected an integer >= 0, found false"),
    "run_unknown_key": ("run.vidoes", 'expected one of the run keys (mean_interval_ms, concurrency, streams, fps, '
                                      'stream_phase, jitter_ms, deadline_ms, stream_policy, arrivals, rate_schedule, '
                                      'scenario, samples_per_query, target_latency_ms, min_duration_ms, client, videos, '
                                      'batch_size, queue_size, warmup, seed, stall_s, '
                                      'max_duration_s, engine), found an unknown key (did you mean "videos"?)'),
    "run_videos_string": ("run.videos", 'expected an integer >= 1, found the string "40"'),
    "run_videos_zero": ("run.videos", "expected an integer >= 1, found 0"),
    "run_warmup_negative": ("run.warmup", "expected an integer >= 0, found -3"),
    "selector_missing_class": ("pipeline[0].queue_groups[0].queue_selector", 'class "NoSuchSelector"'),
    "selector_not_string": ("pipeline[0].queue_groups[0].queue_selector", 'found the list ["round robin"]'),
    "selector_without_select": ("pipeline[0].queue_groups[0].queue_selector", "to have a callable select, found none"),
    "segments_never_merged": ("pipeline[0].num_segments", "expected 1, or a later step whose model merges segments"),
    "selector_kwargs_without_selector": ("pipeline[0].queue_groups[0].queue_selector_kwargs",
                                         "expected it only beside a queue_selector"),
    "selector_kwargs_not_object": ("pipeline[0].queue_groups[0].queue_selector_kwargs", "expected an object, found the list [4]"),
    "threads_zero": ("pipeline[0].threads", "expected an integer >= 1, found 0"),
    "source_not_object": ("source", 'expected an object, found the string "data/synthetic"'),
    "step_not_object": ("pipeline[1]", 'expected an object, found the string "models.toy.TinyConvNet"'),
    "third_step_in_queue_mismatch": ("pipeline[2].queue_groups[1].in_queue", "out_queues of pipeline[1] {0, 1}, found 2"),
    "top_level_list": ("(top level)", "expected an object, found the list"),
    "unknown_top_key": ("pipline", 'expected one of the top-level keys (pipeline, source, run, video_path_iterator, '
                                   'description), found an unknown key (did you mean "pipeline"?)'),
    "video_path_iterator_not_iterable": ("source.video_path_iterator", "to have a callable __iter__, found none"),
    "video_path_iterator_twice": ("video_path_iterator", "found both"),
}


def _path(name: str) -> str:
    """The path as a user at the repo root would type it, which is what messages must echo."""
    return f"tests/pipeline/broken_configs/{name}.json"


def test_every_corpus_file_has_a_case() -> None:
    assert sorted(p.stem for p in CORPUS.glob("*.json")) == sorted(CASES)
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_config_names_its_json_path(name: str) -> None:
    json_path, fragment = CASES[name]
    file = _path(name)
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    error = caught.value
    assert error.file == file
    assert error.json_path == json_path
    assert fragment in error.expected
    assert str(error) == f"{file}: {json_path}: {error.expected}"
    assert "\n" not in str(error)


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_exits_2_with_the_json_path(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    json_path, fragment = CASES[name]
    file = _path(name)
    assert cli.main(["-c", file, "--cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{file}: {json_path}: " in err
    assert fragment in err
    assert "Traceback" not in err


def test_benchmark_subprocess_exits_2_without_traceback() -> None:
    file = "tests/pipeline/broken_configs/in_queue_mismatch.json"
    done = subprocess.run(
        [sys.executable, "benchmark.py", "-c", file, "--cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert (f"{file}: pipeline[1].queue_groups[0].in_queue: expected one of the out_queues of pipeline[0] {{0}}, "
            "found 3") in done.stderr
    assert "Traceback" not in done.stderr
