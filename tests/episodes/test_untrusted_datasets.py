"""Datasets and servers that cannot be trusted: refused at start, blamed correctly, never echoed.

A remote protocol whose package is missing, a server that ignores Range
requests or answers another range, an info.json template that leaves the
root, a video that is a symlink out of it: each is one sentence, and the
harness refuses it before anything starts (exit 2).  Nothing is written into
the dataset, so a read-only dataset works.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from episodes import DatasetFormatError, EpisodeByteCache, FetchError, FrameRequest, Mp4FormatError, open_dataset
from episodes._sidecar import sidecar_path
from episodes.synthetic import SyntheticSpec
from episodes.testing.faults import serve_with_faults
from rnb import cli
from tests.support.mp4_fixtures import read_indices

SPEC = SyntheticSpec(codec="h264", gop=4, episodes=3, cameras=1, episodes_per_file=2, min_length=6, max_length=8,
                     width=32, height=32, seed=3)
KEY = "observation.images.cam0"
VIDEO = "videos/observation.images.cam0/chunk-000/file-000.mp4"  # episodes 0 and 1


def first(count: int, fault: str) -> Callable[[int], str | None]:
    """The fault for the first `count` range requests, then right answers."""
    return lambda n: fault if n < count else None


def loader_config(tmp_path: Path, dataset: str, **keywords: object) -> str:
    document = {"source": {"dataset": dataset, "order": "sequential"}, "pipeline": [
        {"model": "models.episode.EpisodeLoader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
         "num_clips": 1, "clip_length": 2, "size": 16, **keywords},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}], "clips": 1}]}
    path = tmp_path / "loader.json"
    path.write_text(json.dumps(document))
    return str(path)


def refused(tmp_path: Path, config: str, capsys: pytest.CaptureFixture[str]) -> str:
    log_dir = tmp_path / "logs"
    assert cli.main(["-c", config, "-v", "2", "-mi", "0", "--log-dir", str(log_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not log_dir.exists()
    return err.strip()


@pytest.mark.parametrize("url, package", [("s3://bucket/lerobot/ds", "Install s3fs to access S3"),
                                          ("hf://datasets/lerobot/ds", "Install huggingface_hub to access HfFileSystem")])
def test_a_remote_protocol_without_its_package_is_one_sentence_at_start(tmp_path, capsys, url, package):
    expected = (f"{url}: the {url.split(':')[0]}:// filesystem needs a package that is not installed ({package}); "
                "install it into the environment, or use a local path or an http(s):// URL")
    with pytest.raises(FetchError, match=f"^{re.escape(expected)}$"):
        open_dataset(url)
    config = loader_config(tmp_path, url)
    assert refused(tmp_path, config, capsys) == (
        f"{config}: source.dataset: expected a LeRobot v3.0 dataset, found an error: {expected}")


def test_a_server_that_ignores_range_is_refused_by_the_start_up_probe(root, tmp_path, capsys):
    with serve_with_faults(root, first(10**6, "ignore_range")) as url:
        config = loader_config(tmp_path, url)
        assert refused(tmp_path, config, capsys) == (
            f"{config}: source.dataset: expected a server that answers byte-range requests, found an error: "
            f"{url}/{VIDEO}: read of bytes [0, 1) failed (the server ignores Range requests: it answered HTTP 200 "
            "with the whole file)")


def test_a_wrong_content_range_is_retried_and_then_blamed_on_the_server(root, tmp_path):
    with serve_with_faults(root, first(2, "shift")) as url:  # two wrong answers, then right ones: retries absorb them
        ds = open_dataset(url, backoff_s=0.01)
        with EpisodeByteCache(ds, cache_dir=tmp_path) as cache:
            (read,) = cache.read_frames([FrameRequest(1, KEY, frame_numbers=[0, 1])])
            assert read_indices(read.frames) == [ds.episode(1).dataset_from_index + i for i in (0, 1)]
    with serve_with_faults(root, first(10**6, "shift")) as url:
        with EpisodeByteCache(open_dataset(url, backoff_s=0.01), cache_dir=tmp_path / "fresh") as cache:
            with pytest.raises(FetchError, match=(
                    rf"^{re.escape(url)}/{VIDEO}: episode 0, camera {KEY}: read of bytes \[0, \d+\) failed after 4 "
                    rf"attempts \(the server answered Content-Range 'bytes 1-\d+/\d+' to a request for bytes "
                    rf"0-\d+\)$")):
                cache.read_frames([FrameRequest(0, KEY, frame_numbers=[0])])


def test_a_path_template_leaving_the_root_is_refused_when_the_dataset_opens(root, tmp_path, capsys):
    info = json.loads((root / "meta/info.json").read_text())
    info["data_path"] = "../elsewhere/file-{file_index:03d}.parquet"
    (root / "meta/info.json").write_text(json.dumps(info))
    sentence = (f"{root}/meta/info.json: field 'data_path' gives '../elsewhere/file-000.parquet' for episode 0, "
                "which is outside the dataset root")
    with pytest.raises(DatasetFormatError, match=f"^{re.escape(sentence)}$"):
        open_dataset(str(root))
    config = loader_config(tmp_path, str(root))
    assert refused(tmp_path, config, capsys) == (
        f"{config}: source.dataset: expected a LeRobot v3.0 dataset, found an error: {sentence}")


def test_a_video_symlinked_out_of_the_root_is_refused_and_never_read(root, tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n" * 50)
    (root / VIDEO).unlink()
    (root / VIDEO).symlink_to(secret)
    sentence = (f"{root}/{VIDEO}: is a symbolic link to a file outside the dataset root ({root}); refusing to read it")
    with pytest.raises(DatasetFormatError, match=f"^{re.escape(sentence)}$"):
        open_dataset(str(root))
    config = loader_config(tmp_path, str(root))
    assert refused(tmp_path, config, capsys) == (
        f"{config}: source.dataset: expected a LeRobot v3.0 dataset, found an error: {sentence}")


def test_errors_never_echo_the_bytes_of_a_file_that_is_not_an_mp4(root, tmp_path):
    (root / VIDEO).write_text("root:x:0:0:root:/root:/bin/bash\n" * 50)  # inside the root, so it is read
    with EpisodeByteCache(open_dataset(str(root)), cache_dir=tmp_path) as cache:
        with pytest.raises(Mp4FormatError) as caught:
            cache.read_frames([FrameRequest(0, KEY, frame_numbers=[0])])
    assert str(caught.value) == (f"{root}/{VIDEO}: episode 0, camera {KEY}: the bytes at 0 are not an MP4 box header "
                                 "(an unknown type and a size that does not fit): not an MP4 file, or a corrupt one")


def test_nothing_is_written_into_the_dataset(root, tmp_path):
    before = sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*"))
    ds = open_dataset(str(root), usage_cache_dir=tmp_path / "cache")
    with EpisodeByteCache(ds, cache_dir=tmp_path / "cache") as cache:
        (read,) = cache.read_frames([FrameRequest(2, KEY, frame_numbers=[0])])
        assert read_indices(read.frames) == [ds.episode(2).dataset_from_index]
        assert ds.episode_columns(2, ["index"])["index"][0] == ds.episode(2).dataset_from_index
    assert sidecar_path(ds.storage, tmp_path / "cache").is_file()
    assert sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob("*")) == before


def test_a_camera_or_data_column_the_dataset_lacks_is_refused_before_start(root, tmp_path, capsys):
    config = loader_config(tmp_path, str(root), camera="front")
    assert refused(tmp_path, config, capsys) == (
        f"{config}: pipeline[0].camera: expected one of the cameras of {root} ({KEY}), found 'front'")
    config = loader_config(tmp_path, str(root), tabular=["observation.state", "torque"])
    assert refused(tmp_path, config, capsys) == (
        f"{config}: pipeline[0].tabular[1]: expected a data column of {root} (observation.state, action, timestamp, "
        "frame_index, episode_index, index, task_index), found 'torque'")


@pytest.mark.parametrize("fault", ["stall", "trickle"])
def test_a_server_that_stops_answering_fails_the_read_in_one_sentence_within_timeout_times_attempts(root, fault):
    """It takes every request and never answers, or answers a byte a second: each attempt ends at its timeout."""
    with serve_with_faults(root, lambda n: fault, every_request=True) as url:
        began = time.monotonic()
        with pytest.raises(FetchError) as raised:
            open_dataset(url, timeout_s=1.0, retries=1, backoff_s=0.2)
        took = time.monotonic() - began
    assert str(raised.value) == (f"{url}/meta/info.json: read failed after 2 attempts (no complete answer within the "
                                 "timeout of 1 s)")
    assert took <= 1.0 * 2 + 0.2 + 2.0  # the bound: timeout x attempts (+ the backoff) + 2 s


@pytest.mark.slow
def test_a_remote_dataset_that_stops_answering_mid_run_ends_the_job_with_the_url_and_the_timeout(root, tmp_path, capsys,
                                                                                                job_log):
    stalled_at: list[float] = []

    def schedule(n: int) -> str | None:  # the start-up's reads and a few items' answered, then nothing ever again
        if n < 12:
            return None
        stalled_at.append(time.time())
        return "stall"

    with serve_with_faults(root, schedule) as url:
        document = json.loads(Path(loader_config(tmp_path, url, byte_budget=1, prefetch=0)).read_text())
        document["source"].update(timeout_s=1, retries=1)
        config = tmp_path / "remote.json"
        config.write_text(json.dumps(document))
        code = cli.main(["-c", str(config), "-v", "40", "-mi", "0", "--warmup", "0", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    log = job_log(tmp_path / "logs")
    assert code == 1, err
    assert re.fullmatch(rf"process step0-g0-r0 failed: FetchError: {re.escape(url)}/videos/\S+\.mp4: episode \d+, "
                        rf"camera {KEY}: read of bytes \[\d+, \d+\) failed after 2 attempts \(no complete answer within "
                        r"the timeout of 1 s\)", log.meta["error"]), log.meta["error"]
    assert err.count("no complete answer") == 1 and "Traceback" not in err
    assert 0 < len(log.rows) < 40
    assert log.meta["end_time"] - stalled_at[0] <= 1.0 * 2 + 0.2 + 2.0


def test_the_source_read_limits_are_checked_before_anything_starts(tmp_path, capsys):
    for key, value, expected in [("timeout_s", 0, "expected a number of seconds > 0, found 0"),
                                 ("retries", 11, "expected an integer from 0 to 10, found 11"),
                                 ("retries", True, "expected an integer from 0 to 10, found true")]:
        document = json.loads(Path(loader_config(tmp_path, "http://127.0.0.1:9/ds")).read_text())
        document["source"][key] = value
        config = tmp_path / "limits.json"
        config.write_text(json.dumps(document))
        assert refused(tmp_path, str(config), capsys) == f"{config}: source.{key}: {expected}"
