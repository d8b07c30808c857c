"""bench/faults.py's stall rows: jobs that stop making progress (a hang at init or on an item, a remote dataset
that stops answering, a full log directory, --max-duration) must end within their bound, holding exactly what
finished before; a job that keeps computing must not be ended."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.fault_jobs import (
    HANG_S,
    MARK,
    SETTLE_S,
    JobRun,
    isolation_works,
    marked,
    run_job,
)
from bench.fault_trials import REPO, FaultRow, ensure_dataset, table, toy

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
