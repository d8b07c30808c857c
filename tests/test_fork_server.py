"""How the local engine's children start: forked from a server that has torch loaded, as if spawned at that moment.

A forked child must see what a spawned one would: the main process's
environment and stderr as they are when the child starts, not as they were
when the fork server started (rnb.engines.local.lifeline).  A runner whose
arguments hold more descriptors than the server takes is spawned afresh.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from rnb import cli

REPO = Path(__file__).resolve().parents[1]


def surroundings_config(tmp_path: Path, slots: int) -> str:
    document = json.loads((REPO / "config/toy.json").read_text())
    document["pipeline"][0]["num_shared_tensors"] = slots
    document["pipeline"][1]["model"] = "tests.fixture_models.Surroundings"
    path = tmp_path / f"surroundings-{slots}.json"
    path.write_text(json.dumps(document))
    return str(path)


def run(tmp_path: Path, config: str, name: str) -> int:
    return cli.main(["-c", config, "--log-dir", str(tmp_path / name), "-v", "12", "--warmup", "0", "-mi", "0"])


def test_a_child_takes_the_environment_and_stderr_of_the_main_process_as_they_are_when_it_starts(
        tmp_path, monkeypatch, capfd, job_log):
    config = surroundings_config(tmp_path, 10)
    saved = os.dup(2)
    with open(tmp_path / "stderr-before", "w") as elsewhere:  # the fork server's stderr, if this job starts it
        os.dup2(elsewhere.fileno(), 2)
        try:
            assert run(tmp_path, config, "before") == 0
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    first = job_log(tmp_path / "before")
    assert {(row["mark"], row["forked"]) for row in first.rows} == {(-1, 1)}
    capfd.readouterr()
    monkeypatch.setenv("RNB_TEST_MARK", "7")
    assert run(tmp_path, config, "after") == 0
    log = job_log(tmp_path / "after")
    assert [row["item_id"] for row in log.rows] == list(range(12))
    assert {(row["mark"], row["forked"]) for row in log.rows} == {(7, 1)}
    final = next(p["pid"] for p in log.meta["processes"] if p["name"] == "step1-g0-r0")
    assert re.findall(r"Surroundings ready in pid (\d+)", capfd.readouterr().err) == [str(final)]


def test_a_runner_given_more_shared_slots_than_the_fork_server_takes_is_spawned_afresh_and_runs(tmp_path, job_log):
    """300 slots of step 0, each a descriptor in both runners' arguments: over the server's limit of about 250."""
    assert run(tmp_path, surroundings_config(tmp_path, 300), "logs") == 0
    log = job_log(tmp_path / "logs")
    assert [row["item_id"] for row in log.rows] == list(range(12))
    assert {row["forked"] for row in log.rows} == {0}
    assert log.children_left == []


def test_a_process_that_leaves_waits_for_its_fork_server_so_its_children_cpu_counts_as_its_own():
    """rusage of the children counts only the waited-for: the forked child's CPU reaches us through its server.

    The child hashes (a builtin, so the script imports nothing heavy); the
    same hashing here says how much CPU that is on this machine.
    """
    work = ("sha256", b"rnb", b"salt", 3_000_000)
    began = time.process_time()
    hashlib.pbkdf2_hmac(*work)
    expected = time.process_time() - began
    script = ("import hashlib\n"
              "from rnb.engines.local.lifeline import children_context\n"
              f"child = children_context().Process(target=hashlib.pbkdf2_hmac, args={work!r})\n"
              "child.start()\n"
              "child.join()\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    own = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert own >= 0.8 * expected, (own, expected)
