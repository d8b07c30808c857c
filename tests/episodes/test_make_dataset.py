"""The synthetic dataset generator: layout, encoder settings, and frames that decode to their own index."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchcodec.decoders import VideoDecoder

from episodes._dataset import open_dataset
from episodes._mp4.boxes import top_level_boxes
from episodes.synthetic import SyntheticSpec, make_dataset
from tests.support.mp4_fixtures import read_indices

REPO = Path(__file__).resolve().parents[2]
SMALL = dict(episodes=5, cameras=2, episodes_per_file=2, min_length=8, max_length=20, width=64, height=64, seed=1)


def box_types(path: Path) -> list[str]:
    """The four-character types of an MP4's top-level boxes, in file order."""
    data = path.read_bytes()
    return [box.type for box in top_level_boxes(lambda s, e: data[s:e], len(data), str(path))]


def ffprobe(path: Path, entries: str) -> list[str]:
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v", "-show_entries", entries,
                          "-of", "csv=p=0", str(path)], check=True, capture_output=True, text=True).stdout
    return [line.strip().strip(",") for line in out.splitlines() if line.strip()]


def check_frames(root: Path) -> int:
    """Every video file decodes to exactly its episodes' frames, each showing its own dataset index.

    Returns how many files were checked.
    """
    ds = open_dataset(str(root))
    checked = set()
    for key in ds.video_keys:
        by_file: dict[str, list] = {}
        for i in range(ds.num_episodes):
            rec = ds.episode(i)
            by_file.setdefault(rec.videos[key].path, []).append(rec)
        for path, records in by_file.items():
            decoder = VideoDecoder(str(root / path), seek_mode="exact")
            batch = decoder.get_frames_in_range(0, len(decoder))
            expected = [j for r in records for j in range(r.dataset_from_index, r.dataset_to_index)]
            assert len(decoder) == len(expected)
            assert read_indices(batch.data) == expected
            assert len({bytes(f.numpy()) for f in batch.data}) == len(expected)
            pts = batch.pts_seconds.numpy()
            half = 0.5 / ds.fps
            for r in records:
                seg = r.videos[key]
                inside = (pts >= seg.from_timestamp - half) & (pts < seg.to_timestamp - half)
                assert read_indices(batch.data[torch.from_numpy(inside)]) == list(
                    range(r.dataset_from_index, r.dataset_to_index))
            checked.add(path)
    return len(checked)


def test_h264_bframes_moov_at_end(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "h264", SyntheticSpec(codec="h264", gop=6, bframes=2, **SMALL))
    assert check_frames(root) == 3 * 2
    video = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    boxes = box_types(video)
    assert boxes.index("mdat") < boxes.index("moov")
    assert ffprobe(video, "stream=codec_name,has_b_frames") == ["h264,2"]
    assert ffprobe(video, "frame=pict_type").count("B") > 0


def test_h264_faststart_without_bframes(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "fast", SyntheticSpec(codec="h264", bframes=0, faststart=True, **SMALL))
    assert check_frames(root) == 3 * 2
    video = root / "videos/observation.images.cam1/chunk-000/file-002.mp4"
    boxes = box_types(video)
    assert boxes.index("moov") < boxes.index("mdat")
    assert "B" not in ffprobe(video, "frame=pict_type")


def test_hevc_with_bframes(tmp_path: Path) -> None:
    spec = SyntheticSpec(codec="hevc", gop=8, bframes=3, **{**SMALL, "episodes": 3, "cameras": 1})
    root = make_dataset(tmp_path / "hevc", spec)
    assert check_frames(root) == 2
    video = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    assert ffprobe(video, "stream=codec_name") == ["hevc"]
    assert ffprobe(video, "frame=pict_type").count("B") > 0


def test_av1_keyframe_every_two_frames(tmp_path: Path) -> None:
    spec = SyntheticSpec(codec="av1", gop=2, **{**SMALL, "episodes": 2, "cameras": 1})
    root = make_dataset(tmp_path / "av1", spec)
    assert check_frames(root) == 1
    video = root / "videos/observation.images.cam0/chunk-000/file-000.mp4"
    keys = ffprobe(video, "frame=key_frame")
    assert keys == ["1" if i % 2 == 0 else "0" for i in range(len(keys))]


def test_layout_info_and_data_rows(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "layout", SyntheticSpec(files_per_chunk=2, row_group_size=8, **SMALL))
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["total_episodes"] == 5 and info["fps"] == 30
    assert info["features"]["observation.images.cam1"]["shape"] == [64, 64, 3]
    assert sorted(str(p.relative_to(root)) for p in root.glob("data/*/*.parquet")) == [
        "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet", "data/chunk-001/file-000.parquet"]
    rows = pq.read_table(root / "data/chunk-000/file-001.parquet")
    assert pq.ParquetFile(root / "data/chunk-000/file-001.parquet").metadata.num_row_groups > 1
    assert rows.schema.field("timestamp").type == "float"
    assert rows.schema.field("observation.state").type == pa.list_(pa.float32(), 6)
    first = rows.column("frame_index").to_numpy() == 0
    assert np.all(rows.column("timestamp").to_numpy()[first] == 0)
    assert info["total_frames"] == sum(pq.read_table(p).num_rows for p in root.glob("data/*/*.parquet"))


def test_same_seed_same_dataset(tmp_path: Path) -> None:
    a = make_dataset(tmp_path / "a", SyntheticSpec(**SMALL))
    b = make_dataset(tmp_path / "b", SyntheticSpec(**SMALL))
    c = make_dataset(tmp_path / "c", SyntheticSpec(**{**SMALL, "seed": 2}))
    episodes = "meta/episodes/chunk-000/file-000.parquet"
    assert pq.read_table(a / episodes).equals(pq.read_table(b / episodes))
    assert not pq.read_table(a / episodes).equals(pq.read_table(c / episodes))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"codec": "vp9"}, "codec must be one of h264, hevc, av1, got 'vp9'"),
        ({"episodes": 0}, "episodes must be at least 1, got 0"),
        ({"min_length": 50, "max_length": 40}, r"max_length \(40\) is below min_length \(50\)"),
        ({"width": 100}, "width and height must be multiples of 8"),
        ({"bframes": -1}, "bframes must be >= 0, got -1"),
    ],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticSpec(**options)


@pytest.mark.slow
def test_script_writes_a_dataset_and_rejects_bad_options(tmp_path: Path) -> None:
    script = REPO / "scripts" / "make_dataset.py"
    out = tmp_path / "cli"
    ok = subprocess.run([sys.executable, str(script), str(out), "--episodes", "3", "--cameras", "1",
                         "--width", "32", "--height", "32", "--min-length", "5", "--max-length", "6",
                         "--no-faststart"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"wrote 3 episodes x 1 cameras (h264) to {out}:")
    assert open_dataset(str(out)).num_episodes == 3
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "bad"), "--codec", "vp9"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "invalid choice: 'vp9'" in bad.stderr
    assert not (tmp_path / "bad").exists()
