"""What the shipped R(2+1)D pipelines must predict, worked out in the test process for the items a job logged."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from episodes import SourceKind, open_dataset
from episodes._mp4.span import episode_span
from episodes.synthetic import make_dataset
from models.episode import EpisodeLoader
from models.r2p1d import R2P1DRunner
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard
from rnb.pipeline.config import load_config
from tests.support.mp4_fixtures import read_index

CPU = torch.device("cpu")


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """R(2+1)D computed in the test process on one intra-op thread, then the process's count back.

    Tests assert what the network computes, never how fast; the second
    thread only spin-waits for the first while the other pytest worker's
    jobs hold the cores, which made the same passes three times slower in
    wall time and twice the CPU on this two-core machine
    (docs/measurements/2026-12-06-test-loop-local-engine.md).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def whole_model_predictions(config_path: str, kind: SourceKind, root: str, rows: list[dict]) -> list[int]:
    """Each row's class as one process finds it: the config's loader draws the item's clips (its rng seeded by the
    item id, as in the job), its R(2+1)D step runs them whole, and the clips' logits summed give the class
    (models.aggregator.Aggregator's rule).  A pipeline that splits clips into segments must agree."""
    loader_step, runner_step = load_config(config_path).steps[:2]
    loader = EpisodeLoader(CPU, **loader_step.model_kwargs)
    with one_torch_thread():
        runner = R2P1DRunner(CPU, **{**runner_step.model_kwargs, "warmup": 0})
    predictions = []
    for row in rows:
        card = TimeCard(row["item_id"])
        (clips,), _, _ = loader((), {"request": EpisodeRequest(kind, root, row["episode"])}, card)
        assert clips.shape[0] == row["num_clips"], row
        with one_torch_thread():
            (logits,), _, _ = runner((clips,), {}, card)
        predictions.append(int(logits.sum(0).argmax()))
    return predictions


def tiny_dataset(root: Path) -> Path:
    """Four short 64x64 H.264 episodes with B-frames, two per file: enough to cross a file boundary."""
    return make_dataset(root, episodes=4, cameras=1, episodes_per_file=2, min_length=12, max_length=20,
                        width=64, height=64, gop=8, bframes=2)


def episode_range_bytes(root: str, ep: int) -> int:
    """The size of the episode's one byte range, worked out from its MP4 index."""
    ds = open_dataset(root)
    segment = ds.episode(ep).videos[ds.video_keys[0]]
    index = read_index(Path(root) / segment.path)
    return episode_span(index, segment.from_timestamp, segment.to_timestamp).num_bytes
