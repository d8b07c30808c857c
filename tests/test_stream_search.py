"""sweep.py --streams-bound: the search over stream counts exactly (pure, and through a stub benchmark)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rnb.analysis import sweep_cli
from rnb.analysis.stream_search import StreamTrial, search_streams

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "scripts" / "sweep.py"

# A stand-in for benchmark.py whose job at N streams misses no frame up to 5 streams and half its frames above:
# a pipeline that sustains exactly 5 streams, so the search's path is known in advance.
STUB_BENCHMARK = textwrap.dedent('''
    import argparse, json, pathlib
    import pyarrow as pa, pyarrow.parquet as pq
    parser = argparse.ArgumentParser()
    parser.add_argument("-c"); parser.add_argument("--streams", type=int); parser.add_argument("--fps", type=float)
    parser.add_argument("--log-dir"); parser.add_argument("-v", type=int, default=400)
    args = parser.parse_args()
    job = pathlib.Path(args.log_dir) / f"stub-s{args.streams}"
    job.mkdir()
    n = args.v
    enqueue = [100.0 + i / 100 for i in range(n)]
    finish = [e + 0.01 for e in enqueue]
    columns = {"item_id": list(range(n)), "payload": [repr(i) for i in range(n)], "is_warmup": [False] * n,
               "enqueue": enqueue, "runner0_start": enqueue, "inference0_start": enqueue,
               "inference0_finish": finish, "runner0_finish": finish, "device0": ["cpu"] * n}
    pq.write_table(pa.table(columns), job / "timings.parquet")
    (job / "config.json").write_text("{}")
    late = 0 if args.streams <= 5 else n // 2
    streams = {"count": args.streams, "fps": args.fps, "policy": "queue", "deadline_ms": 1000 / args.fps,
               "offered": n, "processed": n, "late": late, "dropped": 0, "per_stream": []}
    meta = {"job_id": job.name, "config_path": args.c, "num_steps": 1, "termination_reason": "target reached",
            "args": {"streams": args.streams, "fps": args.fps, "videos": n}, "processes": [], "streams": streams}
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


def test_sweep_finds_the_stream_count_of_a_stub_benchmark_and_writes_json(tmp_path: Path) -> None:
    stub = tmp_path / "stub_benchmark.py"
    stub.write_text(STUB_BENCHMARK)
    logs, out = tmp_path / "logs", tmp_path / "streams.json"
    done = subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/streams-example.json", "--benchmark", str(stub), "--log-dir",
         str(logs), "--fps", "30", "--streams-bound", "0.05", "--min-duration", "0", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "5"
    assert "streams at 30 fps keeping at most 5.0% of frames missed: 5 (and not 6)" in done.stdout
    written = json.loads(out.read_text())
    assert (written["streams"], written["fps"]) == (5, 30.0)
    assert [Path(job).name for job in written["jobs"]] == [f"stub-s{n}" for n in (1, 2, 4, 8, 6, 5)]


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--streams-bound", "0.1"], "--streams-bound: expected --fps F beside it (the frame rate of each stream), found none"),
    (["--streams-bound", "1.5", "--fps", "30"], "--streams-bound: expected a fraction from 0 to 1, found 1.5"),
    (["--streams-bound", "0.1", "--fps", "30", "-mi", "3"],
     "--streams-bound: expected no -mi beside it (the stream search sets the load), found -mi"),
    (["--streams-bound", "0.1", "--fps", "-30"], "--fps: expected a number > 0, found -30"),
])
def test_the_stream_search_refuses_bad_flags_in_one_sentence(argv: list[str], sentence: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        sweep_cli.main(["--config", "config/streams-example.json", *argv])
    assert (exited.value.code, capsys.readouterr()) == (2, ("", f"command line: {sentence}\n"))
