"""Every benchmark ratio of RnB side by side, in one run: one table, optionally one JSON file.

    .venv/bin/python bench/run.py [--quick] [--json FILE] [--only P1,P5]

Each figure is a ratio A/B against the baseline a user would otherwise pick,
the median of at least 5 paired, interleaved repetitions with its min and
max (see bench/common.py).  `--quick` keeps 5 repetitions and makes each one
short.  Exit codes: 0 every selected benchmark ran (met or not), 1 one of
them failed to run (its row says why), 2 bad arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Effort, Goal, Report, Row, Side, table_text, write_json  # noqa: E402

HTTP_GOAL = Goal(">=", 10)


class Workspace:
    """What several benchmarks share, built on first use: a temp dir, the episode dataset, its nginx URL."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rnb-bench-")))

    @functools.cached_property
    def dataset(self) -> Path:
        from bench.episode_bench import make_grainy_dataset
        return make_grainy_dataset(self.dir / "ds")

    @functools.cached_property
    def url(self) -> str:
        from bench.episode_bench import served
        return self.stack.enter_context(served(self.dataset, self.dir))


def _spread_row(id: str, what: str, goal: Goal | None, spread: object, reps: int, note: str = "",
                a: Side | None = None, b: Side | None = None) -> Row:
    return Row(id, what, goal, a, b, spread.median, spread.min, spread.max, reps, note)


def p2_bytes(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import bytes_ratio
    r = bytes_ratio(space.dataset)
    note = f"exact byte counts; median and [min, max] over {r.episodes} episode-cameras"
    return [
        _spread_row("P2", "bytes per episode / its own sample bytes, without keyframe widening", Goal("<=", 1.05),
                    r.unwidened, r.episodes, note),
        _spread_row("P2w", "same, the fetched range (widened back to the keyframe)", None, r.fetched, r.episodes),
        _spread_row("P2m", "same, the whole mini-MP4 (range + new moov)", None, r.mini_mp4, r.episodes),
    ]


def p3_remote(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import http_time_to_frames
    figures = http_time_to_frames(space.url, space.dir, effort.reps)
    what = "an episode's frames over HTTP (nginx): byte-range path ({}) / torchcodec on the full remote file"
    return [
        _spread_row(id, what.format(when), Goal(">=", 10), c.ratio, effort.reps,
                    a=Side("byte range", "episodes/s", 1 / c.a_s.median),
                    b=Side("full file", "episodes/s", 1 / c.b_s.median))
        for id, c, when in (("P3", figures["without_sidecar"], "cold cache, MP4 headers read"),
                            ("P3s", figures["with_sidecar"], "cold cache, index from the sidecar"))
    ]


def p4_decode(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import decode_rate
    d = decode_rate(space.dataset, space.dir, effort.reps)
    return [_spread_row("P4", "decode frames/s of one episode: loader (torchcodec) / ffmpeg -benchmark, 1 thread each",
                        Goal(">=", 0.9), d.ratio, effort.reps, note=f"{d.frames} frames per repetition",
                        a=Side("loader", "frames/s", d.ours_fps.median),
                        b=Side("ffmpeg", "frames/s", d.ffmpeg_fps.median))]


def p7_sidecar(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import sidecar_probes
    s = sidecar_probes(space.url, space.dir, effort.reps)
    return [
        Row("P7", "MP4 header bytes read over HTTP: second run / first run (sidecar written)", Goal("==", 0),
            Side("second run", "bytes", s.second_run_header_bytes),
            Side("first run", "bytes", s.first_sidecar_run_header_bytes),
            s.second_run_header_bytes / s.first_sidecar_run_header_bytes, reps=1,
            note=f"exact counts over {s.files} files; {s.second_run_header_reads} header reads on the second run"),
        _spread_row("P7b", "MP4 index build time per file on a first run, seconds (not a ratio)", None,
                    s.build_s, effort.reps * s.files),
    ]


def p8_gpu(effort: Effort, space: Workspace) -> list[Row]:
    import torch
    if not torch.cuda.is_available():
        return [Row("P8", "R(2+1)D pipeline on one GPU / the same network in one loop", Goal(">=", 0.95),
                    note="skipped: no CUDA device here; bench/gpu_check.py runs it on a lent GPU machine")]
    from bench.gpu_check import gpu_rows
    return gpu_rows(effort)


def _harness(name: str) -> Callable[[Effort, Workspace], list[Row]]:
    def run(effort: Effort, space: Workspace) -> list[Row]:
        from bench import harness_bench
        return getattr(harness_bench, name)(effort)
    return run


BENCHMARKS: dict[str, Callable[[Effort, Workspace], list[Row]]] = {
    "P1": _harness("p1_harness_efficiency"),
    "P2": p2_bytes,
    "P3": p3_remote,
    "P4": p4_decode,
    "P5": _harness("p5_ipc"),
    "P6": _harness("p6_scaling"),
    "P7": p7_sidecar,
    "P8": p8_gpu,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 short repetitions per figure (about 3 minutes)")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    if args.only is not None:
        args.only = [name.strip() for name in args.only.split(",")]
        unknown = [name for name in args.only if name not in BENCHMARKS]
        if unknown:
            parser.exit(2, f"bench/run.py: --only: unknown benchmark {unknown[0]!r}; "
                           f"expected names among {', '.join(BENCHMARKS)}\n")
    return args


def run_benchmarks(names: list[str], effort: Effort) -> tuple[list[Row], bool]:
    """Rows of the named benchmarks in order, and whether all of them ran; a failure becomes its row's note."""
    rows: list[Row] = []
    all_ran = True
    with contextlib.ExitStack() as stack:
        space = Workspace(stack)
        for name in names:
            started = time.perf_counter()
            print(f"bench/run.py: {name} ...", file=sys.stderr, flush=True)
            try:
                rows += BENCHMARKS[name](effort, space)
            except Exception as error:  # one broken benchmark must not cost the others' figures
                all_ran = False
                traceback.print_exc(file=sys.stderr)
                rows.append(Row(name, "did not run", None, note=f"failed: {type(error).__name__}: {error}"))
            print(f"bench/run.py: {name} took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return rows, all_ran


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rnb import joblog
    effort = Effort.of(args.quick)
    started = time.time()
    rows, all_ran = run_benchmarks(args.only or list(BENCHMARKS), effort)
    print(table_text(rows))
    if args.json is not None:
        context = {"started": started, "seconds": time.time() - started, "host": joblog.host(),
                   "versions": joblog.versions(), "argv": sys.argv[1:] if argv is None else argv}
        write_json(args.json, Report(tuple(rows), args.quick, context))
    return 0 if all_ran else 1


if __name__ == "__main__":
    sys.exit(main())
