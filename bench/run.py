"""Every benchmark ratio of RnB side by side, in one run: one table, optionally one JSON file.

    .venv/bin/python bench/run.py [--quick] [--json FILE] [--only P1h,P5]

Each figure is a ratio A/B against the baseline a user would otherwise pick,
the median of at least 5 paired, interleaved repetitions with its min and
max (see bench/common.py).  `--quick` keeps 5 repetitions and makes each one
short.  Exit codes: 0 every selected benchmark ran (met or not), 1 one of
them failed to run (its row says why), 2 bad arguments.  Each benchmark's
rows go to stderr, and to the JSON file ("complete": false until the
end), as soon as it is done: a run stopped after hours keeps what it
measured.  SIGTERM ends a run as Ctrl-C does, through its cleanup (the
servers and clusters it started).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import Effort, Goal, Report, Row, table_text, write_json

if TYPE_CHECKING:
    from bench.loadgen_bench import Runs
    from episodes.testing.server import NginxServer

DATA_CACHE = Path(__file__).resolve().parents[1] / "data" / "bench"


class Workspace:
    """What several benchmarks share, built on first use: a temp dir, the episode dataset, its nginx server.

    The dataset is kept under DATA_CACHE (ignored by git) because generating
    it takes a minute or two; everything else goes with the temp dir.
    """

    def __init__(self, stack: contextlib.ExitStack, effort: Effort) -> None:
        self.stack = stack
        self.effort = effort
        self.dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rnb-bench-")))

    @functools.cached_property
    def dataset(self) -> Path:
        from bench.episode_bench import QUICK_SPEC, SPEC, grainy_dataset
        return grainy_dataset(DATA_CACHE, QUICK_SPEC if self.effort.quick else SPEC)

    @functools.cached_property
    def loadgen_runs(self) -> Runs:
        """The runs L1 and L2 both read (bench/loadgen_bench.py), measured once for the two."""
        from bench.loadgen_bench import measure
        return measure(self.effort, self.dir)

    @functools.cached_property
    def server(self) -> NginxServer:
        from episodes.testing.server import serve_directory
        return self.stack.enter_context(serve_directory(self.dataset, self.dir / "nginx"))


def p2_bytes(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import bytes_rows
    return bytes_rows(space.dataset)


def p3_remote(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import remote_rows
    return remote_rows(space.server, space.dataset, space.dir, effort)


def p4_decode(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import decode_rows
    return decode_rows(space.dataset, space.dir, effort)


def p7_sidecar(effort: Effort, space: Workspace) -> list[Row]:
    from bench.episode_bench import sidecar_rows
    return sidecar_rows(space.server.url, space.dir, effort)


def p8_gpu(effort: Effort, space: Workspace) -> list[Row]:
    import torch
    if not torch.cuda.is_available():
        return [Row("P8", "R(2+1)D pipeline on one GPU / the same network in one loop", Goal(">=", 0.95),
                    note="skipped: no CUDA device here; bench/gpu_check.py runs it on a lent GPU machine")]
    from bench.gpu_suite import gpu_rows
    return gpu_rows(effort)


def _rows(module: str, name: str) -> Callable[[Effort, Workspace], list[Row]]:
    """A row function of bench/<module>.py, imported when its rows run."""
    def run(effort: Effort, space: Workspace) -> list[Row]:
        rows: Callable[[Effort], list[Row]] = getattr(importlib.import_module(f"bench.{module}"), name)
        return rows(effort)
    return run


def _access(name: str) -> Callable[[Effort, Workspace], list[Row]]:
    def run(effort: Effort, space: Workspace) -> list[Row]:
        from bench.access_bench import access_rows
        return access_rows(name, effort, DATA_CACHE, space.dir, lambda: space.dataset)
    return run


def p12_child_start(effort: Effort, space: Workspace) -> list[Row]:
    from bench.start_bench import p12_child_start
    return p12_child_start(effort)


def p12j_job_start(effort: Effort, space: Workspace) -> list[Row]:
    from bench.start_bench import p12j_job_start
    return p12j_job_start(effort)


def _floor(name: str) -> Callable[[Effort, Workspace], list[Row]]:
    def run(effort: Effort, space: Workspace) -> list[Row]:
        from bench.access_bench import datasets, vga_datasets
        from bench.floor_bench import floor_rows
        return floor_rows(name, effort, lambda: datasets(DATA_CACHE), lambda: vga_datasets(DATA_CACHE, effort),
                          space.dir)
    return run


def _overlap(name: str) -> Callable[[Effort, Workspace], list[Row]]:
    def run(effort: Effort, space: Workspace) -> list[Row]:
        from bench.access_bench import datasets
        from bench.overlap_bench import rss_rows, wan_loader_rows
        rows = wan_loader_rows if name == "P3w" else rss_rows
        return rows(datasets(DATA_CACHE)[2], space.dir, effort)
    return run


def _streams(name: str) -> Callable[[Effort, Workspace], list[Row]]:
    def run(effort: Effort, space: Workspace) -> list[Row]:
        from bench import stream_bench
        return getattr(stream_bench, name)(effort)
    return run


def l1_loadgen_client(effort: Effort, space: Workspace) -> list[Row]:
    from bench.loadgen_bench import l1_rows
    return l1_rows(space.loadgen_runs)


def l2_loadgen_floor(effort: Effort, space: Workspace) -> list[Row]:
    from bench.loadgen_bench import l2_rows
    return l2_rows(space.loadgen_runs)


def l3_verdicts(effort: Effort, space: Workspace) -> list[Row]:
    from bench.verdict_corpus import l3_rows
    return l3_rows(effort)


BENCHMARKS: dict[str, Callable[[Effort, Workspace], list[Row]]] = {
    "P1s": _rows("harness_bench", "p1_sleeping_steps"),
    "P1s8": _rows("harness_bench", "p1_deep_sleeping_steps"),
    "P1h": _rows("harness_bench", "p1_harness_per_hop"),
    "P1c": _rows("harness_bench", "p1_contention"),
    "P2": p2_bytes,
    "P2r": _access("P2r"),
    "P3": p3_remote,
    "P3n": _access("P3n"),
    "P3s": _access("P3s"),
    "P3r": _access("P3r"),
    "P3rd": _floor("P3rd"),
    "P3w": _overlap("P3w"),
    "P3m": _overlap("P3m"),
    "P4": p4_decode,
    "P4r": _access("P4r"),
    "P5": _rows("ipc_bench", "p5_ipc"),
    "P6": _rows("scaling_bench", "p6_scaling"),
    "P7": p7_sidecar,
    "P8": p8_gpu,
    "P10": _access("P10"),
    "P10d": _floor("P10d"),
    "P10n": _access("P10n"),
    "P10r": _access("P10r"),
    "P11": _access("P11"),
    "P12": p12_child_start,
    "P12j": p12j_job_start,
    "P9": _rows("ray_bench", "p9_ray_sleeping_steps"),
    "P9h": _rows("ray_bench", "p9_ray_per_hop"),
    "T1": _rows("tune_bench", "t1"),
    "T2": _rows("tune_bench", "t2"),
    "T3": _rows("estimator_bench", "t3"),
    "T3c": _rows("estimator_bench", "t3c"),
    "T4": _rows("tune_ray_bench", "t4"),
    "T1s": _rows("tune_bench", "t1s"),
    "S1": _streams("s1"),
    "S2": _streams("s2"),
    "L1": l1_loadgen_client,
    "L2": l2_loadgen_floor,
    "L3": l3_verdicts,
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


def run_benchmarks(names: list[str], effort: Effort,
                   measured: Callable[[Sequence[Row]], None] = lambda rows: None) -> tuple[list[Row], bool]:
    """Rows of the named benchmarks in order, and whether all of them ran; a failure becomes its row's note.
    Each benchmark's rows go to stderr once it is done, and every row so far to `measured`."""
    rows: list[Row] = []
    all_ran = True
    with contextlib.ExitStack() as stack:
        space = Workspace(stack, effort)
        for name in names:
            started, done = time.perf_counter(), len(rows)
            print(f"bench/run.py: {name} ...", file=sys.stderr, flush=True)
            try:
                rows += BENCHMARKS[name](effort, space)
            except Exception as error:  # one broken benchmark must not cost the others' figures
                all_ran = False
                traceback.print_exc(file=sys.stderr)
                rows.append(Row(name, "did not run", None, note=f"failed: {type(error).__name__}: {error}"))
            print(f"bench/run.py: {name} took {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            print(table_text(rows[done:]), file=sys.stderr, flush=True)
            measured(rows)
    return rows, all_ran


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rnb.core import joblog
    signal.signal(signal.SIGTERM, _end_as_interrupted)
    effort = Effort.of(args.quick)
    started = time.time()

    def keep(rows: Sequence[Row], complete: bool = False) -> None:
        if args.json is not None:
            context = {"started": started, "seconds": time.time() - started, "complete": complete,
                       "host": joblog.host(), "versions": joblog.versions(),
                       "argv": sys.argv[1:] if argv is None else argv}
            write_json(args.json, Report(tuple(rows), args.quick, context))

    rows, all_ran = run_benchmarks(args.only or list(BENCHMARKS), effort, keep)
    print(table_text(rows))
    keep(rows, complete=True)
    return 0 if all_ran else 1


def _end_as_interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
