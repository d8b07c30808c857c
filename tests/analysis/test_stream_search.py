"""sweep.py --streams-bound: the search over stream counts exactly (pure, and through a stub benchmark)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rnb.analysis import rnb_sweep
from rnb.analysis.bound import JobBound
from rnb.analysis.stream_search import StreamSearch, StreamTrial, bound_sentence, search_streams

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "scripts" / "sweep.py"

# A stand-in for benchmark.py whose job at N streams misses no frame up to 5 streams and half its frames above:
# a pipeline that sustains exactly 5 streams, so the search's path is known in advance.  Its one step takes
# BUSY of each 10 ms between frames; LATE(streams, run) says whether a job (the run-th at its count) is late.
STUB_BENCHMARK = textwrap.dedent('''
    import argparse, json, pathlib
    import pyarrow as pa, pyarrow.parquet as pq
    parser = argparse.ArgumentParser()
    parser.add_argument("-c"); parser.add_argument("--streams", type=int); parser.add_argument("--fps", type=float)
    parser.add_argument("--log-dir"); parser.add_argument("-v", type=int, default=400)
    args = parser.parse_args()
    BUSY = 1.0
    LATE = lambda streams, run: streams > 5
    run = len(list(pathlib.Path(args.log_dir).glob(f"stub-s{args.streams}*"))) if pathlib.Path(args.log_dir).is_dir() else 0
    job = pathlib.Path(args.log_dir) / (f"stub-s{args.streams}" + (f"-run{run + 1}" if run else ""))
    job.mkdir(parents=True)
    n = args.v
    enqueue = [100.0 + i / 100 for i in range(n)]
    finish = [e + 0.01 * BUSY for e in enqueue]
    columns = {"item_id": list(range(n)), "payload": [repr(i) for i in range(n)], "is_warmup": [False] * n,
               "enqueue": enqueue, "runner0_start": enqueue, "inference0_start": enqueue,
               "inference0_finish": finish, "runner0_finish": finish, "device0": ["cpu"] * n}
    pq.write_table(pa.table(columns), job / "timings.parquet")
    (job / "config.json").write_text(json.dumps({"pipeline": [{"model": "models.toy.AsyncSleep"}]}))
    late = n // 2 if LATE(args.streams, run) else 0
    streams = {"count": args.streams, "fps": args.fps, "policy": "queue", "deadline_ms": 1000 / args.fps,
               "offered": n, "processed": n, "late": late, "dropped": 0, "per_stream": []}
    runner = {"name": "step0-g0-r0", "role": "runner", "step": 0, "group": 0, "instance": 0, "device": "cpu"}
    meta = {"job_id": job.name, "config_path": args.c, "num_steps": 1, "termination_reason": "target reached",
            "start_time": 100.0, "end_time": 100.0 + n / 100, "args": {"streams": args.streams, "fps": args.fps,
            "videos": n}, "processes": [runner], "streams": streams}
    (job / "meta.json").write_text(json.dumps(meta))
''')


def capacity(streams: int) -> StreamTrial:
    """A pipeline that sustains 5 streams: none missed up to 5, half above."""
    return StreamTrial(streams, 0.0 if streams <= 5 else 0.5, 10.0, Path(f"s{streams}"))


def within(fraction: float):
    return lambda trial: trial.missed_fraction <= fraction


def test_the_search_doubles_then_bisects_to_the_most_streams_that_pass() -> None:
    result = search_streams(capacity, within(0.01), 256)
    assert (result.best, result.above) == (5, 6)
    assert [trial.streams for trial in result.trials] == [1, 2, 4, 8, 6, 5]


def test_the_search_says_when_the_largest_count_passed_or_even_one_failed() -> None:
    every = search_streams(capacity, within(1.0), 12)
    assert (every.best, every.above, [t.streams for t in every.trials]) == (12, None, [1, 2, 4, 8, 12])
    none = search_streams(capacity, within(-1.0), 12)
    assert (none.best, none.above, [t.streams for t in none.trials]) == (0, 1, [1])


def stream_sweep(tmp_path: Path, busy: float = 1.0, late: str = "streams > 5") -> subprocess.CompletedProcess[str]:
    """sweep.py --streams-bound 0.05 over the stub benchmark, its step `busy`, its jobs late where `late` says."""
    stub = tmp_path / "stub_benchmark.py"
    stub.write_text(STUB_BENCHMARK.replace("BUSY = 1.0", f"BUSY = {busy}").replace("streams > 5", late))
    return subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/streams-example.json", "--benchmark", str(stub), "--log-dir",
         str(tmp_path / "logs"), "--fps", "30", "--streams-bound", "0.05", "--min-duration", "0", "--json",
         str(tmp_path / "streams.json")],
        cwd=REPO, capture_output=True, text=True, timeout=120)


def test_sweep_finds_the_stream_count_of_a_stub_benchmark_and_writes_json(tmp_path: Path) -> None:
    done = stream_sweep(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "5"
    assert "streams at 30 fps keeping at most 5.0% of frames missed: 5 (and not 6)" in done.stdout
    assert "trial 4: 8 streams: 50.0% missed, p99 10.00 ms; step 0 (AsyncSleep) busy 100%: the pipeline missed the " \
           "frames" in done.stdout.splitlines()
    bound = ("what bounds it: at 6 streams step 0 (AsyncSleep) was busy 100%, saturated: the pipeline, not the host, "
             "missed the frames.")
    assert bound in done.stdout.splitlines()
    written = json.loads((tmp_path / "streams.json").read_text())
    assert (written["streams"], written["fps"], written["bound"]) == (5, 30.0, bound)
    assert [Path(job).name for job in written["jobs"]] == [f"stub-s{n}" for n in (1, 2, 4, 8, 6, 5)]


def test_a_count_whose_saturated_step_waited_for_cores_is_bound_by_the_cores() -> None:
    starved = JobBound(0, "CpuSpin", 0.92, "target reached", False, 420, 322, 0, 322, 100.0, 9.0, 0.68)
    fine = StreamTrial(2, 0.0, 50.0, Path("s2"), JobBound(0, "CpuSpin", 0.5, "target reached", False, 420))
    failed = StreamTrial(3, 322 / 420, 900.0, Path("s3"), starved)
    result = StreamSearch(2, 3, (fine, failed))
    assert bound_sentence(result) == (
        "what bounds it: at 3 streams step 0 (CpuSpin) was busy 92%, saturated, though its runners waited for a core "
        "68% of the time: the host's cores (the pipeline's own CPU, or other work on the host), not the step alone, "
        "missed the frames.")


def test_a_count_a_host_stall_failed_runs_again_and_the_majority_decides(tmp_path: Path) -> None:
    """2 streams' first job is late with its step 20% busy (a host stall); the next two are not: 2 passes."""
    done = stream_sweep(tmp_path, busy=0.2, late="streams > 5 or (streams == 2 and run == 0)")
    assert done.returncode == 0, done.stderr
    assert "streams at 30 fps keeping at most 5.0% of frames missed: 5 (and not 6)" in done.stdout
    assert ("trial 2: 2 streams: 0.0% missed, p99 2.00 ms; step 0 (AsyncSleep) busy 20% (the majority of 3 jobs, "
            "run again after a host stall)") in done.stdout.splitlines()
    assert ("2 streams: 0 of 1 jobs passed, the others missed frames in a host stall (stub-s2); running the count again, "
            "2 of up to 3") in done.stderr
    assert "2 streams: 1 of 2 jobs passed" in done.stderr
    written = json.loads((tmp_path / "streams.json").read_text())
    assert [Path(job).name for job in written["jobs"]][:4] == ["stub-s1", "stub-s2", "stub-s2-run2", "stub-s2-run3"]


def test_sweep_exits_1_when_a_host_stall_fails_even_one_stream_in_the_majority_of_its_jobs(tmp_path: Path) -> None:
    done = stream_sweep(tmp_path, busy=0.2, late="True")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-3:] == [
        "no stream count at 30 fps keeps at most 5.0% of frames missed: even 1 does not.",
        "what bounds it: at 1 stream step 0 (AsyncSleep) was busy 20%, not saturated, when its frames were missed in "
        "the majority of 2 jobs: the host, not the pipeline, missed them; run the search on a quieter host.",
        "0"]
    assert sorted(path.name for path in (tmp_path / "logs").iterdir()) == ["stub-s1", "stub-s1-run2"]


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--streams-bound", "0.1"], "--streams-bound: expected --fps F beside it (the frame rate of each stream), found none"),
    (["--streams-bound", "1.5", "--fps", "30"], "--streams-bound: expected a fraction from 0 to 1, found 1.5"),
    (["--streams-bound", "0.1", "--fps", "30", "-mi", "3"],
     "--streams-bound: expected no -mi beside it (the stream search sets the load), found -mi"),
    (["--streams-bound", "0.1", "--fps", "-30"], "--fps: expected a number > 0, found -30"),
])
def test_the_stream_search_refuses_bad_flags_in_one_sentence(argv: list[str], sentence: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        rnb_sweep.main(["--config", "config/streams-example.json", *argv])
    assert (exited.value.code, capsys.readouterr()) == (2, ("", f"command line: {sentence}\n"))
