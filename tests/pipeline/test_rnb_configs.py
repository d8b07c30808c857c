"""The original RnB repository's configs (tests/pipeline/rnb_configs/, as published there) run here unmodified.

RnB read Kinetics videos laid out as label/video.mp4 under one directory; the
tests give it four tiny videos in that layout through --dataset, on the CPU,
one replica per group so the eight configs fit a two-core machine.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from episodes.synthetic import SyntheticSpec, encode_video
from models.clips import ClipCount
from rnb import cli
from rnb.pipeline.config import ConfigError, load_config, parse_config
from rnb.pipeline.original import RNB_CLIPS
from rnb.pipeline.plan import plan_runners
from selector import LargeSmallSelector
from tests.support.model_support import whole_model_predictions

RNB_CONFIGS = sorted(Path("tests/pipeline/rnb_configs").glob("*.json"))
VIDEOS = ("laughing/a.mp4", "laughing/b.mp4", "running/c.mp4", "running/d.mp4")
ITEMS = 3  # RnB's 10:1 draw gives items 0-2 one clip each, so the R(2+1)D work stays small at 112x112


@pytest.fixture(scope="module")
def kinetics_glob(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("kinetics")
    generator = torch.Generator().manual_seed(0)
    for name in VIDEOS:
        frames = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8, generator=generator)
        encode_video(frames, root / name, SyntheticSpec(width=32, height=32, gop=4))
    return f"{root}/*/*.mp4"


def test_the_configs_are_rnbs_eight():
    assert sorted(path.stem for path in RNB_CONFIGS) == [
        "baseline", "r2p1d-aggressive", "r2p1d-aggressive-four-groups", "r2p1d-aggressive-global",
        "r2p1d-nopipeline", "r2p1d-segment", "r2p1d-whole", "rnb"]


@pytest.mark.slow
@pytest.mark.timeout(900)  # up to 16 processes each load torch: minutes on a busy two-core machine
@pytest.mark.parametrize("path", RNB_CONFIGS, ids=[path.stem for path in RNB_CONFIGS])
def test_rnb_config_runs_unmodified_to_its_target(path, kinetics_glob, tmp_path, job_log):
    logs = tmp_path / "logs"
    code = cli.main(["-c", str(path), "--cpu", "--max-replicas", "1", "--dataset", kinetics_glob, "-v", str(ITEMS),
                     "-mi", "0", "--warmup", "0", "--log-dir", str(logs)])
    log = job_log(logs)
    meta, rows = log.meta, log.rows
    assert code == 0, meta["error"]
    assert meta["termination_reason"] == "target reached" and [row["item_id"] for row in rows] == list(range(ITEMS))
    # RnB's iterator walked the videos in order; each is one request, read by byte ranges
    assert [row["payload"] for row in rows] == [f"{kinetics_glob}#{i}" for i in range(ITEMS)]
    assert all(row["num_clips"] == 1 and row["frames_decoded"] == 8 and row["bytes_fetched"] > 0 for row in rows)
    notes = meta["notes"]
    assert notes[0].startswith("video_path_iterator: RnB's models.r2p1d.model.R2P1DVideoPathIterator runs as a videos source")
    assert any(note.startswith("pipeline[0].model: RnB's models.r2p1d.model.") for note in notes)
    assert json.loads((log.dir / "config.json").read_text())["source"] == {"videos": kinetics_glob, "order": "sequential"}
    if path.stem == "r2p1d-segment":
        assert [row["prediction"] for row in rows] == whole_model_predictions(str(path), "videos", kinetics_glob, rows)


def test_rnb_defaults_clip_draw_large_small_split_and_batch():
    config = load_config("tests/pipeline/rnb_configs/rnb.json")
    loader, batcher, runner = config.steps
    assert (loader.model, batcher.model, runner.model) == (
        "models.episode.EpisodeLoader", "models.batcher.Batcher", "models.r2p1d.R2P1DRunner")
    assert loader.model_kwargs["num_clips"] == RNB_CLIPS == {"choices": [1, 15], "weights": [10, 1]}
    assert (loader.model_kwargs["clip_length"], loader.model_kwargs["size"]) == (8, 112)
    group = loader.queue_groups[0]
    selector = LargeSmallSelector(2, **group.queue_selector_kwargs)
    assert group.queue_selector == "selector.LargeSmallSelector"
    assert [selector.select((), {"num_clips": n}, None) for n in (1, 14, 15)] == [0, 0, 1]
    draws = [ClipCount.parse(loader.model_kwargs["num_clips"]).draw(np.random.default_rng([0, i])) for i in range(1100)]
    assert set(draws) == {1, 15} and 80 <= draws.count(15) <= 120  # 1 in 11
    # the group that says batch 3 keeps it; the one that says nothing gets RnB's 1, whatever -b says
    placements = plan_runners(config, batch_size=5)
    assert [p.model_kwargs["batch"] for p in placements if p.step == 1] == [3, 1]


def test_rnb_keywords_are_translated_or_refused():
    step = {"model": "models.r2p1d.model.R2P1DLoader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
            "num_clips_population": [2, 4], "num_clips_weights": [1, 3]}
    last = {"model": "models.r2p1d.model.R2P1DAggregator", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}
    config = parse_config({"pipeline": [step, last]}, "c.json")
    assert config.steps[0].model_kwargs["num_clips"] == {"choices": [2, 4], "weights": [1, 3]}
    assert config.raw["pipeline"][0] == step  # the job log keeps the config as written
    with pytest.raises(ConfigError) as caught:
        parse_config({"pipeline": [{**step, "num_segments": 3}, {**last, "aggregate": 2}]}, "c.json")
    assert str(caught.value) == ("c.json: pipeline[1].aggregate: expected the number of segments each item arrives "
                                 "in (3, the num_segments of an earlier step), found 2")


def test_without_dataset_the_error_says_how_to_name_the_videos(capsys):
    assert cli.main(["-c", "tests/pipeline/rnb_configs/r2p1d-whole.json", "--cpu", "--check"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "tests/pipeline/rnb_configs/r2p1d-whole.json: source.videos: expected a glob matching MP4 files "
        "(--dataset \"GLOB\" names other files), found an error: "
        "/cmsdata/ssd0/cmslab/Kinetics-400/sparta/*/*.mp4: no video file matches")
