"""What a loader model is asked for: one episode of a dataset or of a glob of videos, and the ones that come next.

The pipeline builds these from a config's `source` (rnb.pipeline.dataset_source)
and a model reads them; the record lives here, in the model contract, so that
a model imports rnb.core and episodes only, never the pipeline's checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

# What a request's root names: a LeRobot dataset, or a glob of video files (episodes' SourceKind).
RequestKind: TypeAlias = Literal["dataset", "videos"]
# The episodes library's own read limits (Storage), what a source that sets neither gets.
READ_TIMEOUT_S = 30.0
READ_RETRIES = 3


@dataclass(frozen=True, repr=False)
class EpisodeRequest:
    """A request payload: which episode of which dataset, and the episodes that come next."""

    kind: RequestKind
    root: str                     # dataset root, or the video glob
    episode: int
    upcoming: tuple[int, ...] = ()
    timeout_s: float = READ_TIMEOUT_S   # the source's read limits: how long one attempt may take,
    retries: int = READ_RETRIES         # and how often a read is tried again

    def __repr__(self) -> str:
        # The payload column of timings.parquet: short, and enough to find the episode again.
        return f"{self.root}#{self.episode}"
