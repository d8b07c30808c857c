"""`python -m episodes verify ROOT`: are the byte-range frames identical to a full-file decode?

Exit status: 0 when every episode-camera is identical, 1 when any differs
(or fails), 2 for bad arguments or a dataset that cannot be opened.
"""
from __future__ import annotations

import argparse
import sys

import torch

from episodes.errors import EpisodeDataError
from episodes.source import open_episodes
from episodes.verify import EpisodeCheck, verify_dataset


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m episodes", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="compare every episode's frames with a full-file decode")
    verify.add_argument("root", help="LeRobot v3.0 dataset root (path or fsspec URL), or a glob of MP4 files")
    verify.add_argument("--device", default="cpu", help="decode device: cpu or cuda:N (default cpu)")
    verify.add_argument("--cameras", nargs="+", metavar="KEY", help="video keys to check (default: all)")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        device = _device(args.device)
        ds = open_episodes(args.root)
        report = verify_dataset(ds, device=device, cameras=args.cameras, on_check=_print_check)
    except (EpisodeDataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(report.checks)} episode-cameras checked on {device}: "
          f"{report.identical} identical, {report.different} different")
    return 0 if report.different == 0 and report.checks else 1


if __name__ == "__main__":
    sys.exit(main())
