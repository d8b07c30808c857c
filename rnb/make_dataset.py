"""Write a synthetic LeRobot v3.0 dataset: `python scripts/make_dataset.py data/synthetic`."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

from episodes.synthetic import CODECS, SyntheticSpec, make_dataset
from rnb.console import terminal_logging


def parse_args(argv: list[str] | None = None) -> tuple[Path, SyntheticSpec]:
    defaults = SyntheticSpec()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="dataset root to (re)create")
    parser.add_argument("--codec", choices=CODECS, default=defaults.codec)
    parser.add_argument("--faststart", action=argparse.BooleanOptionalAction, default=defaults.faststart,
                        help="move the moov box before mdat (default: moov at the end, as ffmpeg writes it)")
    for f in fields(SyntheticSpec):
        if f.name in ("codec", "faststart"):
            continue
        parser.add_argument("--" + f.name.replace("_", "-"), type=int, default=getattr(defaults, f.name))
    args = parser.parse_args(argv)
    out_dir = args.__dict__.pop("out_dir")
    try:
        return out_dir, SyntheticSpec(**vars(args))
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    out_dir, spec = parse_args(argv)
    started = time.perf_counter()
    with terminal_logging("make_dataset"):
        root = make_dataset(out_dir, spec)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    print(f"wrote {spec.episodes} episodes x {spec.cameras} cameras ({spec.codec}) to {root}:"
          f" {size / 2**20:.2f} MiB in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
