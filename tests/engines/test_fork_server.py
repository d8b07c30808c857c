"""How the local engine's children start: forked from a server that has torch loaded, as if spawned at that moment.

A forked child must see what a spawned one would: the main process's
environment and stderr as they are when the child starts, not as they were
when the fork server started (rnb.engines.local.lifeline).  A runner whose
arguments hold more descriptors than the server takes is spawned afresh.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rnb import cli
from rnb.engines.local.lifeline import PRELOADED, TIMER_SLACK_NS, TORCH_ONLY_MODELS, early_preload
from rnb.launch import config_document, starts_local_children

REPO = Path(__file__).resolve().parents[2]


def surroundings_config(tmp_path: Path, slots: int) -> str:
    document = json.loads((REPO / "config/toy.json").read_text())
    document["pipeline"][0]["num_shared_tensors"] = slots
    document["pipeline"][1]["model"] = "tests.support.fixture_models.Surroundings"
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
    # At most the slack asked for: one full run read 0 in a child spawned afresh (a thread the kernel gives none),
    # never Linux's default of 50,000 ns.
    assert max(row["timer_slack_ns"] for row in log.rows) <= TIMER_SLACK_NS
    final = next(p["pid"] for p in log.meta["processes"] if p["name"] == "step1-g0-r0")
    assert re.findall(r"Surroundings ready in pid (\d+)", capfd.readouterr().err) == [str(final)]


def test_a_runner_given_more_shared_slots_than_the_fork_server_takes_is_spawned_afresh_and_runs(tmp_path, job_log):
    """300 slots of step 0, each a descriptor in both runners' arguments: over the server's limit of about 250."""
    assert run(tmp_path, surroundings_config(tmp_path, 300), "logs") == 0
    log = job_log(tmp_path / "logs")
    assert [row["item_id"] for row in log.rows] == list(range(12))
    assert {row["forked"] for row in log.rows} == {0}
    # At most the slack asked for: one full run read 0 in a child spawned afresh (a thread the kernel gives none),
    # never Linux's default of 50,000 ns.
    assert max(row["timer_slack_ns"] for row in log.rows) <= TIMER_SLACK_NS
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


def test_only_a_command_for_a_job_on_this_host_starts_its_fork_server_early() -> None:
    assert starts_local_children([]) and starts_local_children(["-c", "config/toy.json", "-mi", "3"])
    assert starts_local_children(["-c", "ray", "--engine", "local"])  # "ray" as another flag's value
    for flags in (["-h"], ["--help"], ["-c", "x.json", "--check"], ["--engine", "ray", "-c", "x.json"],
                  ["-c", "x.json", "--engine=ray"]):
        assert not starts_local_children(flags), flags


def test_the_early_server_preloads_torch_alone_only_for_torch_only_models_on_a_source_of_no_episodes() -> None:
    toy = json.loads((REPO / "config/toy.json").read_text())
    assert early_preload(toy) == ("torch",)
    assert early_preload(json.loads((REPO / "config/tune-example.json").read_text())) == ("torch",)
    assert early_preload(json.loads((REPO / "config/default.json").read_text())) == PRELOADED  # episodes, R(2+1)D
    on_episodes = {**toy, "source": {"dataset": "data/synthetic"}}
    assert early_preload(on_episodes) == early_preload({**toy, "source": {"videos": "x/*.mp4"}}) == PRELOADED
    with_r2p1d = {**toy, "pipeline": [*toy["pipeline"], {"model": "models.r2p1d.R2P1DRunner"}]}
    assert early_preload(with_r2p1d) == PRELOADED
    for not_a_config in (None, [], "x", {"pipeline": 3}):
        assert early_preload(not_a_config) == ("torch",)
    assert early_preload({"pipeline": [{"model": 7}]}) == PRELOADED   # no module known to load torch alone


def test_each_torch_only_model_module_loads_neither_torchvision_nor_torchcodec() -> None:
    script = ("import importlib, sys\n"
              f"for name in {sorted(TORCH_ONLY_MODELS)!r}:\n"
              "    importlib.import_module(name)\n"
              f"print([name for name in {PRELOADED!r} if name in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['torch']"]


def test_the_command_reads_the_config_its_arguments_name_before_parsing_them(tmp_path: Path) -> None:
    config = tmp_path / "x.json"
    config.write_text('{"a": 1}')
    for argv in (["-c", str(config)], [f"-c{config}"], [f"--config={config}"], ["--config_file_path", str(config)],
                 ["-c", "config/toy.json", "-mi", "3", "-c", str(config)]):
        assert config_document(argv) == {"a": 1}, argv
    assert config_document(["-mi", "3"]) == json.loads((REPO / "rnb/pipeline/default.json").read_text())
    assert config_document(["-c", str(tmp_path / "missing.json")]) is None
    config.write_text("{")
    assert config_document(["-c", str(config)]) is None


def test_an_episode_job_s_main_process_leaves_torchvision_and_torchcodec_to_its_children() -> None:
    """Checking the default config (a dataset opened, the models' keywords vetted) loads neither: 2.4 CPU-s a job."""
    script = ("import sys\n"
              "from rnb.cli import main\n"
              "code = main(['-c', 'config/default.json', '--check'])\n"
              f"print(code, [name for name in {PRELOADED!r} if name in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "0 ['torch']"


def test_a_server_started_at_the_first_child_preloads_what_the_config_needs_beyond_this_process_s_imports(
        tmp_path: Path) -> None:
    out = tmp_path / "child.txt"
    report = f"import sys; open({str(out)!r}, 'w').write(repr([n in sys.modules for n in {PRELOADED!r}]))"
    script = ("import sys\n"
              "import torch\n"
              "from rnb.engines.local.lifeline import children_context\n"
              "context = children_context({'source': {'dataset': 'data/synthetic'}, 'pipeline': []})\n"
              f"child = context.Process(target=exec, args=({report!r},))\n"
              "child.start()\n"
              "child.join()\n"
              f"print(repr([name in sys.modules for name in {PRELOADED!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout) == [True, False, False]   # this process: torch alone
    assert ast.literal_eval(out.read_text()) == [True, True, True]


# Run in a fresh interpreter: start the server early with `preload`, import `extra`, then fork a child that reports,
# before it imports anything, what it already has and whose child it is.
EARLY_SCRIPT = """
import multiprocessing.forkserver, os, sys
from rnb.engines.local.lifeline import children_context, start_fork_server
start_fork_server({preload!r})
early = multiprocessing.forkserver._forkserver._forkserver_pid
assert early is not None and "torch" not in sys.modules  # running before this process imported torch
import torch{extra}
report = "import os, sys; open({out!r}, 'w').write(repr(({names!r}, [n in sys.modules for n in {names!r}], os.getppid())))"
child = children_context().Process(target=exec, args=(report,))
child.start()
child.join()
print(early, os.path.exists(f"/proc/{{early}}"))
"""


@pytest.mark.parametrize(("preload", "extra", "kept"), [
    (("torch",), "", True),
    (("torch",), ", torchvision", False),
    (PRELOADED, ", torchvision", True),
])
def test_an_early_fork_server_serves_a_job_that_loaded_no_more_than_it_preloaded_and_is_replaced_for_one_that_did(
        tmp_path: Path, preload: tuple[str, ...], extra: str, kept: bool) -> None:
    out = tmp_path / "child.txt"
    names = ("torch", "torchvision")
    script = EARLY_SCRIPT.format(preload=preload, extra=extra, out=str(out), names=names)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    early, early_alive = done.stdout.split()
    _, loaded, parent = ast.literal_eval(out.read_text())
    if kept:   # forked from the early server, with what it preloaded
        assert loaded == [True, "torchvision" in preload] and parent == int(early)
    else:      # a new server, preloading torchvision too; the early one is gone
        assert loaded == [True, True] and parent != int(early) and early_alive == "False"


def test_a_main_process_killed_after_starting_its_server_early_leaves_no_shared_memory() -> None:
    """multiprocessing's resource tracker outlives the killed process and removes what it had registered."""
    script = ("import os, signal\n"
              "from multiprocessing import shared_memory\n"
              "from rnb.engines.local.lifeline import start_fork_server\n"
              "start_fork_server()\n"
              "segment = shared_memory.SharedMemory(create=True, size=4096)\n"
              "print(segment.name, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL
    segment = Path("/dev/shm") / done.stdout.strip().lstrip("/")
    deadline = time.monotonic() + 30
    while segment.exists() and time.monotonic() < deadline:  # once the server, the pipe's other holder, has left
        time.sleep(0.1)
    assert not segment.exists()


def test_a_process_that_leaves_before_its_first_child_kills_its_early_server_rather_than_wait_for_it() -> None:
    """The server's torch import made to take 60 s (tests/support/slow_imports), as a config that fails its checks leaves:
    the exit hook kills the unused server; waiting (at most STOP_WAIT_S) would leave it importing for nobody."""
    script = ("import os, multiprocessing.forkserver\n"
              "from rnb.engines.local import lifeline\n"
              "lifeline.start_fork_server()\n"
              "server = multiprocessing.forkserver._forkserver._forkserver_pid\n"
              "lifeline._stop_fork_server()\n"
              "print(os.path.exists(f'/proc/{server}'))\n")
    env = {**os.environ, "RNB_TEST_IMPORT_DELAY_S": "60",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "support" / "slow_imports"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
