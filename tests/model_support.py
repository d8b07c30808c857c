"""What the shipped R(2+1)D pipelines must predict, worked out in the test process for the items a job logged."""
from __future__ import annotations

import torch

from episodes import SourceKind
from models.episode import EpisodeLoader
from models.r2p1d import R2P1DRunner
from rnb.core.episode_request import EpisodeRequest
from rnb.core.timecard import TimeCard
from rnb.pipeline.config import load_config

CPU = torch.device("cpu")


def whole_model_predictions(config_path: str, kind: SourceKind, root: str, rows: list[dict]) -> list[int]:
    """Each row's class as one process finds it: the config's loader draws the item's clips (its rng seeded by the
    item id, as in the job), its R(2+1)D step runs them whole, and the clips' logits summed give the class
    (models.aggregator.Aggregator's rule).  A pipeline that splits clips into segments must agree."""
    loader_step, runner_step = load_config(config_path).steps[:2]
    loader = EpisodeLoader(CPU, **loader_step.model_kwargs)
    runner = R2P1DRunner(CPU, **{**runner_step.model_kwargs, "warmup": 0})
    predictions = []
    for row in rows:
        card = TimeCard(row["item_id"])
        (clips,), _, _ = loader((), {"request": EpisodeRequest(kind, root, row["episode"])}, card)
        assert clips.shape[0] == row["num_clips"], row
        (logits,), _, _ = runner((clips,), {}, card)
        predictions.append(int(logits.sum(0).argmax()))
    return predictions
