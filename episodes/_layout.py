"""The LeRobot v3.0 layout, named once: where the files lie and what the episodes table holds.

The reader (episodes._dataset) and the generator (episodes.synthetic) both
use these names, so a dataset we write is by construction one we can read.
Templates are LeRobot's defaults; a dataset's own `data_path` and
`video_path` in info.json take precedence when reading.
"""
from __future__ import annotations

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_GLOB = "meta/episodes/chunk-*/file-*.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"

# Columns of the episodes table: one row per episode.
EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index",
                   "dataset_from_index", "dataset_to_index")
VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")

# The data table's global row number, which dataset_from_index/dataset_to_index refer to.
ROW_INDEX = "index"


def video_column(key: str, field: str) -> str:
    """The episodes-table column of camera `key`'s `field` (one of VIDEO_FIELDS)."""
    return f"videos/{key}/{field}"
