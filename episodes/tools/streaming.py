"""LeRobot's episode-streaming benchmark tracks, run over one dataset: `python -m episodes bench`.

Each track reads the same kind of targets a training loader would and
reports what it cost:
- indexed: whole-episode byte ranges through the cache, `prefetch_ahead`
  episodes ahead (LeRobot's "indexed");
- windows: the same episodes and timestamps, read as frame windows
  coalesced across episodes of a file (one batch);
- random-frames: `frame_pool_size` random (episode, camera, instant) targets
  over the whole dataset, read as frame windows;
- remote-decoder: torchcodec over the source MP4 itself, opened through
  fsspec in approximate mode and kept per file, as LeRobot's loader does;
- tabular: each pooled episode's data columns from Parquet row groups, then
  from the usage-format cache (under `cache_dir`, else a temporary directory).
Without `include_decode` the cache tracks only fetch and build mini-MP4s
(LeRobot's default); with it every track decodes its frames, and the
decoded frames of windows and remote-decoder are compared with indexed's.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import resource
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace

import fsspec
import numpy as np
import torch
from torchcodec.decoders import VideoDecoder

from episodes import CacheStats, EpisodeByteCache, EpisodeDataError, EpisodeDataset, FrameRequest, LeRobotDataset

log = logging.getLogger(__name__)

TRACKS = ("indexed", "windows", "random-frames", "remote-decoder", "tabular")
STAGES = ("lookup", "fetch", "synthesize", "store", "decode")
TABULAR_COLUMNS = ("observation.state", "action")
_LEAST = {"pool_size": 1, "frames_per_episode": 1, "frame_pool_size": 1, "workers": 1, "coalesce_gap_kb": 0,
          "prefetch_ahead": 0, "seed": 0}


@dataclass(frozen=True)
class StreamingOptions:
    """The knobs, named as LeRobot's benchmark names them (--pool-size, ...).

    `cache_dir` is where the caches keep MP4 indexes (unless `use_sidecar`
    is False) and usage-format copies; with None nothing persists (the
    tabular track then copies into a temporary directory).
    """

    pool_size: int = 16
    frames_per_episode: int = 16
    frame_pool_size: int = 4096
    coalesce_gap_kb: int = 256
    workers: int = 8
    prefetch_ahead: int = 8
    include_decode: bool = False
    seed: int = 0
    use_sidecar: bool = True
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value, least = getattr(self, f.name), _LEAST.get(f.name)
            if least is not None and value < least:
                raise ValueError(f"--{f.name.replace('_', '-')} must be at least {least}, got {value}")


@dataclass(frozen=True)
class TrackResult:
    """One track's row. Stage times are milliseconds per camera job; bytes are source bytes.

    `ranges_before` counts the windows' merged runs (or one per episode
    range), `ranges_after` the range requests actually made. `frames_match`
    is None when frames were not compared.
    """

    track: str
    index_s: float = 0.0
    index_source: str = "-"
    jobs: int = 0
    samples: int = 0
    wall_s: float = 0.0
    stage_ms: dict[str, float] = field(default_factory=dict)
    bytes_planned: int = 0
    bytes_fetched: int = 0
    bytes_useful: int = 0
    windows: int = 0
    ranges_before: int = 0
    ranges_after: int = 0
    peak_rss_bytes: int | None = None
    frames_match: bool | None = None
    note: str = ""
    error: str = ""

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else float("nan")


Targets = dict[tuple[int, str], np.ndarray]  # (episode, camera) -> seconds from the episode's start


def episode_pool(ds: EpisodeDataset, options: StreamingOptions) -> list[int]:
    """`pool_size` distinct episodes drawn with `seed` (all of them when the dataset has fewer)."""
    rng = np.random.default_rng(options.seed)
    count = min(options.pool_size, ds.num_episodes)
    return sorted(rng.choice(ds.num_episodes, size=count, replace=False).tolist())


def _instants(rng: np.random.Generator, length: int, fps: float, count: int) -> np.ndarray:
    """`count` sorted instants uniform over an episode's frames, in seconds from its start."""
    return np.sort(rng.integers(0, length, size=count)) / fps


def pool_targets(ds: EpisodeDataset, pool: Sequence[int], options: StreamingOptions) -> Targets:
    """`frames_per_episode` random instants per pooled episode and camera."""
    rng = np.random.default_rng(options.seed + 1)
    return {(ep, key): _instants(rng, ds.episode_length(ep), ds.fps, options.frames_per_episode)
            for ep in pool for key in ds.video_keys}


def random_targets(ds: EpisodeDataset, options: StreamingOptions) -> Targets:
    """`frame_pool_size` random (episode, camera, frame) targets over the whole dataset, grouped per episode-camera.

    Groups keep the order in which their first target was drawn, the order a
    shuffling loader would ask for them; instants within a group are sorted.
    """
    rng = np.random.default_rng(options.seed + 2)
    episodes = rng.integers(0, ds.num_episodes, size=options.frame_pool_size)
    cameras = rng.integers(0, len(ds.video_keys), size=options.frame_pool_size)
    grouped: dict[tuple[int, str], list[int]] = {}
    for ep, camera in zip(episodes.tolist(), cameras.tolist()):
        grouped.setdefault((ep, ds.video_keys[camera]), []).append(int(rng.integers(0, ds.episode_length(ep))))
    return {slot: np.sort(np.asarray(frames)) / ds.fps for slot, frames in grouped.items()}


class PeakRss:
    """The peak resident memory of this process during a block (Linux resets the mark; elsewhere the lifetime peak)."""

    def __enter__(self) -> PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            with open("/proc/self/status") as f:
                peak = re.search(r"VmHWM:\s+(\d+)", f.read())
        except OSError:
            peak = None
        self.bytes = int(peak.group(1)) * 1024 if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _digest(arrays: Iterable[torch.Tensor | np.ndarray]) -> str:
    """One hash over the bytes of every array, in order: equal digests mean equal frames (or values)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a).tobytes())
    return h.hexdigest()


def _cache(ds: EpisodeDataset, options: StreamingOptions) -> EpisodeByteCache:
    return EpisodeByteCache(ds, byte_budget=2**40, workers=options.workers,
                            cache_dir=options.cache_dir if options.use_sidecar else None,
                            coalesce_gap=options.coalesce_gap_kb * 1024)


def _index_files(cache: EpisodeByteCache, ds: EpisodeDataset, slots: Iterable[tuple[int, str]]) -> tuple[float, str]:
    """Seconds to have the MP4 index of every file the targets touch, and where the indexes came from."""
    started = time.perf_counter()
    cache.index_files(sorted({ds.episode(ep).videos[key].path for ep, key in slots}))
    stats = cache.stats()
    source = "sidecar" if stats.index_builds == 0 else "headers" if stats.index_sidecar_loads == 0 else "both"
    return time.perf_counter() - started, source


def _cache_row(track: str, before: CacheStats, after: CacheStats, jobs: int, *, index_s: float, index_source: str,
               samples: int, wall_s: float, peak_rss_bytes: int, note: str) -> TrackResult:
    """A track's row from the cache's totals over the timed part."""
    def delta(name: str) -> float:
        return getattr(after, name) - getattr(before, name)

    stage_ms = {stage: 1000 * delta(f"{stage}_s") / max(jobs, 1) for stage in STAGES}
    return TrackResult(track, index_s=index_s, index_source=index_source, jobs=jobs, samples=samples, wall_s=wall_s,
                       stage_ms=stage_ms, bytes_planned=int(delta("bytes_planned")),
                       bytes_fetched=int(delta("bytes_fetched")), bytes_useful=int(delta("bytes_useful")),
                       windows=int(delta("windows")), ranges_before=int(delta("window_runs")) or int(delta("misses")),
                       ranges_after=int(delta("range_requests")), peak_rss_bytes=peak_rss_bytes, note=note)


# ---- tracks ----------------------------------------------------------------


def indexed_track(ds: EpisodeDataset, targets: Targets, options: StreamingOptions) -> tuple[TrackResult, str]:
    """Whole episodes through the cache, `prefetch_ahead` episodes ahead; the row and a digest of the frames."""
    frames: list[torch.Tensor] = []
    episodes = list(dict.fromkeys(ep for ep, _ in targets))
    with _cache(ds, options) as cache, PeakRss() as rss:
        index_s, source = _index_files(cache, ds, targets)
        before, started = cache.stats(), time.perf_counter()
        for ahead in episodes[: options.prefetch_ahead]:
            cache.prefetch(ahead)
        for position, ep in enumerate(episodes):
            if position + options.prefetch_ahead < len(episodes):
                cache.prefetch(episodes[position + options.prefetch_ahead])
            for key in ds.video_keys:
                if (ep, key) not in targets:
                    continue
                if options.include_decode:
                    frames.append(cache.get_frames(ep, key, targets[(ep, key)]))
                else:
                    cache.fetch_frames([FrameRequest(ep, key, timestamps=targets[(ep, key)])])
        wall_s, after = time.perf_counter() - started, cache.stats()
    row = _cache_row("indexed", before, after, len(targets), index_s=index_s, index_source=source,
                     samples=sum(len(t) for t in targets.values()), wall_s=wall_s, peak_rss_bytes=rss.bytes,
                     note=f"{options.workers} workers, prefetch {options.prefetch_ahead} ahead"
                          + ("" if options.include_decode else ", fetch only"))
    return row, _digest(frames)


def windows_track(ds: EpisodeDataset, targets: Targets, options: StreamingOptions,
                  name: str = "windows") -> tuple[TrackResult, str]:
    """Every target as frame windows, one batch coalesced across episodes; the row and a digest of the frames."""
    requests = [FrameRequest(ep, key, timestamps=stamps) for (ep, key), stamps in targets.items()]
    with _cache(ds, options) as cache, PeakRss() as rss:
        index_s, source = _index_files(cache, ds, targets)
        before, started = cache.stats(), time.perf_counter()
        if options.include_decode:
            frames = [read.frames for read in cache.read_frames(requests, fetch="windows")]
        else:
            cache.fetch_frames(requests, fetch="windows")
            frames = []
        wall_s, after = time.perf_counter() - started, cache.stats()
    row = _cache_row(name, before, after, len(requests), index_s=index_s, index_source=source,
                     samples=sum(len(t) for t in targets.values()), wall_s=wall_s, peak_rss_bytes=rss.bytes,
                     note=f"{options.workers} workers, coalesce gap {options.coalesce_gap_kb} KiB"
                          + ("" if options.include_decode else ", fetch only"))
    return row, _digest(frames)


class _CountingFile:
    """A file object that counts the bytes read through it (what the remote decoder pulls over the network)."""

    def __init__(self, file: fsspec.core.OpenFile) -> None:
        self.file, self.bytes = file, 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.bytes += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()


def remote_decoder_track(ds: EpisodeDataset, targets: Targets) -> tuple[TrackResult, str]:
    """torchcodec over each source MP4 opened through fsspec (approximate mode, one decoder per file)."""
    decoders: dict[str, tuple[VideoDecoder, _CountingFile]] = {}
    frames, index_s = [], 0.0
    with PeakRss() as rss:
        started = time.perf_counter()
        for (ep, key), stamps in targets.items():
            segment = ds.episode(ep).videos[key]
            if segment.path not in decoders:
                opened = time.perf_counter()
                file = _CountingFile(ds.storage.fs.open(ds.storage.path(segment.path), "rb"))
                # torchcodec reads any object with read and seek; its annotation names only io's classes
                decoders[segment.path] = VideoDecoder(file, seek_mode="approximate"), file  # type: ignore[arg-type]
                index_s += time.perf_counter() - opened
            decoder = decoders[segment.path][0]
            # Half a frame past each frame's start, so float rounding cannot land on the frame before.
            begin = decoder.metadata.begin_stream_seconds or 0.0   # None is torchcodec's 0 (no scan)
            shown = begin + segment.from_timestamp + stamps + 0.5 / ds.fps
            frames.append(decoder.get_frames_played_at(shown.tolist()).data)
        wall_s = time.perf_counter() - started
    fetched = sum(file.bytes for _, file in decoders.values())
    for _, file in decoders.values():
        file.file.close()
    decode_ms = 1000 * (wall_s - index_s) / max(len(targets), 1)
    row = TrackResult("remote-decoder", index_s=index_s, index_source="moov", jobs=len(targets),
                      samples=sum(len(t) for t in targets.values()), wall_s=wall_s,
                      stage_ms={"decode": decode_ms}, bytes_fetched=fetched, peak_rss_bytes=rss.bytes,
                      note="torchcodec over the source file via fsspec, approximate mode, one decoder per file; "
                           "decode ms include its reads")
    return row, _digest(frames)


def tabular_rows(ds: EpisodeDataset, pool: Sequence[int], options: StreamingOptions) -> list[TrackResult]:
    """Each pooled episode's state and action: from Parquet row groups, then from the usage-format cache."""
    if not isinstance(ds, LeRobotDataset):
        return [TrackResult("tabular", error="plain video files have no data table")]
    rows, values = [], []
    with _usage_dir(options) as usage_dir:
        for usage in (False, True):
            reader = LeRobotDataset(ds.storage)
            if usage:
                reader.use_usage_cache(usage_dir)
            firsts = {reader.episode(ep).data_path: ep for ep in reversed(pool)}.values()
            with PeakRss() as rss:
                opened = time.perf_counter()
                for ep in firsts:  # the first read of a data file opens it (or makes its usage-format copy)
                    reader.episode_columns(ep, TABULAR_COLUMNS)
                index_s = time.perf_counter() - opened
                started = time.perf_counter()
                got = [reader.episode_columns(ep, TABULAR_COLUMNS) for ep in pool]
                wall_s = time.perf_counter() - started
            values.append(_digest(g[c] for g in got for c in TABULAR_COLUMNS))
            rows.append(TrackResult(
                "tabular-usage" if usage else "tabular", index_s=index_s, index_source="copy" if usage else "footer",
                jobs=len(pool), samples=sum(ds.episode_length(ep) for ep in pool), wall_s=wall_s,
                stage_ms={"fetch": 1000 * wall_s / len(pool)}, peak_rss_bytes=rss.bytes,
                frames_match=None if not usage else values[0] == values[1],
                note="Parquet row groups; index s: each data file's first read" if not usage else
                     "memmapped usage-format copy; index s: each data file's first read (copies it once)"))
    return rows


def _usage_dir(options: StreamingOptions) -> contextlib.AbstractContextManager[str]:
    """The options' cache directory, or a temporary one for the run: the usage-format copies need a place."""
    if options.cache_dir is not None:
        return contextlib.nullcontext(options.cache_dir)
    return tempfile.TemporaryDirectory(prefix="episodes-usage-")


def run_tracks(ds: EpisodeDataset, names: Sequence[str], options: StreamingOptions) -> Iterator[TrackResult]:
    """The named tracks in order; one that fails yields a row with its error and the others still run."""
    pool = episode_pool(ds, options)
    targets = pool_targets(ds, pool, options)
    reference: str | None = None
    for name in names:
        log.info("track %s: %d episodes, %d targets", name, len(pool), sum(len(t) for t in targets.values()))
        try:
            if name == "tabular":
                yield from tabular_rows(ds, pool, options)
                continue
            row, digest = _one_track(ds, name, targets, options)
        except (EpisodeDataError, OSError, RuntimeError, ValueError) as exc:
            yield TrackResult(name, error=f"{type(exc).__name__}: {exc}")
            continue
        if options.include_decode and name in ("indexed", "windows", "remote-decoder"):
            reference = reference or (digest if name == "indexed" else None)
            row = _with_match(row, None if reference is None or name == "indexed" else digest == reference)
        yield row


def _one_track(ds: EpisodeDataset, name: str, targets: Targets, options: StreamingOptions) -> tuple[TrackResult, str]:
    if name == "indexed":
        return indexed_track(ds, targets, options)
    if name == "windows":
        return windows_track(ds, targets, options)
    if name == "random-frames":
        return windows_track(ds, random_targets(ds, options), options, "random-frames")
    if name == "remote-decoder":
        return remote_decoder_track(ds, targets)
    raise ValueError(f"unknown track {name!r}; expected one of {', '.join(TRACKS)}")


def _with_match(row: TrackResult, match: bool | None) -> TrackResult:
    return replace(row, frames_match=match)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}" if n else "-"


def _ms(row: TrackResult, stage: str) -> str:
    return f"{row.stage_ms[stage]:.3f}" if stage in row.stage_ms else "-"


TABLE_HEADER = ("track", "index s", "jobs", "samples/s", "wall s", *(f"{s} ms/job" for s in STAGES), "planned MiB",
                "fetched MiB", "useful MiB", "windows", "ranges", "peak RSS MiB", "frames = indexed", "notes")


def track_table(rows: Sequence[TrackResult]) -> str:
    """The rows as one Markdown table, LeRobot's kind: per-stage ms per camera job, bytes, ranges, memory."""
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for r in rows:
        if r.error:
            cells = [r.track, *["-"] * (len(TABLE_HEADER) - 2), f"failed: {r.error}"]
        else:
            match = {None: "-", True: "yes", False: "NO"}[r.frames_match]
            ranges = f"{r.ranges_before} -> {r.ranges_after}" if r.ranges_after else "-"
            cells = [r.track, f"{r.index_s:.3f} ({r.index_source})", str(r.jobs), f"{r.samples_per_s:,.1f}",
                     f"{r.wall_s:.3f}", *(_ms(r, s) for s in STAGES), _mib(r.bytes_planned), _mib(r.bytes_fetched),
                     _mib(r.bytes_useful), str(r.windows or "-"), ranges,
                     "-" if r.peak_rss_bytes is None else f"{r.peak_rss_bytes / 2**20:.0f}", match, r.note]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
