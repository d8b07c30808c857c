"""The verifier CLI: exit 0 when every episode-camera is identical, 1 when any is not, 2 for bad input."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from episodes.__main__ import main
from episodes.synthetic import SyntheticSpec

SPEC = SyntheticSpec(codec="hevc", gop=8, bframes=3, episodes=4, cameras=2, episodes_per_file=2,
                     min_length=8, max_length=16, width=64, height=64, seed=2)


def test_all_identical_exits_0(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(source)]) == 0
    assert capsys.readouterr().out == "8 episode-cameras checked on cpu: 8 identical, 0 different\n"
    assert main(["verify", str(source), "--cameras", "observation.images.cam1"]) == 0
    assert capsys.readouterr().out == "4 episode-cameras checked on cpu: 4 identical, 0 different\n"


def test_plain_video_glob(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(source / "videos/observation.images.cam0/*/*.mp4")]) == 0
    assert capsys.readouterr().out == "2 episode-cameras checked on cpu: 2 identical, 0 different\n"


def test_broken_file_exits_1_naming_its_episodes(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    video = root / "videos/observation.images.cam1/chunk-000/file-001.mp4"
    video.write_bytes(video.read_bytes().replace(b"stsz", b"xxxx"))
    assert main(["verify", str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "8 episode-cameras checked on cpu: 6 identical, 2 different"
    for line, ep in zip(lines[:2], (2, 3)):
        assert line.startswith(f"DIFFERENT episode {ep} camera observation.images.cam1: byte-range path failed: {video}:")


@pytest.mark.parametrize("args, message", [
    (["--cameras", "nope"], "error: camera 'nope' is not in the dataset (it has observation.images.cam0, "
                            "observation.images.cam1)"),
    (["--device", "meta"], "error: --device 'meta' is not supported; use cpu or cuda:N"),
    (["--device", "???"], "error: --device '???' is not a device name such as cpu or cuda:0"),
])
def test_bad_arguments_exit_2(source: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["verify", str(source), *args]) == 2
    assert capsys.readouterr().err == message + "\n"


@pytest.mark.slow
def test_unreadable_dataset_exits_2_from_the_command_line(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "episodes", "verify", str(tmp_path / "missing")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr == f"error: {tmp_path / 'missing'}/meta/info.json: file not found\n"
    usage = subprocess.run([sys.executable, "-m", "episodes"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage:" in usage.stderr
