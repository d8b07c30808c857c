"""Shared pytest setup: markers that skip what this machine cannot run, reading a job's log, a module's dataset.

Tests that run a job read what it left through the `job_log` fixture, which
also tells whether any of its processes outlived it. Episode tests that need
a synthetic dataset name it in a module-level `SPEC` and take `source` (made
once per module) or `root` (a private copy a test may break).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow.parquet as pq
import pytest
import torch

from episodes.synthetic import make_dataset
from episodes.testing.server import nginx_binary
from rnb.engines.ray.cluster import use_loopback_if_local
from rnb.pipeline.gpus import child_environment
from tests.support.handmade_job import handmade_job
from tests.support.tune_support import find_browser

REPO = Path(__file__).resolve().parents[1]
# Scripts the tests start (scripts/*.py, bench/run.py) import the project through the venv's
# editable install, which may point at another checkout: this one's code must come first.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
# Derived files (MP4 index sidecars, usage-format columns) of the tests' datasets go to a fresh directory,
# not the user's ~/.cache/rnb; spawned jobs inherit it.  Each pytest process (xdist's controller and workers
# import this module each) removes its own at exit; a forked child, which inherits the hook, does not.
_CACHE_DIR = tempfile.mkdtemp(prefix="rnb-test-cache-")
os.environ["RNB_CACHE_DIR"] = _CACHE_DIR
_CACHE_OWNER = os.getpid()


@atexit.register
def _remove_cache_dir() -> None:
    if os.getpid() == _CACHE_OWNER:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


# Every Ray the tests start or reach lives on 127.0.0.1; Ray must know that before anything imports it.
use_loopback_if_local(None)


class Installed(NamedTuple):
    """A program a marker's tests need, which scripts/setup.sh installs when `variable` is 1."""

    what: str
    variable: str
    found: Callable[[], object]


# scripts/test.sh exports the variables for setup.sh, and pytest inherits them: a test whose program setup was
# told to install, and which is missing all the same, fails; without them (pytest run by hand) it is skipped.
INSTALLED = {
    "nginx": Installed("nginx (on PATH or Debian's /usr/sbin/nginx)", "RNB_WITH_NGINX", nginx_binary),
    "browser": Installed("chromium and chromedriver on PATH", "RNB_WITH_BROWSER", find_browser),
}


RAY_GROUP = "tests/engines/ray/"
# The longest groups of the two-worker run, longest first (docs/measurements/2026-12-06-test-loop-folders.md): handed
# out before the others, so that the run does not end on one long module while the other worker has nothing left.
# Among them the two that mostly wait (the GPU run's rehearsal for its deadline, the installed command for pip):
# left to the end, they held both workers for the run's last 30 s with the cores three quarters idle
# (docs/measurements/2026-12-06-test-loop-tail.md); early, other workers' jobs use the cores meanwhile.
LONGEST_FIRST = (RAY_GROUP, "tests/engines/test_stalls.py", "tests/bench/test_gpu_rehearsal.py",
                 "tests/cli/test_installed.py", "tests/pipeline/test_rnb_configs.py",
                 "tests/pipeline/test_configs.py", "tests/analysis/test_sweep.py", "tests/load/test_streams.py",
                 "tests/tune/test_tune_cli.py", "tests/engines/test_reliability.py", "tests/models/test_models.py",
                 "tests/load/test_traces.py", "tests/bench/test_bench_run.py", "tests/bench/test_bench_access.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """scripts/test.sh's two workers: each module's tests on one (its module fixtures made once), all tests/engines/ray/
    modules on one, so that one Ray cluster at a time runs on the host; the longest groups first, the others as
    pytest-xdist orders them.  (pytest-xdist's own loadgroup marks do not reach pytest 9's node ids.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return RAY_GROUP if module.startswith(RAY_GROUP) else module

        def _assign_work_unit(self, node: Any) -> None:
            for scope in reversed(LONGEST_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ByModule(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; this machine has no GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, program in INSTALLED.items():
        if marker not in item.keywords or program.found():
            continue
        if os.environ.get(program.variable) == "1":
            pytest.fail(f"needs {program.what}, which scripts/setup.sh was to install ({program.variable}=1), "
                        "and found none", pytrace=False)
        pytest.skip(f"needs {program.what}; scripts/test.sh installs it")


class JobLog(NamedTuple):
    """What one job left in its log directory."""

    dir: Path
    meta: dict            # meta.json
    rows: list[dict]      # timings.parquet, one dict per finished item

    @property
    def children_left(self) -> list[int]:
        """The job's processes still running: still a child of the tests, or any spawned process orphaned."""
        left = []
        for pid in (process["pid"] for process in self.meta["processes"]):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() or b"multiprocessing" in cmdline:
                left.append(pid)
        return left


def _read_job_log(path: Path) -> JobLog:
    """A job directory, or the one job a test ran into the log directory `path` (none or several fail the test)."""
    path = Path(path)
    (job_dir,) = [path] if (path / "meta.json").is_file() else [child for child in path.iterdir() if child.is_dir()]
    meta = json.loads((job_dir / "meta.json").read_text())
    return JobLog(job_dir, meta, pq.read_table(job_dir / "timings.parquet").to_pylist())


def run_benchmark(argv: list[str], timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    """benchmark.py `argv` in a process of its own, as every GPU test job runs: its exit code, stdout and stderr.

    A job in the test process would leave its CUDA context and allocator
    cache there, and the next job's busy check would count them; this one's
    environment declares whatever contexts the test process holds as the
    job's own (rnb.pipeline.gpus.child_environment).
    """
    return subprocess.run([sys.executable, str(REPO / "benchmark.py"), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s, env=child_environment())


@pytest.fixture
def benchmark_process() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`benchmark_process(argv)`: run_benchmark, for tests (pytest-benchmark owns the name `benchmark`)."""
    return run_benchmark


@pytest.fixture
def job_log() -> Callable[[Path], JobLog]:
    """`job_log(path)`: what a job left in its directory (`path`, or the one job under the log directory `path`)."""
    return _read_job_log


@pytest.fixture(scope="module")
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic dataset of the test module's `SPEC`, made once per module; tests must not change it."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    return make_dataset(tmp_path_factory.mktemp(name) / "ds", request.module.SPEC)


@pytest.fixture
def root(source: Path, tmp_path: Path) -> Path:
    """A private copy of `source` (at `tmp_path / "ds"`) that a test may break."""
    return Path(shutil.copytree(source, tmp_path / "ds"))


@pytest.fixture
def handmade(tmp_path: Path) -> Path:
    """A job log made by hand (tests/support/handmade_job.py): three items, a loader and two replicas of a network."""
    return handmade_job(tmp_path)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A module's Ray cluster of labelled nodes on 127.0.0.1 (tests/support/ray_testing.py), shut down after the module.

    Not the session's: its dashboard and agents would keep taking CPU from every test after the Ray ones."""
    from tests.support.ray_testing import start_test_cluster
    yield from start_test_cluster()
