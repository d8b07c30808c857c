"""`python -m episodes verify|bench ROOT`: check the byte-range frames, or time the ways of reading episodes.

verify: are the byte-range frames identical to a full-file decode? Exit
status 0 when every episode-camera is identical, 1 when any differs (or
fails), 2 for bad arguments or a dataset that cannot be opened.

bench: LeRobot's episode-streaming tracks side by side (episodes.tools.streaming),
one table. Exit status 0 when every track ran, 1 when one failed (its row
says why, the others are still printed), 2 for bad arguments or a dataset
that cannot be opened.

Both keep MP4 indexes (and bench its usage-format copies) under
--cache-dir, by default RnB's cache directory ($RNB_CACHE_DIR, else
~/.cache/rnb): the command ships as RnB's `rnb-episodes`, and so shares
the indexes RnB's runs made. The library itself has no default directory.

The package's log records at INFO and above reach stderr as `episodes:
message` while a command runs, the way RnB's commands show theirs; the
handler is removed afterwards, so a call in-process leaves nothing behind.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from episodes import EpisodeDataError, open_episodes
from episodes.tools.streaming import TRACKS, StreamingOptions, run_tracks, track_table
from episodes.tools.verify import EpisodeCheck, verify_dataset


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m episodes", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="compare every episode's frames with a full-file decode")
    verify.add_argument("root", help="LeRobot v3.0 dataset root (path or fsspec URL), or a glob of MP4 files")
    verify.add_argument("--device", default="cpu", help="decode device: cpu or cuda:N (default cpu)")
    verify.add_argument("--cameras", nargs="+", metavar="KEY", help="video keys to check (default: all)")
    bench = commands.add_parser("bench", help="time LeRobot's episode-streaming tracks side by side")
    _bench_arguments(bench)
    cache_dir = Path(os.environ.get("RNB_CACHE_DIR") or Path.home() / ".cache" / "rnb")
    for command in (verify, bench):
        command.add_argument("--cache-dir", type=Path, default=cache_dir,
                             help=f"where MP4 indexes and usage-format copies persist (default {cache_dir}: "
                                  "$RNB_CACHE_DIR, else ~/.cache/rnb)")
    return parser


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    defaults = StreamingOptions()
    bench.add_argument("root", help="LeRobot v3.0 dataset root (path or fsspec URL), or a glob of MP4 files")
    bench.add_argument("--strategy", default="all", choices=[*TRACKS, "all"],
                       help="which track to run (default: all of them)")
    for name, help_text in (("pool_size", "episodes in the pool"),
                            ("frames_per_episode", "random frames per pooled episode and camera"),
                            ("frame_pool_size", "random (episode, camera, frame) targets of random-frames"),
                            ("coalesce_gap_kb", "merge byte windows at most this many KiB apart"),
                            ("workers", "fetch threads"), ("prefetch_ahead", "episodes indexed prefetches ahead"),
                            ("seed", "random seed")):
        bench.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name),
                           help=f"{help_text} (default {getattr(defaults, name)})")
    bench.add_argument("--include-decode", action="store_true",
                       help="decode the frames too (default: fetch and build mini-MP4s only, as LeRobot's default)")
    bench.add_argument("--no-sidecar", action="store_true", help="build MP4 indexes from headers, not the sidecar")


def _device(text: str) -> str:
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(f"--device {text!r} is not a device name such as cpu or cuda:0") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text!r} needs CUDA, which this machine does not have; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {text!r} is not supported; use cpu or cuda:N")
    return str(device)


def _print_check(check: EpisodeCheck) -> None:
    if not check.identical:
        print(f"DIFFERENT episode {check.episode} camera {check.key}: {check.detail}", flush=True)


def _bench(args: argparse.Namespace) -> int:
    names = list(TRACKS) if args.strategy == "all" else [args.strategy]
    try:
        options = StreamingOptions(
            pool_size=args.pool_size, frames_per_episode=args.frames_per_episode,
            frame_pool_size=args.frame_pool_size, coalesce_gap_kb=args.coalesce_gap_kb, workers=args.workers,
            prefetch_ahead=args.prefetch_ahead, include_decode=args.include_decode, seed=args.seed,
            use_sidecar=not args.no_sidecar, cache_dir=str(args.cache_dir))
        ds = open_episodes(args.root)
    except (EpisodeDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"dataset {args.root}: {ds.num_episodes} episodes, cameras {', '.join(ds.video_keys)}, {ds.fps:g} fps",
          flush=True)
    rows = []
    for row in run_tracks(ds, names, options):
        rows.append(row)
        print(f"{row.track}: {'failed: ' + row.error if row.error else f'{row.wall_s:.2f} s'}", file=sys.stderr,
              flush=True)
    print(track_table(rows))
    return 1 if any(row.error for row in rows) else 0


def _verify(args: argparse.Namespace) -> int:
    try:
        device = _device(args.device)
        ds = open_episodes(args.root)
        report = verify_dataset(ds, device=device, cameras=args.cameras, cache_dir=args.cache_dir,
                                on_check=_print_check)
    except (EpisodeDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(report.checks)} episode-cameras checked on {device}: "
          f"{report.identical} identical, {report.different} different")
    return 0 if report.different == 0 and report.checks else 1


@contextlib.contextmanager
def _log_to_stderr() -> Iterator[None]:
    """The package's records at INFO and above on the stderr of the moment, as `episodes: message`."""
    logger, handler = logging.getLogger("episodes"), logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("episodes: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with _log_to_stderr():
        return _bench(args) if args.command == "bench" else _verify(args)


if __name__ == "__main__":
    sys.exit(main())
