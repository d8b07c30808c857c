"""Every model class this package ships, each held to rnb.core.model's contract where mypy reads it.

The runner loads a model by its dotted path, as an untyped object, so the
contract is checked here instead: a class whose constructor does not take
the device first, whose `output_shape` is missing or narrower, or whose
instances' call differs from `StepModel` fails `mypy` at this tuple.
tests/models/test_models.py holds the tuple complete: every model class in
`models/` is in it.
"""
from __future__ import annotations

from models.aggregator import Aggregator
from models.batcher import Batcher
from models.episode import EpisodeDecoder, EpisodeFetcher, EpisodeLoader
from models.r2p1d import R2P1DRunner, R2P1DSingleStep
from models.toy import AsyncSleep, CpuSpin, GpuSpin, SegmentMerger, SyncSleep, SyntheticFrames, TinyConvNet
from rnb.core.model import StepModelClass

MODEL_CLASSES: tuple[StepModelClass, ...] = (
    Aggregator, Batcher, EpisodeLoader, EpisodeFetcher, EpisodeDecoder, R2P1DRunner, R2P1DSingleStep,
    SyntheticFrames, TinyConvNet, SegmentMerger, AsyncSleep, SyncSleep, CpuSpin, GpuSpin)
