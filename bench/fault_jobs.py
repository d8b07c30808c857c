"""One benchmark job under a fault, watched from outside: how it ended, how fast, and what it left behind.

Each trial runs `python benchmark.py` in a mount namespace of its own (when
`unshare` is allowed) with a fresh tmpfs on /dev/shm, so whatever shared
memory the job leaves there is its own and can be counted.  Its processes
carry a mark in their environment, so any still alive after the main process
exits (an orphan) is found even once reparented.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "RNB_FAULT_TRIAL"
HANG_S = 180.0           # a trial still running this long has hung
SETTLE_S = 3.0           # after the main process exits: time for children and the resource tracker to go


@dataclass(frozen=True)
class JobRun:
    """What one job did: its exit code, output, log, and what it left behind."""

    returncode: int | None     # None: it hung and was killed
    stdout: str
    stderr: str
    meta: dict | None          # meta.json, when the job wrote it
    exit_time: float | None    # when the main process exited (epoch seconds)
    gone_time: float | None    # when no process of the job was left; None if some outlived SETTLE_S
    orphans: int               # its processes alive SETTLE_S after the main process exited
    leftovers: int | None      # entries left in its private /dev/shm; None without a namespace


def isolation_works() -> bool:
    """Whether this machine lets a process have its own /dev/shm (root, or a user namespace)."""
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs",
                            "/dev/shm"], capture_output=True)
    return probe.returncode == 0


def run_job(work: Path, argv: list[str], fault: Callable[[int, int], float | None] = lambda pid, group: None,
            isolated: bool = True, env: dict[str, str] | None = None) -> tuple[JobRun, float | None]:
    """Run benchmark.py with `argv`; `fault(main_pid, process_group)` acts on it and returns when it struck.

    Returns the run and the fault's time (None when the fault is inside the job, e.g. a model that raises).
    """
    work.mkdir(parents=True, exist_ok=True)
    mark = uuid.uuid4().hex
    report = work / "report.json"
    inner = [sys.executable, "benchmark.py", *argv, "--log-dir", str(work / "logs")]
    command = [sys.executable, __file__, str(report), mark, *inner]
    if isolated:
        command = ["unshare", "--mount", "--propagation", "private", *command]
    with open(work / "stdout", "w") as out, open(work / "stderr", "w") as err:
        wrapper = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, start_new_session=True,
                                   env={**os.environ, **(env or {})})
        pid = _wait_for_pid(report, wrapper)
        struck = fault(pid, wrapper.pid) if pid is not None else None
        try:
            wrapper.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()
    result = json.loads(report.read_text().splitlines()[-1]) if report.exists() else {}
    logs = sorted((work / "logs").glob("*/meta.json"))
    return JobRun(result.get("rc"), (work / "stdout").read_text(), (work / "stderr").read_text(),
                  json.loads(logs[0].read_text()) if logs else None, result.get("exit_time"),
                  result.get("gone_time"), len(marked(mark)), result.get("leftovers") if isolated else None), struck


def _wait_for_pid(report: Path, wrapper: subprocess.Popen) -> int | None:
    while wrapper.poll() is None:
        if report.exists() and report.read_text():
            return json.loads(report.read_text().splitlines()[0])["pid"]
        time.sleep(0.01)
    return None


def marked(mark: str) -> list[int]:
    """Live (not zombie) processes whose environment carries the trial's mark."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{MARK}={mark}".encode() in (entry / "environ").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def job_children(pid: int) -> list[int]:
    """The job's own children: the main process's and its fork server's, not the server or the resource tracker."""
    found = []
    for child in children(pid):
        command = command_line(child)
        if b"multiprocessing.forkserver" in command:
            found += children(child)
        elif b"resource_tracker" not in command:
            found.append(child)
    return found


def waiting_for_fork_server(pid: int, logs: Path) -> bool:
    """Whether the main process `pid` is at its first child: its job's log directory (under `logs`) exists and its fork
    server has forked nobody yet.

    The server starts before the main process imports anything (rnb.launch)
    and the stop handlers are set from the command's first line
    (rnb.engines.stopping), so neither says where the main process is; the
    log directory, opened just before the first child, does.
    """
    server = fork_server_of(pid)
    return server is not None and not children(server) and logs.is_dir() and any(logs.iterdir())


def fork_server_of(pid: int) -> int | None:
    """The pid of the main process `pid`'s fork server; None before it has started one."""
    return next((child for child in children(pid) if b"multiprocessing.forkserver" in command_line(child)), None)


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _inside(report: Path, mark: str, command: list[str]) -> int:
    """In the trial's namespace: a fresh /dev/shm, the job, then what it left there (one JSON line each).

    Only in a mount namespace of its own (run_job's `isolated`, through
    unshare): mounted in its caller's, the tmpfs would hide the machine's
    /dev/shm from every process on it, and the named semaphores of jobs
    already running with it (their children open them by name).
    """
    isolated = _namespace_of_its_own() and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4g", "tmpfs", "/dev/shm"], capture_output=True).returncode == 0
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, lambda *_: None)  # a signal to the trial's group is the job's to handle, not ours
    job = subprocess.Popen(command, env={**os.environ, MARK: mark})
    report.write_text(json.dumps({"pid": job.pid}) + "\n")
    rc = job.wait()
    exit_time = time.time()
    deadline = time.time() + SETTLE_S
    while marked(mark) and time.time() < deadline:
        time.sleep(0.01)
    gone_time = None if marked(mark) else time.time()
    left = None
    if isolated:  # the /dev/shm count waits out SETTLE_S: the resource tracker cleans up after a killed main
        time.sleep(max(0.0, deadline - time.time()))
        left = len(os.listdir("/dev/shm"))
    with report.open("a") as out:
        out.write(json.dumps({"rc": rc, "exit_time": exit_time, "gone_time": gone_time, "leftovers": left}) + "\n")
    return 0


def _namespace_of_its_own() -> bool:
    """Whether this process's mount namespace is another than its parent's (unshare --mount started it)."""
    try:
        return os.readlink("/proc/self/ns/mnt") != os.readlink(f"/proc/{os.getppid()}/ns/mnt")
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(_inside(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
