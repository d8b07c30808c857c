"""L3: RnB's verdict by LoadGen's rules against LoadGen's own, on a corpus of runs of known kind per scenario.

Every run is driven by LoadGen (`--client loadgen`), so both verdicts are of
the same run: LoadGen's from its own clock (its detail log), RnB's from the
job's time cards (rnb.analysis.loadgen_rules).  A run agrees when both call
it VALID or both INVALID and every rule has the same yes or no.  Each case
is sized to sit far from its thresholds, so that a loaded machine's
hiccups do not move it; a run that did not come out of the kind it was
made for is said in the note, but agreement is what the row counts.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import Effort, Goal, Row, Side
from bench.harness_bench import run_job
from bench.loadgen_bench import pipeline
from rnb.analysis.jobs import load_jobs
from rnb.analysis.loadgen_rules import EARLY_STOPPING, MIN_DURATION, PERFORMANCE


@dataclass(frozen=True)
class Case:
    """One run of the corpus: what it is, how it is run, and the rules it was made to fail (empty: VALID)."""

    kind: str
    scenario: str
    flags: tuple[str, ...]
    videos: int
    step_ms: float
    fails: frozenset[str] = frozenset()


def _fails(*rules: str) -> frozenset[str]:
    return frozenset(rules)


# The Server runs meant to meet their latency bound have one of a second: a process of the job that waits a few
# hundred ms for a core moves LoadGen's latencies of the samples it holds (from LoadGen's schedule to the call that
# completes them) and not the time cards', and a 100 ms bound would then judge the host, not the rules.
LOOSE = ("--target-latency-ms", "1000")
CASES = (
    Case("too short", "server", ("-mi", "5", "--min-duration-ms", "3000", *LOOSE), 200, 2.0,
         _fails(MIN_DURATION, EARLY_STOPPING)),
    Case("overloaded", "server", ("-mi", "3.333"), 900, 10.0, _fails(PERFORMANCE, EARLY_STOPPING)),
    Case("latency bound broken", "server", ("-mi", "6.25", "--target-latency-ms", "15"), 1200, 10.0,
         _fails(PERFORMANCE, EARLY_STOPPING)),
    Case("early stopping short", "server", ("-mi", "5", *LOOSE), 300, 2.0, _fails(EARLY_STOPPING)),
    Case("enough", "server", ("-mi", "5", *LOOSE), 600, 2.0),
    Case("too short", "offline", ("--min-duration-ms", "3000"), 200, 10.0, _fails(MIN_DURATION)),
    Case("enough", "offline", ("--min-duration-ms", "500"), 1000, 2.0),
    Case("early stopping short", "single-stream", ("--min-duration-ms", "0"), 40, 2.0, _fails(EARLY_STOPPING)),
    Case("too short", "single-stream", ("--min-duration-ms", "2000"), 100, 2.0, _fails(MIN_DURATION)),
    Case("enough", "single-stream", ("--min-duration-ms", "200"), 200, 2.0),
    Case("early stopping short", "multi-stream", ("--min-duration-ms", "0"), 80, 2.0, _fails(EARLY_STOPPING)),
    Case("enough", "multi-stream", ("--min-duration-ms", "1000"), 662 * 8, 1.0),
)


def verdicts(case: Case, workdir: Path) -> tuple[str, str]:
    """(RnB's, LoadGen's) verdicts of one run of `case`, each as `VALID: rule: yes; ...` without the reasons."""
    job = run_job(pipeline(case.step_ms), case.videos, workdir,
                  load=("--scenario", case.scenario, "--client", "loadgen", "--min-duration-ms", "1000", *case.flags))
    row = load_jobs(job).jobs.to_pylist()[0]
    return (f"{row['validity']}: {_yes_no(row['loadgen_rules'])}",
            f"{row['loadgen_log_validity']}: {_yes_no(row['loadgen_log_rules'])}")


def _yes_no(rules: str) -> str:
    """Each rule with its yes or no, the reasons left out (each judge words them its own way)."""
    return "; ".join(part.split(",")[0] for part in rules.split("; "))


def l3_rows(effort: Effort) -> list[Row]:
    agreed, notes = 0, []
    with tempfile.TemporaryDirectory(prefix="rnb-L3-") as tmp:
        for case in CASES:
            ours, theirs = verdicts(case, Path(tmp))
            agreed += ours == theirs
            made = {rule.split(":")[0] for rule in theirs.split(": ", 1)[1].split("; ") if rule.endswith("no")}
            notes.append(f"{case.scenario} {case.kind}: LoadGen {theirs}" + ("" if ours == theirs else f"; RnB {ours}")
                         + ("" if made == set(case.fails) else " (not the kind it was made for)"))
    count = len(CASES)
    return [Row("L3", f"verdicts by LoadGen's rules: RnB's = LoadGen's own, runs of {count} known kinds (too short, "
                      "overloaded, latency bound broken, early stopping short, enough) over the four scenarios",
                Goal("==", 1.0), Side("RnB = LoadGen", "runs", agreed), Side("corpus", "runs", count), agreed / count,
                reps=count, note="each run driven by LoadGen (--client loadgen); " + " | ".join(notes))]
