"""The episode byte-range data path: exact frames of one episode from its own bytes.

    from episodes import open_episodes, EpisodeByteCache
    ds = open_episodes(root)                 # LeRobot root or video glob; local path or any fsspec URL
    with EpisodeByteCache(ds) as cache:
        frames = cache.get_frames(ep, key, timestamps)   # uint8 (N, C, H, W)
        frames = cache.get_frames(ep, key, timestamps, fetch="windows")  # only the GOPs they need
        reads = cache.read_many([FrameRequest(ep, key, timestamps), ...])  # ranges coalesced across episodes

Implementation modules are private to the package; the names below are its API.
"""
from episodes._mp4 import MiniMp4
from episodes._cache import EpisodeByteCache
from episodes._reads import FETCH_MODES, CacheStats, FrameRead, FrameRequest, MiniRead
from episodes._dataset import EpisodeRecord, LeRobotDataset, VideoSegment, open_dataset
from episodes._decode import decode_frames, open_decoder
from episodes._errors import DatasetFormatError, EpisodeDataError, FetchError, Mp4FormatError
from episodes._source import EpisodeDataset, open_episodes
from episodes._video_files import VideoFilesDataset, open_video_files

__all__ = [
    "CacheStats",
    "FETCH_MODES",
    "DatasetFormatError",
    "EpisodeByteCache",
    "EpisodeDataError",
    "EpisodeDataset",
    "EpisodeRecord",
    "FetchError",
    "FrameRead",
    "FrameRequest",
    "LeRobotDataset",
    "MiniMp4",
    "MiniRead",
    "Mp4FormatError",
    "VideoFilesDataset",
    "VideoSegment",
    "decode_frames",
    "open_dataset",
    "open_episodes",
    "open_decoder",
    "open_video_files",
]
