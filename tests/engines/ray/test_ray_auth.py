"""Joining a Ray cluster that `ray start` started, as the README says, with Ray's token authentication on.

The test starts a real head node with `ray start --head --block` (not
cluster_utils), in a home directory of its own holding a token, so Ray turns
token authentication on for it; everything listens on 127.0.0.1 and lives in
a temp directory of its own.  A driver with the token joins it with
--ray-address; one without it, or with another, is refused in one sentence,
at once.  The head is stopped by ending its `ray start` process (never `ray
stop`, which would stop every Ray of this user), and nothing carrying the
test's mark is left.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fault_jobs import MARK, marked
from tests.support.ray_testing import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 180.0   # hang guards on a loaded machine
JOB_TIMEOUT_S = 240.0


class Head:
    def __init__(self, address: str, home: Path, token: str) -> None:
        self.address, self.home, self.token = address, home, token


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    home = tmp_path_factory.mktemp("home")
    token = uuid.uuid4().hex
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(token)
    # Ray's session directory holds unix sockets, whose paths must be short.
    temp = Path(tempfile.mkdtemp(prefix="rnbray-", dir="/tmp"))
    port = free_port()
    mark = uuid.uuid4().hex
    # On SIGTERM, `ray start --block` first asks the GCS to drain its node, for up to this many seconds (default
    # 30); the GCS got the same SIGTERM (one process group), and where it has gone first, as on a loaded machine,
    # the call is never answered and the teardown waited all 30 s.
    env = {**os.environ, "HOME": str(home), MARK: mark, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_MODE", None)
    started = subprocess.Popen([str(RAY), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                                "--labels", "node=loaders", "--num-cpus=2", "--include-dashboard=false",
                                "--disable-usage-stats", f"--temp-dir={temp}", "--block"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        said = []
        deadline = time.time() + START_TIMEOUT_S
        for line in started.stdout or ():
            said.append(line)
            if "Ray runtime started" in line or time.time() > deadline:
                break
        assert any("Token authentication is enabled" in line for line in said), "".join(said)
        yield Head(f"127.0.0.1:{port}", home, token)
    finally:
        os.killpg(started.pid, signal.SIGTERM)   # `ray start --block` stops what it started
        try:
            started.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(started.pid, signal.SIGKILL)
            started.wait()
        deadline = time.time() + 30
        while marked(mark) and time.time() < deadline:
            time.sleep(0.5)
        left = marked(mark)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
        assert left == [], f"the head left processes behind: {left}"


def join(head: Head, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    environment["HOME"] = str(head.home)
    environment.update(env)
    return subprocess.run([sys.executable, "benchmark.py", "-c", "config/toy.json", "--engine", "ray", "--ray-address",
                           head.address, "-v", "20", "-mi", "0", "--log-dir", str(tmp_path / "logs")], cwd=REPO,
                          env=environment, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


def test_a_driver_with_the_token_joins_a_cluster_ray_start_started(head, tmp_path, job_log):
    done = join(head, tmp_path)
    assert done.returncode == 0, done.stderr
    log = job_log(tmp_path / "logs")
    assert (log.meta["engine"]["cluster"], log.meta["engine"]["address"]) == ("given", head.address)
    assert len(log.rows) == 20


@pytest.mark.parametrize("who, env, lacks", [
    ("no_token", {}, "this driver has no token (none in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"),
    ("wrong_token", {"RAY_AUTH_TOKEN": "not-the-cluster-token"}, "refused the token this driver has from RAY_AUTH_TOKEN"),
], ids=["no_token", "wrong_token"])
def test_a_driver_without_the_right_token_is_refused_in_one_sentence_at_once(head, tmp_path, who, env, lacks):
    done = join(head, tmp_path, HOME=str(tmp_path), **env)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"benchmark.py: could not join the Ray cluster at {head.address}: it requires token "
                                   f"authentication and {lacks}; give the driver the token every node of the cluster "
                                   "has (docs/ray.md, token authentication)")
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())
