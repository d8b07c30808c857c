"""Inputs that pass JSON and type checks but cannot work are refused before anything starts.

Each case is one sentence naming the file and JSON path (or the flag), exit
code 2, and nothing written: no job directory, no process.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rnb import cli

TOY = json.loads(Path("config/toy.json").read_text())


def write(tmp_path: Path, document: dict, name: str = "c.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def toy(**changes: dict) -> dict:
    """The toy config with keys of step 0 or 1 replaced (`step0={...}`, `step1={...}`, `source=...`).

    A new `model` replaces the step's other keywords too, keeping its queue groups.
    """
    document = json.loads(json.dumps(TOY))
    for k in (0, 1):
        step = changes.get(f"step{k}", {})
        if "model" in step:
            document["pipeline"][k] = {"queue_groups": document["pipeline"][k]["queue_groups"]}
        document["pipeline"][k].update(step)
    if "source" in changes:
        document["source"] = changes["source"]
    return document


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], log_dir: Path) -> str:
    assert cli.main([*argv, "--log-dir", str(log_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not log_dir.exists() or list(log_dir.iterdir()) == []
    return err.strip()


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_config_that_is_not_a_small_regular_file_is_refused_without_reading_it(tmp_path, capsys, kind):
    if kind == "fifo":
        path = tmp_path / "pipe.json"
        os.mkfifo(path)  # opening it for reading would block until a writer comes
        found = "expected a regular JSON file, found a named pipe (FIFO)"
    elif kind == "device":
        path = Path("/dev/zero")  # reading it would never end
        found = "expected a regular JSON file, found a character device"
    else:
        path = tmp_path / "huge.json"
        path.write_text(json.dumps(TOY) + " " * (1 << 20))
        found = "expected a JSON file of at most 1048576 bytes, found a larger one"
    assert refused(["-c", str(path), "--cpu"], capsys, tmp_path / "logs") == f"{path}: (file): {found}"


def test_json_deeper_than_the_parser_can_recurse_is_one_sentence(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"description": ' + "[" * 100000 + "]" * 100000 + "}")
    assert refused(["-c", str(path)], capsys, tmp_path / "logs") == (
        f"{path}: (top level): expected JSON nested at most 64 levels deep, found far deeper nesting")


@pytest.mark.parametrize("changes, sentence", [
    ({"step0": {"clips": True}}, "pipeline[0].clips: expected an integer >= 1, found true"),
    ({"step0": {"height": 1e30}}, "pipeline[0].height: expected an integer >= 1, found 1e+30"),
    ({"step1": {"classes": 2.5}}, "pipeline[1].classes: expected an integer >= 1, found 2.5"),
    ({"step0": {"frames": 10**18}},
     "pipeline[0].num_shared_tensors: expected output slots that fit in memory, found 10 slots of shapes "
     "[(2, 3, 1000000000000000000, 16, 16)] per runner and 5.72e+13 GiB for all slots on cpu, more than the "),
    ({"source": {"synthetic": True, "seed": 3}},
     'source.seed: expected no other key beside "synthetic", which takes no options, found an unknown key'),
    ({"step1": {"model": "models.r2p1d.R2P1DRunner", "start_index": 4, "end_index": 2}},
     "pipeline[1].model: expected output_shape() to accept the step's keywords, found ValueError: start_index and "
     "end_index must satisfy 1 <= start_index <= end_index <= 5, got 4 and 2"),
    ({"step1": {"model": "models.r2p1d.R2P1DRunner", "checkpoint": "no/such/weights.pt"}},
     "pipeline[1].model: expected output_shape() to accept the step's keywords, found ValueError: checkpoint "
     "no/such/weights.pt is not a file"),
], ids=["count_true", "height_1e30", "classes_float", "frames_1e18", "source_key", "final_cut", "final_checkpoint"])
def test_values_that_cannot_work_are_refused_before_start(tmp_path, capsys, changes, sentence):
    config = write(tmp_path, toy(**changes))
    assert refused(["-c", config, "-v", "4", "-mi", "0"], capsys, tmp_path / "logs").startswith(f"{config}: {sentence}")


BATCHED = {"source": {"synthetic": True}, "pipeline": [
    {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
    {"model": "models.batcher.Batcher", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
    {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}


@pytest.mark.parametrize("step, keywords, sentence", [
    (1, {"batch": "4"}, 'pipeline[1].batch: expected an integer >= 1, found the string "4"'),
    (1, {"batch": 0}, "pipeline[1].batch: expected an integer >= 1, found 0"),
    (1, {"timeout_ms": -5}, "pipeline[1].timeout_ms: expected a number >= 0, found -5"),
    (2, {"classes": "ten"}, 'pipeline[2].classes: expected an integer >= 1, found the string "ten"'),
    (0, {"fail_at_item": "3"}, 'pipeline[0].fail_at_item: expected an integer or null, found the string "3"'),
    (1, {"num_clips": {"choices": [1, "15"], "weights": [10, 1]}},
     'pipeline[1].num_clips.choices[1]: expected a number, found the string "15"'),
    (1, {"num_clips": "ten"}, 'pipeline[1].num_clips: expected an integer >= 1 or an object, found the string "ten"'),
    (1, {"batch": [1, 2, 4]}, "pipeline[1].batch: expected an integer >= 1, found the list [1, 2, 4]; a list of "
                              "choices is for rnb-tune (docs/tuner.md), which tries each and picks one"),
], ids=["batch_string", "batch_zero", "timeout_negative", "classes_string", "hook_string", "clip_choice_string",
        "clips_string", "batch_choices"])
def test_each_model_keyword_is_checked_against_its_declared_type_and_range_at_check(
        tmp_path, capsys, step, keywords, sentence):
    document = json.loads(json.dumps(BATCHED))
    document["pipeline"][step].update(keywords)
    config = write(tmp_path, document)
    assert refused(["-c", config, "--check"], capsys, tmp_path / "logs") == f"{config}: {sentence}"


def test_a_keyword_given_to_a_queue_group_is_checked_under_its_own_path(tmp_path, capsys):
    document = json.loads(json.dumps(BATCHED))
    document["pipeline"][1]["queue_groups"][0]["batch"] = 2.5
    config = write(tmp_path, document)
    assert refused(["-c", config, "--check"], capsys, tmp_path / "logs") == (
        f"{config}: pipeline[1].queue_groups[0].batch: expected an integer >= 1, found 2.5")


def test_test_hooks_are_accepted_but_never_offered(tmp_path, capsys):
    document = json.loads(json.dumps(BATCHED))
    document["pipeline"][2].update({"fail_at_itm": 3})
    config = write(tmp_path, document)
    assert refused(["-c", config, "--check"], capsys, tmp_path / "logs") == (
        f"{config}: pipeline[2].fail_at_itm: expected a keyword that models.toy.TinyConvNet takes (clips, classes, "
        "channels, seed), found an unknown keyword")
    document["pipeline"][2] = {**document["pipeline"][2], "fail_at_item": 3}
    del document["pipeline"][2]["fail_at_itm"]
    assert cli.main(["-c", write(tmp_path, document), "--check"]) == 0


@pytest.mark.parametrize("flags, run, sentence", [
    (["--warmup", "500", "-v", "100"], {}, "command line: --warmup: expected fewer warm-up items than the 100 requests "
                                           "to finish (-v), found 500, which would leave none to measure"),
    (["--warmup", "40"], {"videos": 40}, "command line: --warmup: expected fewer warm-up items than the 40 requests "
                                         "to finish (-v), found 40, which would leave none to measure"),
    ([], {"videos": 30, "warmup": 30}, "{config}: run.warmup: expected fewer warm-up items than the 30 requests to "
                                       "finish (run.videos), found 30, which would leave none to measure"),
], ids=["both_flags", "warmup_flag", "config_run"])
def test_a_warmup_that_leaves_nothing_to_measure_is_refused_at_the_start(tmp_path, capsys, flags, run, sentence):
    config = write(tmp_path, {**TOY, "run": run})
    assert refused(["-c", config, *flags], capsys, tmp_path / "logs") == sentence.format(config=config)


@pytest.mark.parametrize("where, sentence", [
    ("afile", "expected a directory for the job logs, found a file at {log_dir}"),
    ("afile/below", "expected a directory that exists or can be created, found that {log_dir} cannot be created "
                    "(Not a directory)"),
])
def test_a_log_dir_that_cannot_hold_logs_exits_2_before_start(tmp_path, capsys, where, sentence):
    (tmp_path / "afile").write_text("not a directory")
    log_dir = tmp_path / where
    assert cli.main(["-c", "config/toy.json", "-v", "4", "-mi", "0", "--log-dir", str(log_dir)]) == 2
    err = capsys.readouterr().err
    assert err == f"command line: --log-dir: {sentence.format(log_dir=log_dir)}\n"
    assert (tmp_path / "afile").read_text() == "not a directory"
