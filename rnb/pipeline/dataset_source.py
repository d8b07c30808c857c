"""Episode sources: requests for the episodes of a LeRobot dataset or of a glob of video files.

    "source": {"dataset": "data/synthetic", "order": "random", "seed": 0}
    "source": {"videos": "clips/*.mp4", "order": "sequential", "episodes": [0, 2, 5]}

Keys: `order` "random" (default; reshuffled every pass) or "sequential";
`seed` (default: the job's --seed); `episodes`, a subset of episode indices
(for videos: of the sorted file list); `lookahead` (default 2), how many of
the next episodes each request names so a loader can prefetch them;
`generate_if_missing` (dataset only), which writes the synthetic dataset at a
missing local root first; for a remote root (any URL), `timeout_s` (default
30), how long one attempt of a read may take, its whole answer included, and
`retries` (default 3), how often a read that timed out or failed in passing
is tried again: a server that stops answering fails the read, and the job,
within timeout_s x (retries + 1) plus the backoff between attempts.
Requests cycle when -v exceeds the episodes.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import random
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rnb.core.episode_request import READ_RETRIES, READ_TIMEOUT_S, EpisodeRequest
from rnb.core.records import Json
from rnb.pipeline.config_records import ConfigError, PipelineConfig, describe

if TYPE_CHECKING:
    from episodes import EpisodeDataset, SourceKind

log = logging.getLogger(__name__)

KINDS: tuple[SourceKind, ...] = ("dataset", "videos")
_READS = ("timeout_s", "retries")
_KEYS: dict[SourceKind, tuple[str, ...]] = {
    "dataset": ("dataset", "order", "seed", "episodes", "lookahead", "generate_if_missing", *_READS),
    "videos": ("videos", "order", "seed", "episodes", "lookahead", *_READS)}
MAX_RETRIES = 10  # backoff doubles each time: 10 retries already wait 0.2 x 1023 s between them


@dataclass(frozen=True)
class SourceOptions:
    kind: SourceKind
    root: str
    order: str
    seed: int | None
    episodes: tuple[int, ...] | None
    lookahead: int
    generate_if_missing: bool
    timeout_s: float = READ_TIMEOUT_S
    retries: int = READ_RETRIES


def parse_options(source: Mapping[str, Json], config_path: str) -> SourceOptions:
    """The source object's keys, type-checked; each complaint names its JSON path."""
    first = next(iter(source))
    kind = next(known for known in KINDS if known == first)   # SOURCE_FACTORIES sends no other kind here
    for key in source:
        if key not in _KEYS[kind]:
            raise ConfigError(config_path, f"source.{key}", f"expected one of the {kind} source keys "
                              f"({', '.join(_KEYS[kind])}), found an unknown key")
    root = source[kind]
    if not isinstance(root, str) or not root:
        raise ConfigError(config_path, f"source.{kind}", f"expected a non-empty path or URL string, found {describe(root)}")
    order = source.get("order", "random")
    if not isinstance(order, str) or order not in ("random", "sequential"):
        raise ConfigError(config_path, "source.order", f"expected \"random\" or \"sequential\", found {describe(order)}")
    seed = source.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigError(config_path, "source.seed", f"expected an integer >= 0, found {describe(seed)}")
    episodes = source.get("episodes")
    subset: list[int] | None = None
    if episodes is not None:
        if not isinstance(episodes, list) or not episodes:
            raise ConfigError(config_path, "source.episodes", f"expected a non-empty list of episode indices, "
                              f"found {describe(episodes)}")
        subset = []
        for i, ep in enumerate(episodes):
            if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0:
                raise ConfigError(config_path, f"source.episodes[{i}]", f"expected an integer >= 0, found {describe(ep)}")
            subset.append(ep)
    lookahead = source.get("lookahead", 2)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise ConfigError(config_path, "source.lookahead", f"expected an integer >= 0, found {describe(lookahead)}")
    generate = source.get("generate_if_missing", False)
    if not isinstance(generate, bool):
        raise ConfigError(config_path, "source.generate_if_missing", f"expected true or false, found {describe(generate)}")
    timeout = source.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise ConfigError(config_path, "source.timeout_s", f"expected a number of seconds > 0, found {describe(timeout)}")
    retries = source.get("retries")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)
                                or not 0 <= retries <= MAX_RETRIES):
        raise ConfigError(config_path, "source.retries", f"expected an integer from 0 to {MAX_RETRIES}, "
                                                         f"found {describe(retries)}")
    return SourceOptions(kind, root, order, seed, None if subset is None else tuple(subset), lookahead, generate,
                         READ_TIMEOUT_S if timeout is None else float(timeout), READ_RETRIES if retries is None else retries)


def _open_checked(options: SourceOptions, config_path: str) -> EpisodeDataset:
    from episodes import EpisodeDataError, open_episodes  # heavy (torchcodec): only processes that read pay

    if options.kind == "videos":
        _check_not_directory(options.root, config_path)
    try:
        ds = open_episodes(options.root, options.kind, timeout_s=options.timeout_s, retries=options.retries)
    except (EpisodeDataError, OSError, ValueError) as error:
        expected = ("a LeRobot v3.0 dataset" if options.kind == "dataset"
                    else "a glob matching MP4 files (--dataset \"GLOB\" names other files)")
        raise ConfigError(config_path, f"source.{options.kind}", f"expected {expected}, found an error: {error}") from None
    for i, ep in enumerate(options.episodes or ()):
        if ep >= ds.num_episodes:
            raise ConfigError(config_path, f"source.episodes[{i}]", f"expected an episode index below {ds.num_episodes} "
                              f"(the number of episodes of {options.root}), found {ep}")
    return ds


def _check_not_directory(root: str, config_path: str) -> None:
    """A directory would be taken for one video file and fail at the first request: name the glob instead."""
    import fsspec
    from fsspec.core import has_magic

    try:
        fs, path = fsspec.core.url_to_fs(root)
        is_dir = not has_magic(path) and fs.isdir(path)
    except (OSError, ValueError, ImportError):  # an unreachable URL is _open_checked's to report
        return
    if is_dir:
        base = root.rstrip("/")
        raise ConfigError(config_path, "source.videos", f"expected a glob of video files such as \"{base}/*.mp4\" "
                          f"(\"{base}/**/*.mp4\" to include subdirectories), found the directory {root}")


def check_source(source: Mapping[str, Json], config_path: str, may_write: bool = True) -> EpisodeDataset | None:
    """Open the dataset or glob once in the main process (writing the dataset first if asked and missing).

    Without `may_write` (--check) a dataset that a run would generate is left missing, and said so (None
    is returned then).  Over HTTP one byte of the first video is read by range, so a server that ignores
    Range requests is refused here.
    """
    options = parse_options(source, config_path)
    if options.generate_if_missing and "://" not in options.root and not Path(options.root).exists():
        if not may_write:
            log.info("dataset %s is missing: a run (without --check) generates it there", options.root)
            return None
        from episodes.synthetic import make_dataset

        log.info("dataset %s is missing: generating the synthetic dataset there "
                 "(scripts/make_dataset.py with default options)", options.root)
        make_dataset(options.root)
    ds = _open_checked(options, config_path)
    _probe_ranges(ds, options, config_path)
    return ds


def _probe_ranges(ds: EpisodeDataset, options: SourceOptions, config_path: str) -> None:
    """Read one byte of the first video by range, so a server that ignores Range requests is refused now."""
    from episodes import EpisodeDataError

    try:
        videos = ds.episode(0).videos if ds.num_episodes else {}
        for segment in list(videos.values())[:1]:
            ds.storage.probe_ranges(segment.path)
    except EpisodeDataError as error:
        raise ConfigError(config_path, f"source.{options.kind}", "expected a server that answers byte-range "
                          f"requests, found an error: {error}") from None


def episode_source(source: Mapping[str, Json], config_path: str, seed: int = 0) -> Iterator[EpisodeRequest]:
    """The client's request stream for a dataset or videos source."""
    options = parse_options(source, config_path)
    return requests(options, _open_checked(options, config_path).num_episodes, seed)


def requests(options: SourceOptions, num_episodes: int, seed: int = 0) -> Iterator[EpisodeRequest]:
    """Endless requests in the source's order, each naming the `lookahead` episodes after it."""
    order = _episode_order(options.episodes or tuple(range(num_episodes)), options.order,
                           seed if options.seed is None else options.seed)
    window = deque(itertools.islice(order, options.lookahead + 1))
    while True:
        episode = window.popleft()
        window.append(next(order))
        yield EpisodeRequest(options.kind, options.root, episode, tuple(window)[: options.lookahead], options.timeout_s,
                             options.retries)


def _episode_order(episodes: tuple[int, ...], order: str, seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        batch = list(episodes)
        if order == "random":
            rng.shuffle(batch)
        yield from batch


def with_dataset(config: PipelineConfig, root: str) -> PipelineConfig:
    """The config with its dataset root or video glob replaced (benchmark.py --dataset).

    The config's generate_if_missing concerns its own root: a dataset named on the command line is the
    user's data, and a path that does not exist there is a mistake to report, not a place to write.
    """
    kind = next(iter(config.source), "synthetic")
    if kind not in KINDS:
        raise ConfigError("command line", "--dataset", f"expected a config whose source is a dataset or videos, "
                          f"but {config.path} has a {kind} source")
    source = {key: value for key, value in config.source.items() if key != "generate_if_missing"}
    source[kind] = root
    # the source now says where requests come from, instead of an RnB iterator it replaced
    raw = {key: value for key, value in config.raw.items() if key != "video_path_iterator"}
    return dataclasses.replace(config, source=source, raw={**raw, "source": source})
