"""The GPU run's checks in the order they run, and the two that run last: the GPU-marked tests and P8."""
from __future__ import annotations

import functools
import importlib.util
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.bounded import NO_DEADLINE, Deadline, Overrun, finish, start
from bench.common import Effort, Goal, Row, table_text
from bench.gpu_device_checks import CudaSpinner, check_dtype, check_pinned, check_seam, check_uuid
from bench.gpu_job_checks import (
    check_busy,
    check_contexts,
    check_fallback,
    check_ipc,
    check_nvdec,
    check_nvdec_frames,
    check_nvdec_overlap,
    check_stage_times,
)
from bench.gpu_kit import DISCARD, LOADER, NETWORK, PYTEST_S, REPO, Check, CheckFunction, Datasets, verdict


def gpu_test_files() -> list[str]:
    """The test files with GPU-marked tests that this machine can import (the lent ones have no Ray)."""
    files = sorted(path for path in (REPO / "tests").rglob("test_*.py") if "pytest.mark.gpu" in path.read_text())
    if importlib.util.find_spec("ray") is None:
        files = [path for path in files if not any(name in path.read_text() for name in ("import ray", "ray_testing"))]
    return [str(path.relative_to(REPO)) for path in files]


def run_pytest(arguments: Sequence[str], deadline: Deadline) -> Check:
    """pytest in a session of its own: PASS when it passed and ran a test, SKIP when it ran none, FAIL otherwise.

    Its last 30 lines are printed, also when it is killed at the deadline.
    """
    from rnb.pipeline.gpus import child_environment

    child = start([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments], cwd=REPO,
                  env=child_environment())
    try:
        stdout, stderr = finish(child, deadline, PYTEST_S, "pytest")
    except Overrun as overrun:
        print("\n".join((overrun.stdout + overrun.stderr).strip().splitlines()[-30:]), flush=True)
        raise
    lines = (stdout + stderr).strip().splitlines()
    print("\n".join(lines[-30:]), flush=True)
    last = lines[-1] if lines else "pytest printed nothing"
    ran = re.search(r"\b[1-9]\d* passed\b", last) is not None
    if child.returncode in (0, 5) and not ran:
        return Check("tests", "SKIP", f"pytest passed no test (exit {child.returncode}): {last}")
    return verdict("tests", child.returncode == 0, f"exit {child.returncode}: {last}")


def check_gpu_tests(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    return run_pytest(["-m", "gpu", *gpu_test_files()], deadline)


def p8_rows(dataset: Path, effort: Effort | None = None, deadline: Deadline = NO_DEADLINE) -> list[Row]:
    """P8 and P8d over the NVDEC dataset (by default --quick's windows: the budget holds one job per side)."""
    from bench.harness_bench import chain_pipeline, harness_pair, loop_throughput

    effort = effort or Effort.of(quick=True)
    loader = (LOADER[0], {**LOADER[1], "dataset": str(dataset)})
    whole = (loader, NETWORK)
    items = effort.pick(60, 120)
    return [
        harness_pair(effort, "P8", "R(2+1)D pipeline on one GPU: harness (loader -> network) / one loop",
                     Goal(">=", 0.95), ("harness", chain_pipeline(whole, 0)),
                     ("loop", lambda n: loop_throughput(whole, "cuda:0", n, deadline)), items,
                     "EpisodeLoader (NVDEC into shared CUDA slots) -> R2P1DRunner stages 1-5, 4 clips x 8 frames",
                     deadline),
        harness_pair(effort, "P8d", "loader alone: cuda:0 (NVDEC) / CPU", None,
                     ("cuda:0", chain_pipeline((loader, DISCARD), 0)), ("cpu", chain_pipeline((loader, DISCARD), -1)),
                     items, "EpisodeLoader then a discarding final step", deadline),
    ]


def rows_check(rows: list[Row]) -> Check:
    """P8's rows as one line: PASS when every row has its figure (its goal is a figure to report, not a check)."""
    print(table_text(rows), flush=True)
    figures = "; ".join(f"{row.id} {'did not run' if row.ratio is None else f'{row.ratio:.2f}'}"
                        + (f" (goal {row.goal}, met: {row.met})" if row.goal is not None else "") for row in rows)
    return verdict("P8", all(row.ratio is not None for row in rows), figures, rows=[row.to_json() for row in rows])


def check_p8(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    return rows_check(p8_rows(datasets.get("good", deadline), deadline=deadline))


def gpu_rows(effort: Effort) -> list[Row]:
    """P8 and P8d for bench/run.py, over a dataset made on the spot."""
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        return p8_rows(Datasets(Path(tmp)).get("good", NO_DEADLINE), effort)


CHECKS: dict[str, CheckFunction] = {  # cheap and dataset-free first; NVDEC's need the bundle's torchcodec
    "seam": functools.partial(check_seam, CudaSpinner), "uuid": check_uuid, "pinned": check_pinned,
    "stage-times": check_stage_times, "nvdec": check_nvdec, "nvdec-frames": check_nvdec_frames,
    "nvdec-overlap": check_nvdec_overlap,
    "fallback": check_fallback, "contexts": check_contexts, "busy": check_busy, "ipc": check_ipc, "dtype": check_dtype,
}
