"""P8, the GPU figures, as one prepared script for a lent GPU machine (it needs CUDA; < 8 minutes).

What it measures, each as paired repetitions (bench/common.py):
  P8   R(2+1)D pipeline on one GPU through the harness (loader -> network,
       decode by NVDEC straight into the loader's shared CUDA slots) / the same
       two model calls in a plain single-process loop on that GPU; goal >= 0.95.
  P8d  the loader alone on cuda:0 (NVDEC) / on the CPU, items/s (information).
Then it runs the GPU-marked pytest tests and prints their summary line.

The GPU machine has its own torch (2.11, CUDA 13) but no torchcodec, no
FFmpeg libraries and no py3nvml, and reaches no package index:
bench/gpu_bundle.py says what is brought along and why. Once, here, from the
repository root:

    echo /.whl/ >> .git/info/exclude
    python -m bench.gpu_check --prepare          # downloads 42 MiB of wheels into .whl/

then call the device tool's `run` with carry [".whl"], timeout_s 540 and the
command

    set -o pipefail; PYTHONUNBUFFERED=1 python3 -m bench.gpu_check --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.log

Finding .whl/, the script unpacks it under /tmp and runs itself again with
PYTHONPATH and LD_LIBRARY_PATH pointing there (the pytest run inherits them).

Exit code: 0 when every figure ran and the GPU tests passed, 1 otherwise,
2 without CUDA.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import gpu_bundle
from bench.common import Effort, Goal, Report, Row, table_text, write_json
from bench.harness_bench import chain_pipeline, harness_pair, loop_throughput

LOADER = ("models.episode.EpisodeLoader", {"num_clips": 4, "clip_length": 8, "size": 112})
WHEEL_DIR = Path(".whl")
BUNDLED = "RNB_GPU_BUNDLE"  # set in the process that runs with the unpacked bundle
NETWORK = ("models.r2p1d.R2P1DRunner", {"start_index": 1, "end_index": 5, "num_clips": 4, "clip_length": 8,
                                        "size": 112})


def gpu_rows(effort: Effort) -> list[Row]:
    """P8 and P8d over a small synthetic dataset made on the spot."""
    from episodes.testing.synthetic import make_dataset
    with tempfile.TemporaryDirectory(prefix="rnb-gpu-") as tmp:
        root = make_dataset(Path(tmp) / "ds", episodes=16, cameras=1, episodes_per_file=8)
        loader = (LOADER[0], {**LOADER[1], "dataset": str(root)})
        whole = (loader, NETWORK)
        items = effort.pick(40, 120)
        return [
            harness_pair(effort, "P8", "R(2+1)D pipeline on one GPU: harness (loader -> network) / one loop",
                         Goal(">=", 0.95), ("harness", chain_pipeline(whole, 0)),
                         ("loop", lambda n: loop_throughput(whole, "cuda:0", n)), items,
                         "EpisodeLoader (NVDEC into shared CUDA slots) -> R2P1DRunner stages 1-5, 4 clips x 8 frames"),
            harness_pair(effort, "P8d", "loader alone: cuda:0 (NVDEC) / CPU", None,
                         ("cuda:0", chain_pipeline((loader, ("bench.harness_bench.Discard", {})), 0)),
                         ("cpu", chain_pipeline((loader, ("bench.harness_bench.Discard", {})), -1)), items,
                         "EpisodeLoader then a discarding final step"),
        ]


def gpu_tests() -> tuple[bool, str]:
    """Run the GPU-marked tests; whether they passed and pytest's last line."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=300)
    lines = (done.stdout + done.stderr).strip().splitlines()
    print("\n".join(lines[-40:]), flush=True)
    return done.returncode == 0, lines[-1] if lines else "pytest printed nothing"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows to this JSON file")
    parser.add_argument("--skip-tests", action="store_true", help="measure only, without the GPU pytest tests")
    parser.add_argument("--prepare", action="store_true", help=f"download the wheels to carry into {WHEEL_DIR}/ and exit")
    args = parser.parse_args(argv)
    if args.prepare:
        total = gpu_bundle.prepare(WHEEL_DIR)
        print(f"bench/gpu_check.py: {WHEEL_DIR}/ holds {total / 2**20:.1f} MiB of wheels to carry", flush=True)
        return 0
    if WHEEL_DIR.is_dir() and BUNDLED not in os.environ:
        env = gpu_bundle.install(WHEEL_DIR, Path(tempfile.gettempdir()) / "rnb-gpu-bundle")
        again = [sys.executable, "-m", "bench.gpu_check", *(sys.argv[1:] if argv is None else argv)]
        return subprocess.run(again, env={**os.environ, **env, BUNDLED: "1"}).returncode
    if not torch.cuda.is_available():
        print("bench/gpu_check.py: torch sees no CUDA device; run this on a GPU machine", file=sys.stderr)
        return 2
    print(f"bench/gpu_check.py: torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    started = time.time()
    effort = Effort.of(quick=False)
    ok = True
    try:
        rows = gpu_rows(effort)
    except Exception as error:  # the tests below still tell what works
        ok = False
        rows = [Row("P8", "did not run", None, note=f"failed: {type(error).__name__}: {error}")]
    if not args.skip_tests:
        passed, summary = gpu_tests()
        ok = ok and passed
        rows.append(Row("P8t", "GPU-marked pytest tests", None, note=summary))
    print(table_text(rows), flush=True)
    if args.json is not None:
        write_json(args.json, Report(tuple(rows), False, {"started": started, "seconds": time.time() - started,
                                                          "gpu": torch.cuda.get_device_name(0)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
