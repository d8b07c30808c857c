"""Exact frames of LeRobot v3.0 episodes (or plain MP4 files) from each episode's own bytes.

    from episodes import EpisodeByteCache, FrameRequest, open_episodes
    ds = open_episodes(root)          # a LeRobot root or a glob of MP4s; a local path or any fsspec URL
    with EpisodeByteCache(ds, byte_budget=2**30, workers=8) as cache:
        frames = cache.get_frames(ep, key, timestamps)     # uint8 (N, C, H, W), timestamps in s from the episode start
        reads = cache.read_frames([FrameRequest(ep, key, frame_numbers=[0, 5]),
                                   FrameRequest(ep + 1, key, timestamps=[0.2])], fetch="windows")
        reads[0].frames, reads[0].bytes_fetched, reads[0].decode_s

Datasets. `open_episodes` (or `open_dataset` for a LeRobot root,
`open_video_files` for MP4s, one episode each) opens only the metadata and
returns an `EpisodeDataset`: `num_episodes`, `fps`, `video_keys`, `root`,
`episode_length(ep)`, `episode(ep)` (an `EpisodeRecord` with one
`VideoSegment` per camera) and `episode_columns(ep, columns)` (the data
Parquet's rows as numpy arrays). Every read goes through `storage`, one
fsspec filesystem with retries and exact range checks.

Frames. `EpisodeByteCache.read_frames(requests, fetch=..., device=...)` is
the one way to read frames; a `FrameRequest` names an episode, a camera and
`timestamps` (seconds from the episode's first frame) or `frame_numbers`
(0-based within the episode), or neither for every frame. `fetch` is a
`Fetch`: "episode" reads the episode's one byte range, wraps it into a
mini-MP4 and keeps it in an LRU of `byte_budget` bytes (prefetch fills it
ahead); "windows" reads only the samples the frames need, ranges closer than
`coalesce_gap` bytes (`DEFAULT_COALESCE_GAP`, LeRobot's 256 KiB) merged
across the requests of a batch. A read is a fetch phase then a decode phase,
and a caller that times or places them apart calls them itself:
`fetch_frames(requests)` gives `FetchedFrames` (picklable: the mini-MP4 and
the frame numbers), `decode_frames(fetched, device=...)` the `FrameRead`;
in a process without the cache, `decode_mini_mp4(mini, frame_numbers)`
decodes a mini-MP4 handed over (`open_decoder` gives a torchcodec decoder
over one). On a CUDA device torchcodec may silently decode on the CPU
instead of NVDEC: `FrameRead.backend` (a `DecodeBackend`, where its
`DecodeDevice` is "cpu", "nvdec" or "cpu-fallback") says which happened,
and `decode_backend(decoder, device)` asks a decoder of one's own.
`start_fetch(requests, fetch=..., ahead=...)` starts the fetch phase and
returns at once, one `FetchInFlight` per request: `result()` waits for its
bytes whole, `decode_frames` decodes it part by part as its range reads
land (read_frames does this: every request's reads start at once, and
the first decodes while the later ones are still on the wire); with
`ahead` (a prefetch for reads to come) a fetch starts only where its bytes
fit the budget. Kept mini-MP4s and the bytes of fetches not yet decoded
share `byte_budget` (`CacheStats.peak_bytes_held` never exceeds it while
one reader reads at a time). `get_frames(ep, key, timestamps)` is
read_frames of one request, frames only. `index_files(paths)` readies MP4 indexes ahead of reads and
`stats()` returns the running `CacheStats`. Frames are bit-identical to
torchcodec's exact decode of the whole source file.

The cache directory. The library writes nothing unless given a directory:
`EpisodeByteCache(ds, cache_dir=DIR)` keeps every file's MP4 index in a
sidecar under DIR, so a later cache over the same root reads no MP4 header,
and `open_dataset(root, usage_cache_dir=DIR)` keeps memmapped usage-format
copies of the data columns there. Both live in one subdirectory per dataset
root (named by a hash of its URL or real path), never inside the dataset, so
read-only and remote datasets work alike. Without a directory, each cache
builds its indexes from the MP4 headers, once per file, in memory, and data
columns are read from Parquet every time.

Errors are `EpisodeDataError`s (`DatasetFormatError`, `Mp4FormatError`,
`FetchError`) whose message is one sentence naming the file, and the
episode and camera where known. The package logs through `logging` under
"episodes" and never prints or installs handlers; the command line
(`python -m episodes verify|bench`) shows those records on stderr.

The modules with a leading underscore are the implementation and private;
the names below are the API. `episodes.synthetic` writes synthetic
datasets (every frame showing its index), imported by name since it needs
an encoder. Two subpackages sit beside the library and are never imported
by it: `episodes.tools` (what `python -m episodes` runs: the full-file check
and LeRobot's streaming benchmark tracks) and `episodes.testing` (nginx and
faulty HTTP servers, a slow network link, for tests and benchmarks).
"""
from episodes._cache import DEFAULT_COALESCE_GAP, EpisodeByteCache
from episodes._dataset import EpisodeRecord, LeRobotDataset, VideoSegment, open_dataset
from episodes._decode import (
    DecodeBackend,
    DecodeDevice,
    decode_backend,
    decode_mini_mp4,
    open_decoder,
)
from episodes._errors import DatasetFormatError, EpisodeDataError, FetchError, Mp4FormatError
from episodes._inflight import FetchInFlight
from episodes._mp4 import MiniMp4
from episodes._reads import CacheStats, Fetch, FetchedFrames, FrameRead, FrameRequest
from episodes._source import EpisodeDataset, SourceKind, open_episodes
from episodes._storage import Storage
from episodes._video_files import VideoFilesDataset, open_video_files

__all__ = [
    "DEFAULT_COALESCE_GAP",
    "CacheStats",
    "DatasetFormatError",
    "DecodeBackend",
    "DecodeDevice",
    "EpisodeByteCache",
    "EpisodeDataError",
    "EpisodeDataset",
    "EpisodeRecord",
    "Fetch",
    "FetchError",
    "FetchInFlight",
    "FetchedFrames",
    "FrameRead",
    "FrameRequest",
    "LeRobotDataset",
    "MiniMp4",
    "Mp4FormatError",
    "SourceKind",
    "Storage",
    "VideoFilesDataset",
    "VideoSegment",
    "decode_backend",
    "decode_mini_mp4",
    "open_dataset",
    "open_decoder",
    "open_episodes",
    "open_video_files",
]
