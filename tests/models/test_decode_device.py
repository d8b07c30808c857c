"""Where a loader's frames decode: NVDEC, the CPU, or torchcodec's silent CPU fallback on a GPU runner.

Without a GPU, torchcodec's CUDA decoder is faked at the public seams: a
decoder whose `cpu_fallback` is torchcodec's own CpuFallbackStatus in a
given state, and an EpisodeByteCache whose reads report a given backend.
The real NVDEC runs in bench/gpu_check.py and the GPU tests.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torchcodec.decoders import CpuFallbackStatus

from episodes import DecodeBackend, EpisodeByteCache, FetchedFrames, FrameRead, decode_backend
from episodes.synthetic import make_dataset
from models.episode import EpisodeDecoder, EpisodeFetcher, EpisodeLoader
from models.episode_decode import DecodeWatch, NvdecUnavailable
from models.r2p1d import R2P1DSingleStep
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard
from rnb.pipeline.config import parse_config
from rnb.pipeline.plan import plan_runners, warmup_request

CUDA = torch.device("cuda:0")  # named, never used: the fakes decode on the CPU
UNAVAILABLE = "[CUDA] Fallback status: Falling back due to: NVcuvid unavailable"
SPEC = dict(episodes=3, cameras=1, episodes_per_file=3, min_length=12, max_length=16, width=64, height=64, gop=8)


def _status(fallback: bool, known: bool = True, nvcuvid_missing: bool = False) -> CpuFallbackStatus:
    """torchcodec's own status object in the state its CUDA decoder leaves it."""
    status = CpuFallbackStatus(status_known=known)
    status._backend = "CUDA"
    status._is_fallback = fallback
    status._nvcuvid_unavailable = nvcuvid_missing
    status._video_not_supported = fallback and not nvcuvid_missing
    return status


class FakeDecoder:
    def __init__(self, status: CpuFallbackStatus) -> None:
        self.cpu_fallback = status


def test_torchcodec_s_fallback_status_names_the_decode_device():
    assert decode_backend(FakeDecoder(_status(False)), "cuda:0") == DecodeBackend(
        "nvdec", "[CUDA] Fallback status: No fallback required")
    assert decode_backend(FakeDecoder(_status(True, nvcuvid_missing=True)), CUDA) == DecodeBackend(
        "cpu-fallback", UNAVAILABLE)
    assert decode_backend(FakeDecoder(_status(True)), CUDA).detail == (
        "[CUDA] Fallback status: Falling back due to: Video not supported")
    assert decode_backend(FakeDecoder(_status(False, known=False)), CUDA).device == "cpu-fallback"  # not seen: not NVDEC
    assert decode_backend(FakeDecoder(_status(True)), "cpu") == DecodeBackend("cpu")


def test_a_watch_notes_each_backend_once_sets_each_card_and_refuses_the_fallback_if_asked():
    watch = DecodeWatch("EpisodeLoader", CUDA, require_nvdec=False)
    card = TimeCard(1)
    for _ in range(2):
        watch.saw(DecodeBackend("nvdec", "[CUDA] Fallback status: No fallback required"), "episode 0", card)
    watch.saw(DecodeBackend("cpu-fallback", UNAVAILABLE), "episode 4 of data/x (cam)")
    assert card.fields == {"decode_device": "nvdec"}
    assert watch.notes == [
        "EpisodeLoader on cuda:0: frames decode on NVDEC ([CUDA] Fallback status: No fallback required)",
        f"EpisodeLoader on cuda:0: torchcodec decodes episode 4 of data/x (cam) on the CPU instead of NVDEC "
        f"({UNAVAILABLE}), then copies the frames to the GPU: decode times are the CPU's; "
        "\"require_nvdec\": true refuses this"]
    strict = DecodeWatch("EpisodeLoader", CUDA, require_nvdec=True)
    with pytest.raises(NvdecUnavailable) as caught:
        strict.saw(DecodeBackend("cpu-fallback", UNAVAILABLE), "episode 4 of data/x (cam)", TimeCard(2))
    assert str(caught.value) == ("EpisodeLoader on cuda:0: require_nvdec is set, but torchcodec decodes episode 4 of "
                                 f"data/x (cam) on the CPU instead of NVDEC ({UNAVAILABLE})")
    on_cpu = DecodeWatch("EpisodeLoader", torch.device("cpu"), require_nvdec=True)  # decodes on the CPU by design
    on_cpu.saw(DecodeBackend("cpu"), "episode 0", card)
    assert on_cpu.notes == [] and card.fields["decode_device"] == "cpu"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_dataset(tmp_path_factory.mktemp("nvdec") / "ds", **SPEC))


def _request(root: str, episode: int) -> dict[str, Any]:
    return {"request": EpisodeRequest("dataset", root, episode)}


@pytest.fixture
def falls_back(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Reads on a CUDA device decode on the CPU and say they fell back, as torchcodec's CUDA decoder would."""
    decoded_on: list[str] = []
    real = EpisodeByteCache.decode_frames

    def decode_frames(self: EpisodeByteCache, fetched: FetchedFrames, *, device: str | torch.device = "cpu") -> FrameRead:
        decoded_on.append(str(device))
        read = real(self, fetched, device="cpu")
        return dataclasses.replace(read, backend=DecodeBackend("cpu-fallback", UNAVAILABLE)) if str(device) != "cpu" else read
    monkeypatch.setattr(EpisodeByteCache, "decode_frames", decode_frames)
    return decoded_on


def test_a_loader_warms_up_on_the_source_s_first_episode_and_says_where_it_decodes(root: str, falls_back: list[str]):
    loader = EpisodeLoader(CUDA, num_clips=2, clip_length=3, size=16, warmup_request=EpisodeRequest("dataset", root, 1))
    assert falls_back == ["cuda:0"]  # the warm-up's one decoder, before any item
    assert loader.notes[0].startswith(f"EpisodeLoader on cuda:0: torchcodec decodes episode 1 of {root} (")
    assert loader.notes[1].startswith("EpisodeLoader on cuda:0: warm-up decoded one frame of episode 1 before the start (")
    cache = loader.reader._dataset("dataset", root)[1]
    assert cache.stats().cached_items == 0  # the warm-up kept nothing: the first measured item fetches as it would
    card = TimeCard(0)
    (clips,), _, _ = loader((), _request(root, 1), card)
    assert clips.shape == (2, 3, 3, 16, 16) and card.fields["decode_device"] == "cpu-fallback"
    assert len(loader.notes) == 2  # the same fallback again is no new note


def test_require_nvdec_refuses_the_fallback_at_the_warm_up(root: str, falls_back: list[str]):
    with pytest.raises(NvdecUnavailable, match=r"EpisodeLoader on cuda:0: require_nvdec is set, but torchcodec "
                                                r"decodes episode 0 of .* on the CPU instead of NVDEC \(\[CUDA\]"):
        EpisodeLoader(CUDA, size=16, require_nvdec=True, warmup_request=EpisodeRequest("dataset", root, 0))


def test_require_nvdec_refuses_an_item_that_falls_back(root: str, falls_back: list[str]):
    loader = EpisodeLoader(CUDA, num_clips=1, clip_length=2, size=16, require_nvdec=True)  # no warm-up: no source
    assert loader.notes == [] and falls_back == []
    with pytest.raises(NvdecUnavailable, match="decodes episode 2 of"):
        loader((), _request(root, 2), TimeCard(0))


def test_cpu_loaders_record_cpu_decoding_and_warm_up_too(root: str):
    loader = EpisodeLoader(torch.device("cpu"), num_clips=1, clip_length=2, size=16, dataset=root, require_nvdec=True)
    assert len(loader.notes) == 1 and "warm-up decoded one frame of episode 0" in loader.notes[0]
    card = TimeCard(0)
    loader((), {"request": 0}, card)
    assert card.fields["decode_device"] == "cpu"
    fetcher = EpisodeFetcher(torch.device("cpu"), num_clips=1, clip_length=2, max_bytes=2**20)
    (data,), between, card = fetcher((), _request(root, 1), TimeCard(1))
    decoder = EpisodeDecoder(torch.device("cpu"), num_clips=1, clip_length=2, size=16,
                             warmup_request=EpisodeRequest("dataset", root, 0))
    assert "EpisodeDecoder on cpu: warm-up decoded one frame of episode 0" in decoder.notes[0]
    decoder((data,), between, card)
    assert card.fields["decode_device"] == "cpu"
    single = R2P1DSingleStep(torch.device("cpu"), dataset=root, num_clips=1, clip_length=2, size=16, warmup=0)
    assert "warm-up decoded one frame" in single.notes[0] and single.notes[1].startswith("R2P1DRunner stages 1-5")


def test_the_plan_hands_loaders_the_source_s_first_request(root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    assert warmup_request({"dataset": "data/x", "episodes": [5, 2]}, "c.json") == EpisodeRequest(
        "dataset", str(tmp_path / "data/x"), 5)
    assert warmup_request({"videos": "http://host/*.mp4"}, "c.json") == EpisodeRequest("videos", "http://host/*.mp4", 0)
    assert warmup_request({"synthetic": True}, "c.json") is None
    config = parse_config({"source": {"dataset": root}, "pipeline": [
        {"model": "models.episode.EpisodeFetcher", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "models.episode.EpisodeDecoder", "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]},
        {"model": "tests.support.fixture_models.Head", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}, "split.json")
    fetch, decode, head = plan_runners(config, 1)
    assert "warmup_request" not in fetch.model_kwargs and "warmup_request" not in head.model_kwargs
    assert decode.model_kwargs["warmup_request"] == EpisodeRequest("dataset", root, 0)
