"""Reliability under faults: every way a job can go wrong, tried many times, and how each trial ended.

    .venv/bin/python bench/faults.py [--quick] [--json FILE] [--only crash,hold,signal,stall,config,remote,memory,ring,install]

One row per kind of fault.  `passes` counts the trials that ended as they
must: the defined exit code and termination reason, a complete log (for a
killed main process: an incomplete one, without meta.json), no traceback, and
nothing left behind.  `worst exit s` is the longest time from the fault to
the main process's exit (for a killed main process: to its last child's
exit; for config checks and remote reads: the whole check; for a hang,
from the moment the model began to hang, as it says on stderr).  `lost`
counts finished items the final step counted (meta.json's counted_items)
that the log does not hold: 0 is the promise.  The stall rows end jobs
that stop making progress: a model that hangs at init, on an item at each
step, a remote dataset that stops answering, a log directory that fills
up, and --max-duration; and one that does not stop (a step whose every
call computes for 3 x --stall-s), which must reach its target.  A hang
row passes only if the job ended within the stated bound of the hang
(S + 2 s of the stall watch, or timeout x attempts + 2 s of a remote read)
and holds exactly the items finished before it.  `orphans` counts
processes of a job still alive 3 s after its main process exited, `leftover
shm` the entries left in the job's private /dev/shm ("n/a" where this
machine gives no process its own mount namespace).  The memory rows run one
bulk toy job per `-v` side by side and print main's peak RSS (meta.json's
`main_peak_rss_bytes`, taken after the summary) and the bytes per item
between successive sizes: what main holds per finished item.  The ring row
(bench/ring_stress.py) kills the holders of the local engine's queue locks
for a while and counts what was acknowledged, lost and stranded.  Exit
codes: 0 every trial passed (and every memory job reached its target, and
the ring kept its promise), 1 some did not, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bench import ring_stress
from bench.fault_inputs import TOY, check_config, hand_made, load_inputs, mutants, remote_trial
from bench.fault_jobs import (
    HANG_S,
    MARK,
    SETTLE_S,
    JobRun,
    isolation_works,
    job_children,
    marked,
    run_job,
    waiting_for_fork_server,
)
from bench.fault_starts import INSTANTS, TURNS, Instant, judge_stop, strike_at
from bench.installed import check_installed

REPO = Path(__file__).resolve().parents[1]
GROUPS = ("crash", "hold", "signal", "stall", "config", "remote", "memory", "ring", "install")
RING_SECONDS = {True: 30.0, False: 120.0}   # how long the ring row kills, --quick or not
MEMORY_VIDEOS = (2000, 12000, 40000)
# A signal that stops a job from outside, and what the job must then record and return.
STOPS = {"SIGINT": (signal.SIGINT, "interrupted", 130), "SIGTERM": (signal.SIGTERM, "terminated", 143)}


@dataclass
class FaultRow:
    """One kind of fault: how many trials ended as they must, and the worst of what the others left."""

    id: str
    what: str
    trials: int = 0
    passes: int = 0
    worst_exit_s: float = 0.0
    orphans: int = 0
    leftovers: int | None = 0
    lost: int | None = None   # items the final step counted that the log lacks, over the trials; None: not known
    worst_end_s: float | None = None   # a hang row's longest time from the hang to the job's end (its flag)
    failures: list[str] = field(default_factory=list)

    def add(self, passed: bool, exit_s: float | None, note: str = "", orphans: int = 0,
            leftovers: int | None = None, lost: int | None = None, end_s: float | None = None) -> None:
        self.trials += 1
        self.passes += passed
        self.worst_exit_s = max(self.worst_exit_s, exit_s or 0.0)
        if end_s is not None:
            self.worst_end_s = max(self.worst_end_s or 0.0, end_s)
        self.orphans += orphans
        self.leftovers = None if leftovers is None or self.leftovers is None else self.leftovers + leftovers
        if lost is not None:
            self.lost = (self.lost or 0) + lost
        if not passed:
            self.failures.append(note)


def toy(**step_changes: dict) -> dict:
    document = copy.deepcopy(TOY)
    for k, changes in step_changes.items():
        document["pipeline"][int(k[-1])].update(changes)
    return document


def holding(hold: str) -> dict:
    return {"source": {"synthetic": True}, "pipeline": [
        {"model": "bench.fault_models.DiesHolding", "queue_groups": [{"gpus": [-1, -1]}], "hold": hold, "at_item": 3}]}


def after_start(work: Path, delay_s: float = 1.0, timeout_s: float = 120.0) -> None:
    """Wait until the job announces its start barrier, then `delay_s` more (some items finish)."""
    deadline = time.time() + timeout_s
    while "started" not in (work / "stderr").read_text() and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(delay_s)


def during_start_up(pid: int, logs: Path, timeout_s: float = 120.0) -> None:
    """Wait until the main process is at its first child, waiting for its fork server to import torch."""
    deadline = time.time() + timeout_s
    while not waiting_for_fork_server(pid, logs) and time.time() < deadline:
        time.sleep(0.01)


def signal_at(work: Path, sig: int, to_group: bool, start_up: bool = False) -> Callable[[int, int], float]:
    def act(pid: int, group: int) -> float:
        during_start_up(pid, work / "logs") if start_up else after_start(work)
        (os.killpg if to_group else os.kill)(group if to_group else pid, sig)
        return time.time()
    return act


def kill_a_child(work: Path) -> Callable[[int, int], float]:
    def act(pid: int, group: int) -> float:
        after_start(work)
        os.kill(job_children(pid)[0], signal.SIGKILL)
        return time.time()
    return act


def judge(run: JobRun, struck: float | None, code: int, reason: str | None) -> tuple[bool, float | None, str]:
    """Whether a job trial ended as it must; the time from fault to exit; what went wrong."""
    if run.returncode is None or run.exit_time is None:  # the report's last line carries both, or neither
        return False, None, f"no exit within {HANG_S:g} s, or no report: {run.stderr.strip()[-300:]!r}"
    if reason is None:  # the main process was killed: its children must go at once, its log stays incomplete
        exit_s = None if run.gone_time is None or struck is None else run.gone_time - struck
        ok = exit_s is not None and exit_s < 2.0 and run.meta is None
        return ok, exit_s, f"children gone after {exit_s} s; meta.json {'written' if run.meta else 'absent'}"
    meta = run.meta or {}
    exit_s = run.exit_time - (struck if struck is not None else meta.get("end_time", run.exit_time))
    problems = []
    if run.returncode != code:
        problems.append(f"exit {run.returncode}")
    if meta.get("termination_reason") != reason:
        problems.append(f"reason {meta.get('termination_reason')!r}")
    if "Traceback" in run.stderr:
        problems.append("a traceback")
    return not problems, exit_s, ", ".join(problems)


@dataclass(frozen=True)
class JobFault:
    """One kind of job trial: the config and arguments, the fault from outside (if any), the ending it must have."""

    id: str
    what: str
    config: dict
    argv: list[str]
    code: int                  # the main process's exit code (-9 when the fault is its SIGKILL)
    reason: str | None         # meta.json's termination_reason; None: no meta.json may be written
    fault: Callable[[Path], Callable[[int, int], float]] | None = None   # trial dir -> act(main pid, group)


BUSY = ["-v", "100000", "-mi", "20", "--warmup", "0"]
SHORT = ["-v", "60", "-mi", "0"]
HOLDS = {"flag": "the termination flag, mid-raise", "finished": "the finished count's lock",
         "status": "the status queue's write lock", "results": "half a message on the results queue"}


def job_faults(groups: set[str]) -> list[JobFault]:
    faults = []
    if "crash" in groups:
        faults += [JobFault("crash-init", "a runner raises while loading its model", toy(step1={"fail_at_init": True}),
                            SHORT, 1, "process failed"),
                   JobFault("crash-item", "a runner raises on item 5", toy(step0={"fail_at_item": 5}), SHORT, 1,
                            "process failed"),
                   JobFault("crash-exit", "a runner calls os._exit(3) on item 5", toy(step1={"exit_at_item": 5}),
                            SHORT, 1, "process failed"),
                   JobFault("crash-sigkill", "a child is SIGKILLed from outside mid-run", toy(), BUSY, 1,
                            "process failed", kill_a_child)]
    if "hold" in groups:
        faults += [JobFault(f"hold-{hold}", f"a child is SIGKILLed holding {what}", holding(hold),
                            ["-v", "200", "-mi", "2"], 1, "process failed") for hold, what in HOLDS.items()]
    if "signal" in groups:
        for name, (sig, reason, code) in STOPS.items():
            faults += [JobFault(f"signal-{name.lower()}-main", f"{name} to the main process mid-run", toy(), BUSY,
                                code, reason, partial(signal_at, sig=sig, to_group=False)),
                       JobFault(f"signal-{name.lower()}-group", f"{name} to the whole process group mid-run", toy(),
                                BUSY, code, reason, partial(signal_at, sig=sig, to_group=True))]
        faults += [JobFault("signal-sigkill-main", "SIGKILL to the main process mid-run", toy(), BUSY, -9, None,
                            lambda w: signal_at(w, signal.SIGKILL, False)),
                   JobFault("signal-sigkill-main-start-up", "SIGKILL to the main process while children start",
                            toy(), SHORT, -9, None, lambda w: signal_at(w, signal.SIGKILL, False, start_up=True))]
    return faults


def job_rows(work: Path, trials: int, groups: set[str], isolated: bool) -> list[FaultRow]:
    """The job trials: crashes, deaths while holding shared plumbing, signals."""
    rows = []
    for kind in job_faults(groups):
        row = FaultRow(kind.id, kind.what)
        for trial in range(trials):
            trial_dir = work / row.id / str(trial)
            trial_dir.mkdir(parents=True)
            (trial_dir / "job.json").write_text(json.dumps(kind.config))
            fault = kind.fault(trial_dir) if kind.fault else (lambda pid, group: None)
            run, struck = run_job(trial_dir, ["-c", str(trial_dir / "job.json"), *kind.argv], fault, isolated)
            passed, exit_s, note = judge(run, struck, kind.code, kind.reason)
            passed = passed and run.orphans == 0 and not run.leftovers
            row.add(passed, exit_s, f"trial {trial}: {note}", run.orphans, run.leftovers)
        rows.append(row)
        print(table([row], header=False), flush=True)
    return rows


def start_up_config(instant: Instant, work: Path) -> tuple[dict, list[str]]:
    """The config a start-up row's job runs, and the arguments it needs beside it."""
    if instant.config == "default":
        return json.loads((REPO / "config" / "default.json").read_text()), ["--dataset", str(ensure_dataset(work))]
    if instant.config == "hangs":
        return toy(step1={"model": "bench.fault_models.Hangs", "inner": "models.toy.TinyConvNet", "at_init": True}), []
    return toy(), []


def start_up_rows(work: Path, trials: int, isolated: bool) -> list[FaultRow]:
    """Ctrl-C or SIGTERM to the job's process group at each instant of start-up, the two in turn, on both engines."""
    rows = []
    for instant in INSTANTS:
        row = FaultRow(f"signal-start-{instant.name}", f"SIGINT or SIGTERM (in turn) to the process group while "
                                                       f"{instant.what}")
        for trial in range(trials):
            number, code, reason = TURNS[trial % len(TURNS)]
            trial_dir = work / row.id / str(trial)
            trial_dir.mkdir(parents=True)
            config, extra = start_up_config(instant, work)
            (trial_dir / "job.json").write_text(json.dumps(config))
            logs = trial_dir / "logs"
            run, struck = run_job(trial_dir, ["-c", str(trial_dir / "job.json"), *instant.argv, *extra],
                                  strike_at(instant, trial_dir / "stderr", logs, number), isolated)
            passed, gone_s, note = judge_stop(run, struck, logs, code, reason)
            row.add(passed and run.orphans == 0, gone_s, f"trial {trial} ({signal.Signals(number).name}): {note}",
                    run.orphans, run.leftovers)
        rows.append(row)
        print(table([row], header=False), flush=True)
    return rows


STALL_S = 3.0
HANG_AT = 5                        # the item a mid-run hang stops on: the items before it are the ones finished
REMOTE_TIMEOUT_S, REMOTE_RETRIES = 1.0, 1
MAX_DURATION_S = 3.0


def three_steps(step: int, **hang: object) -> dict:
    """The toy pipeline with a pass-through middle step, step `step` wrapped in bench.fault_models.Hangs(**hang)."""
    document = toy()
    document["pipeline"][1] = {"model": "models.toy.AsyncSleep", "num_shared_tensors": 10,
                               "queue_groups": [{"gpus": [-1], "in_queue": 0, "out_queues": [0]}]}
    document["pipeline"].append({"model": "models.toy.TinyConvNet", "classes": 10,
                                 "queue_groups": [{"gpus": [-1], "in_queue": 0}]})
    wrapped = document["pipeline"][step]
    wrapped.update(model="bench.fault_models.Hangs", inner=wrapped["model"], **hang)
    return document


def hung_at(stderr: str) -> float | None:
    """When a fault model began to hang, as it said on stderr."""
    found = re.findall(r"fault: .* hangs \(\w+\) at ([\d.]+)", stderr)
    return float(found[0]) if found else None


@dataclass(frozen=True)
class Ending:
    """What a stall row's trial must end with, and the bound its end must keep."""

    code: int
    reason: str
    rows: int | None = None        # exactly this many items in the log (those finished before the hang)
    bound_s: float | None = None   # from the hang to the job's end (meta.json's end_time)


@dataclass(frozen=True)
class Verdict:
    """How a stall row's trial ended: passed, seconds from the fault to the exit and to the job's end, items lost."""

    passed: bool
    exit_s: float | None
    end_s: float | None
    lost: int | None
    note: str


def judge_stall(run: JobRun, began: float | None, ending: Ending) -> Verdict:
    """Whether a stall row's trial ended as it must, timed from `began` (the fault), and what went wrong."""
    if run.returncode is None or run.exit_time is None:
        return Verdict(False, None, None, None, f"no exit within {HANG_S:g} s: {run.stderr.strip()[-300:]!r}")
    meta = run.meta or {}
    problems = []
    if run.returncode != ending.code:
        problems.append(f"exit {run.returncode}")
    if meta.get("termination_reason") != ending.reason:
        problems.append(f"reason {meta.get('termination_reason')!r}")
    if "Traceback" in run.stderr:
        problems.append("a traceback")
    counted, finished = meta.get("counted_items"), meta.get("finished_items")
    lost = None if counted is None or finished is None else counted - finished
    if lost:
        problems.append(f"{lost} finished items missing from the log")
    if ending.rows is not None and finished != ending.rows:
        problems.append(f"{finished} items in the log, not {ending.rows}")
    end = meta.get("end_time")
    end_s = None if began is None or end is None else end - began
    if ending.bound_s is not None and (end_s is None or end_s > ending.bound_s):
        problems.append(f"ended {None if end_s is None else round(end_s, 2)} s after the fault, past {ending.bound_s:g} s")
    started = began if began is not None else end if end is not None else run.exit_time
    return Verdict(not problems, run.exit_time - started, end_s, lost, ", ".join(problems))


def stall_rows(work: Path, trials: int, isolated: bool) -> list[FaultRow]:
    """Jobs that stop making progress without failing, a log directory that fills up, and the maximum duration."""
    bound = STALL_S + 2.0
    stall = ["--stall-s", f"{STALL_S:g}", "--warmup", "0"]
    cases: list[tuple[str, str, dict, list[str], Ending]] = [
        ("stall-init", "a runner hangs (a deadlock) while loading its model", three_steps(1, at_init=True),
         ["-v", "60", "-mi", "0", *stall], Ending(1, "stalled", rows=0)),
        *((f"stall-step{k}", f"step {k} of 3 hangs (a deadlock) on item {HANG_AT}", three_steps(k, at_item=HANG_AT),
           ["-v", "200", "-mi", "2", *stall], Ending(1, "stalled", rows=HANG_AT, bound_s=bound)) for k in (0, 1)),
        ("stall-final", f"the final step hangs (a deadlock) on item {HANG_AT}: it holds the cards it finished",
         three_steps(2, at_item=HANG_AT), ["-v", "200", "-mi", "2", *stall],
         Ending(1, "stalled", rows=HANG_AT, bound_s=bound)),
        ("stall-flush", "the final step hangs (a busy loop) in flush, its input idle", three_steps(2, in_flush=True,
                                                                                                  how="spin"),
         ["-v", "60", "-mi", "20", *stall], Ending(1, "stalled", bound_s=bound)),
        ("stall-slow", f"step 1 of 3 computes for {3 * STALL_S:g} s (3 x --stall-s) on every item: slow, not stuck",
         three_steps(1, busy_s=3 * STALL_S), ["-v", "3", "-mi", "0", *stall], Ending(0, "target reached", rows=3)),
        ("max-duration", f"--max-duration {MAX_DURATION_S:g} on a job that would run for hours", toy(),
         ["-v", "1000000", "-mi", "5", "--max-duration", f"{MAX_DURATION_S:g}"], Ending(0, "max duration")),
    ]
    rows = []
    for row_id, what, config, argv, ending in cases:
        row = FaultRow(row_id, what)
        for trial in range(trials):
            trial_dir = work / row_id / str(trial)
            trial_dir.mkdir(parents=True)
            (trial_dir / "job.json").write_text(json.dumps(config))
            run, _ = run_job(trial_dir, ["-c", str(trial_dir / "job.json"), *argv], isolated=isolated)
            began = hung_at(run.stderr) if row_id.startswith("stall") else None
            verdict = judge_stall(run, began, ending)
            row.add(verdict.passed and run.orphans == 0 and not run.leftovers, verdict.exit_s, f"trial {trial}: "
                    f"{verdict.note}", run.orphans, run.leftovers, verdict.lost, verdict.end_s)
        rows.append(row)
        print(table([row], header=False), flush=True)
    rows.append(idle_client_row(work / "idle-client", trials, isolated))
    print(table(rows[-1:], header=False), flush=True)
    rows.append(remote_hang_row(work / "remote-hang", trials, isolated))
    print(table(rows[-1:], header=False), flush=True)
    rows.append(full_disk_row(work / "disk-full", trials))
    print(table(rows[-1:], header=False), flush=True)
    return rows


def idle_client_row(work: Path, trials: int, isolated: bool) -> FaultRow:
    """A trace whose sixth request is due 1000 s after its fifth: once the pipeline has been idle --stall-s, the job
    ends as stalled, naming the client and when its next request is due, keeping the five it finished."""
    row = FaultRow("stall-idle-client", f"a trace's next arrival 1000 s off, the pipeline idle: ended --stall-s "
                                        f"({STALL_S:g} s) after the last item left, naming the client")
    for trial in range(trials):
        trial_dir = work / str(trial)
        trial_dir.mkdir(parents=True)
        (trial_dir / "gap.csv").write_text("offset_s\n0\n0.1\n0.2\n0.3\n0.4\n1000\n")
        (trial_dir / "job.json").write_text(json.dumps(toy()))
        run, _ = run_job(trial_dir, ["-c", str(trial_dir / "job.json"), "--arrivals", str(trial_dir / "gap.csv"),
                                     "-v", "6", "--stall-s", f"{STALL_S:g}", "--warmup", "0"], isolated=isolated)
        verdict = judge_stall(run, None, Ending(1, "stalled", rows=5))
        meta = run.meta or {}
        sentence = meta.get("error") or ""
        last_left = (meta.get("end_time") or 0.0) - (meta.get("start_time") or 0.0)
        passed = verdict.passed and meta.get("failed_process") == "client" and "request 5 is due 1000.0 s" in sentence
        row.add(passed and run.orphans == 0 and not run.leftovers, verdict.exit_s,
                f"trial {trial}: {verdict.note}; {sentence[:160]!r}", run.orphans, run.leftovers, verdict.lost,
                last_left - 0.4)   # from the last arrival (0.4 s) to the end: the pipeline's drain, then --stall-s
    return row


def remote_hang_row(work: Path, trials: int, isolated: bool) -> FaultRow:
    """A remote dataset's server stops answering mid-run: the loader's read fails, the job ends with its URL."""
    from episodes.testing.faults import serve_with_faults

    bound = REMOTE_TIMEOUT_S * (REMOTE_RETRIES + 1) + 0.2 + 2.0  # timeout x attempts (+ the backoff) + 2 s
    row = FaultRow("remote-hang", f"a remote dataset's server stops answering mid-run (source timeout_s "
                   f"{REMOTE_TIMEOUT_S:g}, retries {REMOTE_RETRIES})")
    root = ensure_dataset(work.parent)
    for trial in range(trials):
        trial_dir = work / str(trial)
        trial_dir.mkdir(parents=True)
        stalled_at: list[float] = []

        def schedule(n: int) -> str | None:   # the start-up's reads and a few items', then nothing ever again
            if n < 12:
                return None
            stalled_at.append(time.time())
            return "stall"

        with serve_with_faults(root, schedule) as url:
            document = {"source": {"dataset": url, "order": "sequential", "timeout_s": REMOTE_TIMEOUT_S,
                                   "retries": REMOTE_RETRIES}, "pipeline": [
                {"model": "models.episode.EpisodeLoader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}],
                 "num_clips": 1, "clip_length": 2, "size": 16, "byte_budget": 1, "prefetch": 0},
                {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}], "clips": 1}]}
            (trial_dir / "job.json").write_text(json.dumps(document))
            run, _ = run_job(trial_dir, ["-c", str(trial_dir / "job.json"), "-v", "40", "-mi", "0", "--warmup", "0"],
                             isolated=isolated, env={"RNB_CACHE_DIR": str(trial_dir / "cache")})
        verdict = judge_stall(run, stalled_at[0] if stalled_at else None, Ending(1, "process failed", bound_s=bound))
        passed, note = verdict.passed, verdict.note
        sentence = (run.meta or {}).get("error") or ""
        if url not in sentence or f"timeout of {REMOTE_TIMEOUT_S:g} s" not in sentence:
            passed, note = False, f"{note}; the error {sentence!r} does not name the URL and the timeout"
        row.add(passed and run.orphans == 0 and not run.leftovers, verdict.exit_s, f"trial {trial}: {note}",
                run.orphans, run.leftovers, verdict.lost, verdict.end_s)
    return row


def full_disk_row(work: Path, trials: int) -> FaultRow:
    """--log-dir is a 256 KiB tmpfs of the trial's own, which the job fills: exit 1, one sentence naming the file."""
    row = FaultRow("disk-full", "--log-dir a 256 KiB tmpfs that fills while the job runs")
    if not isolation_works():
        row.add(False, None, "needs unshare and mount to give the job a small tmpfs")
        return row
    for trial in range(trials):
        trial_dir = work / str(trial)
        logs, kept = trial_dir / "logs", trial_dir / "kept"
        logs.mkdir(parents=True)
        script = (f"mount -t tmpfs -o size=256k tmpfs {logs} && mount -t tmpfs -o size=64m tmpfs /dev/shm && "
                  f"{sys.executable} benchmark.py -c config/toy.json -mi 0 -v 30000 --log-dir {logs}; code=$?; "
                  f"cp -r {logs} {kept}; echo leftover_shm=$(ls /dev/shm | wc -l) >&2; exit $code")
        mark = uuid.uuid4().hex
        began = time.time()
        with open(trial_dir / "stderr", "w") as err:
            job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                                   env={**os.environ, MARK: mark}, stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True)
            try:
                job.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        took = time.time() - began
        deadline = time.time() + SETTLE_S  # as run_job: time for the children and the resource tracker to go
        while marked(mark) and time.time() < deadline:
            time.sleep(0.05)
        said = (trial_dir / "stderr").read_text()
        errors = [line for line in said.splitlines() if "could not write" in line]
        metas = list(kept.glob("*/meta.json"))
        meta = json.loads(metas[0].read_text()) if metas else {}
        counted, finished = meta.get("counted_items"), meta.get("finished_items")
        leftover = re.findall(r"leftover_shm=(\d+)", said)
        orphans = len(marked(mark))
        passed = (job.returncode == 1 and len(errors) == 1 and "No space left on device" in errors[0]
                  and "Traceback" not in said and meta.get("termination_reason") in (None, "log write failed"))
        # What the full directory could not take is lost to the log, by definition: counted, not judged.
        row.add(passed and orphans == 0 and leftover == ["0"], took, f"trial {trial}: exit {job.returncode}, "
                f"{errors or said[-300:]!r}", orphans, int(leftover[0]) if leftover else None,
                None if counted is None or finished is None else counted - finished)
    return row


def config_rows(work: Path, mutations: int, runs: int, isolated: bool) -> list[FaultRow]:
    hand = FaultRow("config-hand-made", "configs broken by hand (files, JSON, values), --check")
    check_config(["-c", str(REPO / "config" / "toy.json")])  # imports torch and the models once, untimed
    for what, argv in hand_made(work):
        passed, seconds, said = check_config(argv)
        hand.add(passed and said != "", seconds, f"{what}: {said}")
    bounded = FaultRow("config-load-bounds", "load values no job could finish with, and bad traces and schedules: "
                       "refused, --check")
    for what, argv in load_inputs(work):
        passed, seconds, said = check_config(argv)
        bounded.add(passed and said != "", seconds, f"{what}: {said}")
    mutated = FaultRow("config-mutated", "random mutations of the shipped configs, --check (seed 0)")
    ran = FaultRow("config-mutated-run", "mutants of toy.json and default.json that pass --check, then run (-v 4): "
                   "exit 0 or 1 with a log")
    dataset = ensure_dataset(work)
    for n, (what, text) in enumerate(mutants(sorted((REPO / "config").glob("*.json")), mutations, seed=0)):
        path = work / f"mutant-{n}.json"
        path.write_text(text)
        extra = ["--dataset", str(dataset)] if '"dataset"' in text else []
        passed, seconds, said = check_config(["-c", str(path), *extra])
        mutated.add(passed, seconds, f"{what}: {said}")
        # Only the small configs run: R(2+1)D configs take minutes per job on a CPU.
        if passed and not said and ran.trials < runs and what.startswith(("toy.json", "default.json")):
            run, _ = run_job(work / f"mutant-{n}", ["-c", str(path), *extra, "-v", "4", "-mi", "0", "--cpu"],
                             isolated=isolated)
            ok = run.returncode in (0, 1) and run.meta is not None and "Traceback" not in run.stderr
            exit_s = None if run.exit_time is None or run.meta is None else run.exit_time - run.meta["end_time"]
            ran.add(ok and run.orphans == 0 and not run.leftovers, exit_s, f"{what}: exit {run.returncode}",
                    run.orphans, run.leftovers)
    return [hand, bounded, mutated, ran]


def installed_row(work: Path) -> FaultRow:
    """`pip install .` into a fresh environment, then rnb-benchmark from another directory (bench/installed.py)."""
    row = FaultRow("installed-command", "pip install . into a fresh environment; rnb-benchmark --check and "
                                       "-v 20 -mi 0 (the embedded default config) from another directory")
    began = time.time()
    problems = check_installed(work)
    row.add(not problems, time.time() - began, "; ".join(problems))
    return row


def ensure_dataset(work: Path) -> Path:
    from episodes.synthetic import SyntheticSpec, make_dataset

    root = work / "dataset"
    if not root.exists():
        make_dataset(root, SyntheticSpec(codec="h264", gop=4, episodes=4, cameras=1, episodes_per_file=2,
                                         min_length=8, max_length=12, width=32, height=32, seed=1))
    return root


def remote_rows(work: Path, trials: int) -> list[FaultRow]:
    from episodes import EpisodeByteCache, FrameRequest, open_dataset

    root = ensure_dataset(work)
    local = open_dataset(str(root))
    key = local.video_keys[0]
    with EpisodeByteCache(local, cache_dir=work / "local-cache") as cache:
        reads = cache.read_frames([FrameRequest(ep, key, frame_numbers=[0, 1]) for ep in range(local.num_episodes)])
    reference = {ep: read.frames for ep, read in enumerate(reads)}
    rows = []
    for probability in (0.1, 0.5):
        row = FaultRow(f"remote-{int(probability * 100)}", f"a server faulty on {probability:.0%} of range requests "
                       "(whole file, other range, 503, cut short, dropped): exact frames or a FetchError")
        for trial in range(trials):
            cache_dir = work / f"cache-{probability}-{trial}"
            passed, seconds, note = remote_trial(root, reference, key, probability, trial, cache_dir)
            row.add(passed, seconds, f"trial {trial}: {note}")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class MemoryRow:
    """Main's peak RSS for one bulk toy job of `videos` items, and the bytes per item since the previous row."""

    videos: int
    finished: int
    main_peak_rss_bytes: int | None
    bytes_per_item: float | None


def memory_rows(work: Path, sizes: tuple[int, ...], isolated: bool) -> list[MemoryRow]:
    rows: list[MemoryRow] = []
    for videos in sizes:
        run, _ = run_job(work / f"memory-{videos}", ["-c", str(REPO / "config" / "toy.json"), "-mi", "0",
                                                     "-v", str(videos)], isolated=isolated)
        meta = run.meta or {}
        peak = meta.get("main_peak_rss_bytes")
        before = rows[-1] if rows else None
        slope = None if before is None or peak is None or before.main_peak_rss_bytes is None else (
            (peak - before.main_peak_rss_bytes) / (videos - before.videos))
        rows.append(MemoryRow(videos, meta.get("finished_items", 0), peak, slope))
        print(memory_table(rows[-1:], header=False), flush=True)
    return rows


def memory_table(rows: list[MemoryRow], header: bool = True) -> str:
    lines = ["| -v | finished | main peak RSS MiB | bytes per item since the row above |",
             "|---|---|---|---|"] if header else []
    for r in rows:
        peak = "-" if r.main_peak_rss_bytes is None else f"{r.main_peak_rss_bytes / 2**20:.1f}"
        slope = "-" if r.bytes_per_item is None else f"{r.bytes_per_item:.0f}"
        lines.append(f"| {r.videos} | {r.finished} | {peak} | {slope} |")
    return "\n".join(lines)


def table(rows: list[FaultRow], header: bool = True) -> str:
    lines = ["| id | what | trials | passes | worst end s | worst exit s | lost items | orphans | leftover shm |",
             "|---|---|---|---|---|---|---|---|---|"] if header else []
    for r in rows:
        left = "n/a" if r.leftovers is None else str(r.leftovers)
        lost = "-" if r.lost is None else str(r.lost)
        end = "-" if r.worst_end_s is None else f"{r.worst_end_s:.2f}"
        lines.append(f"| {r.id} | {r.what} | {r.trials} | {r.passes} | {end} | {r.worst_exit_s:.2f} | {lost} | "
                     f"{r.orphans} | {left} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one trial per job fault, fewer mutants")
    parser.add_argument("--json", metavar="FILE", help="also write every row, failures included, as JSON")
    parser.add_argument("--only", help=f"comma-separated groups of {', '.join(GROUPS)}")
    args = parser.parse_args(argv)
    groups = set(args.only.split(",")) if args.only else set(GROUPS)
    if not groups <= set(GROUPS):
        parser.error(f"--only takes groups of {', '.join(GROUPS)}")
    isolated = isolation_works()
    rows: list[FaultRow] = []
    with tempfile.TemporaryDirectory(prefix="rnb-faults-") as tmp:
        work = Path(tmp)
        rows += job_rows(work / "jobs", 1 if args.quick else 5, groups, isolated)
        if "signal" in groups:
            rows += start_up_rows(work / "starts", 2 if args.quick else 6, isolated)
        if "stall" in groups:
            rows += stall_rows(work / "stalls", 1 if args.quick else 5, isolated)
        if "config" in groups:
            rows += config_rows(work, 40 if args.quick else 300, 2 if args.quick else 10, isolated)
        if "remote" in groups:
            rows += remote_rows(work, 3 if args.quick else 20)
        if "install" in groups:
            rows.append(installed_row(work / "installed"))
            print(table(rows[-1:], header=False), flush=True)
        memory = memory_rows(work, MEMORY_VIDEOS[:2] if args.quick else MEMORY_VIDEOS, isolated) \
            if "memory" in groups else []
        ring = [ring_stress.run(RING_SECONDS[args.quick])] if "ring" in groups else []
    if rows:
        print(table(rows))
    if memory:
        print(memory_table(memory))
    if ring:
        print(ring_stress.table(ring))
    for row in rows:
        for failure in row.failures:
            print(f"{row.id}: FAILED {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in [*rows, *memory, *ring]], indent=2) + "\n")
    reached = all(row.finished == row.videos for row in memory)
    return 0 if reached and all(r.passed for r in ring) and all(row.passes == row.trials for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
