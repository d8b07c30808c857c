"""Whatever can be checked is checked before any process starts: exit 2, one sentence, nothing written."""
from __future__ import annotations

import json
from pathlib import Path

from rnb import cli


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_a_misspelt_model_keyword_fails_check(capsys):
    assert cli.main(["-c", "tests/pipeline/broken_configs/model_keyword_typo.json", "--check"]) == 2
    assert capsys.readouterr().err == (
        "tests/pipeline/broken_configs/model_keyword_typo.json: pipeline[0].clip: expected a keyword that "
        "models.toy.SyntheticFrames takes (clips, frames, height, width), "
        "found an unknown keyword (did you mean \"clips\"?)\n")


def test_a_videos_source_naming_a_directory_fails_check(tmp_path, capsys):
    config = json.loads(Path("config/r2p1d-whole.json").read_text())
    config["source"] = {"videos": str(tmp_path)}
    path = tmp_path / "videos.json"
    path.write_text(json.dumps(config))
    assert cli.main(["-c", str(path), "--cpu", "--check"]) == 2
    assert capsys.readouterr().err == (
        f"{path}: source.videos: expected a glob of video files such as \"{tmp_path}/*.mp4\" "
        f"(\"{tmp_path}/**/*.mp4\" to include subdirectories), found the directory {tmp_path}\n")


def test_check_writes_nothing_even_where_a_run_would_generate_the_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--check"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("ready: ") and "<default> is valid (2 steps, 2 runners)" in out
    assert err == "benchmark.py: dataset data/synthetic is missing: a run (without --check) generates it there\n"
    assert files_under(tmp_path) == []


def test_a_missing_dataset_named_on_the_command_line_is_never_generated(tmp_path, monkeypatch, capsys):
    """The embedded default generates its own missing dataset; --dataset names the user's, which must exist."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--dataset", "mine"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("command line: --dataset: expected a LeRobot v3.0 dataset, found an error: ")
    assert "mine" in err and err.count("\n") == 1
    assert files_under(tmp_path) == []
