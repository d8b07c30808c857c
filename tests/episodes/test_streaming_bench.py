"""`python -m episodes bench`: every LeRobot track runs, decodes the same frames, and counts bytes exactly."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from episodes import open_dataset
from episodes.__main__ import main
from episodes._sidecar import sidecar_path
from episodes.synthetic import SyntheticSpec, make_dataset
from episodes.testing.server import serve_directory
from episodes.tools.streaming import TRACKS, StreamingOptions, random_targets, run_tracks

SPEC = SyntheticSpec(episodes=8, cameras=2, episodes_per_file=4, min_length=30, max_length=60, width=64, height=64,
                     gop=10, bframes=2, seed=2)
SMALL = ["--pool-size", "4", "--frames-per-episode", "3", "--frame-pool-size", "40", "--workers", "2"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("streaming") / "ds", SPEC)


def table_rows(text: str) -> dict[str, list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_every_track_runs_and_decodes_the_indexed_frames(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(root), *SMALL, "--include-decode"]) == 0
    captured = capsys.readouterr()
    rows = table_rows(captured.out)
    # The library's log records reach the terminal as every command shows them: 4 episodes x 2 cameras x 3 frames.
    assert [line for line in captured.err.splitlines() if line.startswith("episodes: ")] == [
        f"episodes: track {name}: 4 episodes, 24 targets" for name in TRACKS]
    assert list(rows) == ["indexed", "windows", "random-frames", "remote-decoder", "tabular", "tabular-usage"]
    assert rows["windows"]["frames = indexed"] == rows["remote-decoder"]["frames = indexed"] == "yes"
    assert rows["tabular-usage"]["frames = indexed"] == "yes"  # the usage copy returns the Parquet values
    assert rows["indexed"]["jobs"] == "8" and rows["random-frames"]["windows"] != "-"


def test_track_byte_counts_are_exact(root: Path) -> None:
    ds = open_dataset(str(root))
    options = StreamingOptions(pool_size=4, frames_per_episode=3, frame_pool_size=40, workers=2, coalesce_gap_kb=0)
    rows = {row.track: row for row in run_tracks(ds, ["indexed", "windows", "random-frames"], options)}
    indexed, windows, scattered = rows["indexed"], rows["windows"], rows["random-frames"]
    assert indexed.bytes_fetched == indexed.bytes_planned and indexed.ranges_after == indexed.jobs == 8
    # Without coalescing, windows fetch exactly their merged runs: no more than the whole episodes.
    assert windows.bytes_useful <= windows.bytes_fetched <= windows.bytes_planned
    assert windows.bytes_fetched < indexed.bytes_fetched and windows.ranges_after == windows.ranges_before
    targets = random_targets(ds, options)
    assert scattered.windows == sum(len(np.unique(np.round(t * ds.fps))) for t in targets.values())
    assert scattered.samples == options.frame_pool_size and scattered.jobs == len(targets)


@pytest.mark.nginx
def test_over_http_with_a_failing_track_the_others_still_report(root: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:  # a plain video file: every track but tabular runs
        code = main(["bench", f"{server.url}/videos/observation.images.cam0/chunk-000/file-000.mp4", *SMALL])
    rows = table_rows(capsys.readouterr().out)
    assert code == 1 and rows["tabular"]["notes"] == "failed: plain video files have no data table"
    assert all(rows[t]["wall s"] != "-" for t in ("indexed", "windows", "random-frames", "remote-decoder"))


@pytest.mark.parametrize("args, message", [
    (["--pool-size", "0"], "--pool-size must be at least 1, got 0"),
    (["--coalesce-gap-kb", "-1"], "--coalesce-gap-kb must be at least 0, got -1"),
])
def test_bad_knobs_exit_2(root: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["bench", str(root), *args]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_indexes_persist_under_cache_dir_unless_no_sidecar(root: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(root), *SMALL, "--strategy", "indexed", "--cache-dir", str(tmp_path)]
    sources = []
    for extra in ([], [], ["--no-sidecar"]):
        assert main([*args, *extra]) == 0
        sources.append(table_rows(capsys.readouterr().out)["indexed"]["index s"].split()[-1])
    assert sources == ["(headers)", "(sidecar)", "(headers)"]
    assert sidecar_path(open_dataset(str(root)).storage, tmp_path).is_file()
