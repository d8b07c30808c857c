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
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench import ring_stress
from bench.fault_inputs import check_config, hand_made, load_inputs, mutants, remote_trial
from bench.fault_jobs import (
    isolation_works,
    job_children,
    run_job,
)
from bench.fault_stalls import stall_rows
from bench.fault_starts import INSTANTS, TURNS, Instant, judge_stop, strike_at
from bench.fault_trials import REPO, FaultRow, after_start, during_start_up, ensure_dataset, holding, judge, table, toy
from bench.installed import check_installed

GROUPS = ("crash", "hold", "signal", "stall", "config", "remote", "memory", "ring", "install")
RING_SECONDS = {True: 30.0, False: 120.0}   # how long the ring row kills, --quick or not
MEMORY_VIDEOS = (2000, 12000, 40000)
# A signal that stops a job from outside, and what the job must then record and return.
STOPS = {"SIGINT": (signal.SIGINT, "interrupted", 130), "SIGTERM": (signal.SIGTERM, "terminated", 143)}

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
                                  strike_at(instant, trial_dir / "stderr", logs, number), isolated, instant.env())
            passed, gone_s, note = judge_stop(run, struck, logs, code, reason)
            row.add(passed and run.orphans == 0, gone_s, f"trial {trial} ({signal.Signals(number).name}): {note}",
                    run.orphans, run.leftovers)
        rows.append(row)
        print(table([row], header=False), flush=True)
    return rows

# Mutants drawn per run the row asks for: about one in seven of the two small configs' mutants passes --check.
RUN_DRAWS_PER_TRIAL = 20


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
    dataset = ensure_dataset(work)
    for n, (what, text) in enumerate(mutants(sorted((REPO / "config").glob("*.json")), mutations, seed=0)):
        passed, seconds, said = check_config(_mutant_argv(work / f"mutant-{n}.json", text, dataset))
        mutated.add(passed, seconds, f"{what}: {said}")
    return [hand, bounded, mutated, mutants_run(work, dataset, runs, isolated)]


def mutants_run(work: Path, dataset: Path, runs: int, isolated: bool) -> FaultRow:
    """`runs` mutants that pass --check, run.  Only the small configs run (R(2+1)D configs take minutes per job on
    a CPU), drawn apart from the checked ones: among mutants of all the configs, too few are of these two and
    valid for the row to have trials."""
    ran = FaultRow("config-mutated-run", "mutants of toy.json and default.json that pass --check, then run (-v 4): "
                   "exit 0 or 1 with a log")
    drawn = mutants([REPO / "config" / "toy.json", REPO / "config" / "default.json"], RUN_DRAWS_PER_TRIAL * runs, seed=1)
    for n, (what, text) in enumerate(drawn):
        if ran.trials == runs:
            break
        argv = _mutant_argv(work / f"runnable-{n}.json", text, dataset)
        passed, _, said = check_config(argv)
        if not passed or said:   # refused by --check (the config rows judge that): not a mutant that runs
            continue
        run, _ = run_job(work / f"runnable-{n}", [*argv, "-v", "4", "-mi", "0", "--cpu"], isolated=isolated)
        ok = run.returncode in (0, 1) and run.meta is not None and "Traceback" not in run.stderr
        exit_s = None if run.exit_time is None or run.meta is None else run.exit_time - run.meta["end_time"]
        ran.add(ok and run.orphans == 0 and not run.leftovers, exit_s, f"{what}: exit {run.returncode}",
                run.orphans, run.leftovers)
    if ran.trials < runs:
        ran.add(False, None, f"only {ran.trials} of {len(drawn)} mutants of toy.json and default.json passed "
                             f"--check; {runs} were to run")
    return ran


def _mutant_argv(path: Path, text: str, dataset: Path) -> list[str]:
    """The command line of a mutant written to `path`: a config naming a dataset reads the bench's own."""
    path.write_text(text)
    return ["-c", str(path), *(["--dataset", str(dataset)] if '"dataset"' in text else [])]


def installed_row(work: Path) -> FaultRow:
    """`pip install .` into a fresh environment, then rnb-benchmark from another directory (bench/installed.py)."""
    row = FaultRow("installed-command", "pip install . into a fresh environment; rnb-benchmark --check and "
                                       "-v 20 -mi 0 (the embedded default config) from another directory")
    began = time.time()
    problems = check_installed(work)
    row.add(not problems, time.time() - began, "; ".join(problems))
    return row


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
