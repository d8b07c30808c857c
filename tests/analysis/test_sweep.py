"""The sweep: bisection logic exactly (pure and through a stub benchmark), and real toy-config sweeps."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rnb.analysis import rnb_sweep
from rnb.analysis.job_columns import stat_column
from rnb.analysis.jobs import ValidityRules, load_jobs
from rnb.analysis.sweep import RunOutcome, Trial, bisect_rate, format_interval, measure_trial, run_benchmark

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "scripts" / "sweep.py"

# A stand-in for benchmark.py that writes a job log whose every item takes
# exactly `rate` ms end to end (rate = 1000 / -mi), so the bisection's path is
# known in advance. It reads only the flags the sweep passes.
STUB_BENCHMARK = textwrap.dedent('''
    import argparse, json, pathlib, sys
    import pyarrow as pa, pyarrow.parquet as pq
    parser = argparse.ArgumentParser()
    parser.add_argument("-c"); parser.add_argument("-mi", type=float); parser.add_argument("--log-dir")
    parser.add_argument("-v", type=int, default=20)
    args = parser.parse_args()
    rate = 1000.0 / args.mi
    job = pathlib.Path(args.log_dir) / f"stub-mi{args.mi:g}"
    job.mkdir()
    n = args.v
    enqueue = [100.0 + i for i in range(n)]
    start = [e + rate / 4000.0 for e in enqueue]
    finish = [e + rate / 1000.0 for e in enqueue]
    columns = {"item_id": list(range(n)), "payload": [repr(i) for i in range(n)], "is_warmup": [False] * n,
               "enqueue": enqueue, "runner0_start": start, "inference0_start": start,
               "inference0_finish": finish, "runner0_finish": finish, "device0": ["cpu"] * n}
    pq.write_table(pa.table(columns), job / "timings.parquet")
    (job / "config.json").write_text("{}")
    meta = {"job_id": job.name, "config_path": args.c, "num_steps": 1, "termination_reason": "target reached",
            "args": {"mean_interval_ms": args.mi, "videos": n}, "processes": []}
    (job / "meta.json").write_text(json.dumps(meta))
''')


def linear_latency(rate: float) -> Trial:
    return Trial(rate, latency_ms=rate)


def test_bisection_follows_the_halving_path_and_brackets_the_bound() -> None:
    result = bisect_rate(linear_latency, 10.0, 200.0, bound_ms=50.0, max_steps=10, rel_tol=0.05)
    rates = [trial.rate_per_s for trial in result.trials]
    assert rates == [10.0, 200.0, 105.0, 57.5, 33.75, 45.625, 51.5625, 48.59375, 50.078125]
    assert result.best.rate_per_s == 48.59375
    assert result.above.rate_per_s == 50.078125


def test_bisection_stops_after_max_steps() -> None:
    result = bisect_rate(linear_latency, 10.0, 200.0, bound_ms=50.0, max_steps=2)
    assert [t.rate_per_s for t in result.trials] == [10.0, 200.0, 105.0, 57.5]
    assert (result.best.rate_per_s, result.above.rate_per_s) == (10.0, 57.5)


def test_bisection_reports_when_no_rate_or_every_rate_meets_the_bound() -> None:
    none_pass = bisect_rate(linear_latency, 10.0, 200.0, bound_ms=5.0, max_steps=5)
    assert none_pass.best is None and none_pass.above.rate_per_s == 10.0 and len(none_pass.trials) == 1
    all_pass = bisect_rate(linear_latency, 10.0, 200.0, bound_ms=500.0, max_steps=5)
    assert all_pass.above is None and all_pass.best.rate_per_s == 200.0 and len(all_pass.trials) == 2


def test_bisection_counts_a_missed_target_as_over_the_bound() -> None:
    result = bisect_rate(lambda rate: Trial(rate, math.inf if rate > 20 else 1.0), 10.0, 40.0, 100.0, max_steps=1)
    assert (result.best.rate_per_s, result.above.rate_per_s) == (10.0, 25.0)


def test_bisection_rejects_inverted_rates() -> None:
    with pytest.raises(ValueError, match=r"^the rates must satisfy 0 < low < high; got low 5, high 5\.$"):
        bisect_rate(linear_latency, 5.0, 5.0, 10.0, 3)


def sweep_over_stub(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """sweep.py over the stub benchmark, its jobs under tmp_path/logs, any item count VALID."""
    stub = tmp_path / "stub_benchmark.py"
    stub.write_text(STUB_BENCHMARK)
    return subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/toy.json", "--benchmark", str(stub), "--log-dir",
         str(tmp_path / "logs"), "--min-items", "20", "--min-duration", "0", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_sweep_script_bisects_over_stub_benchmark_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = sweep_over_stub(tmp_path, "--latency-bound-ms", "50", "--low-mi", "100", "--high-mi", "5", "--max-steps", "3",
                           "-v", "400")
    assert done.returncode == 0, done.stderr
    # rates 10 (pass), 200 (fail), 105 (fail), 57.5 (fail), 33.75 (pass): three steps after the ends
    expected = sorted(f"stub-mi{float(format_interval(1000 / r)):g}" for r in (10, 200, 105, 57.5, 33.75))
    assert sorted(path.name for path in logs.iterdir()) == expected
    assert "peak rate meeting p99 < 50 ms: 33.75 req/s (-mi 29.6296): p99 33.75 ms" in done.stdout
    assert "bracketed by the lowest failing load: 57.5 req/s (-mi 17.3913): p99 57.50 ms" in done.stdout
    jobs = load_jobs(logs, rules=ValidityRules(min_duration_s=0.0, min_items=20)).jobs
    assert jobs.column("validity").to_pylist() == ["VALID"] * 5
    assert sorted(jobs.column(stat_column("e2e", "p99")).to_pylist()) == pytest.approx([10, 33.75, 57.5, 105, 200], rel=1e-5)
    assert done.stdout.count(" VALID ") == 5


def test_the_search_runs_a_job_too_short_to_be_valid_again_longer(tmp_path: Path) -> None:
    """200 items cannot bound a p99 (368 are needed), so each rate runs again with -v 400 and only that counts."""
    stub = tmp_path / "stub_benchmark.py"
    stub.write_text(STUB_BENCHMARK.replace('job = pathlib.Path(args.log_dir) / f"stub-mi{args.mi:g}"',
                                           'job = pathlib.Path(args.log_dir) / f"stub-mi{args.mi:g}-v{args.v}"'))
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/toy.json", "--benchmark", str(stub), "--log-dir", str(logs),
         "--latency-bound-ms", "50", "--low-mi", "100", "--high-mi", "5", "--max-steps", "0",
         "--min-items", "20", "--min-duration", "0", "-v", "200"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in logs.iterdir()) == [
        "stub-mi100-v200", "stub-mi100-v400", "stub-mi5-v200", "stub-mi5-v400"]
    assert done.stderr.count("is INVALID (200 items cannot bound the p99 from above at 95% confidence") == 2
    assert "running -mi 100 again with -v 400" in done.stderr and "running -mi 5 again with -v 400" in done.stderr
    assert "trial 1: 10 req/s (-mi 100): p99 10.00 ms" in done.stdout


def test_the_search_gives_up_on_a_rate_that_stays_invalid(tmp_path: Path) -> None:
    stub = tmp_path / "stub_benchmark.py"
    stub.write_text(STUB_BENCHMARK.replace("n = args.v", "n = 20").replace(  # ignores -v: never long enough
        'f"stub-mi{args.mi:g}"', 'f"stub-mi{args.mi:g}-run{len(list(pathlib.Path(args.log_dir).iterdir()))}"'))
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/toy.json", "--benchmark", str(stub), "--log-dir", str(logs),
         "--latency-bound-ms", "50", "--low-mi", "100", "--high-mi", "5", "--max-reruns", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"sweep: {logs / 'stub-mi100-run1'}: still INVALID after 1 longer runs at -mi 100 (20 items after warm-up, fewer "
        "than --min-items 100; 20 items cannot bound the p99 from above at 95% confidence, which takes at least 368 "
        "(0.99^n <= 0.025)); give a larger -v.")


@pytest.mark.parametrize(("argv", "sentence"), [
    ([], "-mi/--mean_interval_ms: expected either the loads to run (-mi 0,1,2,5) or a search for the peak rate "
         "(--latency-bound-ms MS), found neither"),
    (["-mi", "3", "--latency-bound-ms", "50"], "-mi/--mean_interval_ms: expected either the loads to run (-mi 0,1,2,5) "
                                               "or a search for the peak rate (--latency-bound-ms MS), found both"),
    (["--mean-interval-ms", "1,x"], "-mi/--mean_interval_ms: expected comma-separated numbers >= 0, found '1,x'"),
    (["-mi", "1", "-v", "0"], "-v/--videos: expected an integer >= 1, found 0"),
    (["--latency-bound-ms", "50", "--low-mi", "1", "--high-mi", "5"],
     "--high-mi: expected less than --low-mi 1 (a smaller interval is a higher rate), found 5"),
    (["--latency-bound-ms", "50", "--percentile", "101"], "--percentile: expected a number > 0 and <= 100, found 101"),
    (["-mi", "1", "--max-stream", "4"], "--max-stream: expected a flag of sweep.py or of benchmark.py, which sweep.py "
                                        "passes on, found an unknown one (did you mean --max-streams?)"),
    (["-mi", "1", "--vidoes=3"], "--vidoes: expected a flag of sweep.py or of benchmark.py, which sweep.py passes on, "
                                 "found an unknown one (did you mean --videos?)"),
])
def test_sweep_refuses_bad_loads_in_one_sentence(argv: list[str], sentence: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        rnb_sweep.main(["--config", "config/toy.json", *argv])
    assert (exited.value.code, capsys.readouterr()) == (2, ("", f"command line: {sentence}\n"))


def test_sweep_passes_on_exactly_the_flags_benchmark_py_takes() -> None:
    """sweep.py refuses a flag that neither it nor benchmark.py knows: its list of benchmark.py's flags is the
    benchmark's own parser's."""
    from rnb import cli

    taken = {spelling for action in cli.benchmark_parser()._actions for spelling in action.option_strings}
    assert taken == rnb_sweep.BENCHMARK_FLAGS
    args, extra = rnb_sweep.parse_args(["-c", "config/toy.json", "-mi", "1", "--seed", "-1", "--cpu", "--warmup=3"])
    assert extra == ["--seed", "-1", "--cpu", "--warmup=3"]


def test_sweep_script_stops_on_a_run_that_leaves_no_job(tmp_path: Path) -> None:
    stub = tmp_path / "bad_benchmark.py"
    stub.write_text("import sys\nsys.exit(2)\n")
    done = subprocess.run([sys.executable, str(SWEEP), "-c", "config/toy.json", "--mi", "1,2",
                           "--benchmark", str(stub), "--log-dir", str(tmp_path / "logs")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"sweep: {stub} -c config/toy.json -mi 1 exited with 2.\n"


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """One sweep of the toy config at -mi 20 (items mostly alone) and -mi 0.01 (items queued at once, far more than
    the pipeline serves: the job is overloaded).

    400 items each: fewer could not bound the p99, and the jobs would be INVALID.
    """
    logs = tmp_path_factory.mktemp("sweep") / "logs"
    done = subprocess.run(
        [sys.executable, str(SWEEP), "-c", "config/toy.json", "--mi", "20,0.01", "-v", "400", "--warmup", "0",
         "--log-dir", str(logs), "--min-items", "20", "--min-duration", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return logs, done


@pytest.mark.slow
def test_a_real_sweep_over_two_loads_yields_two_jobs_and_one_summary(
        real_sweep: tuple[Path, subprocess.CompletedProcess]) -> None:
    logs, done = real_sweep
    jobs = sorted(logs.iterdir())
    assert sorted(json.loads((job / "meta.json").read_text())["args"]["mean_interval_ms"] for job in jobs) == [0.01, 20]
    header, rule, *rows = done.stdout.splitlines()[:4]
    assert header.startswith("job ") and set(rule) == {"-", " "}
    assert sorted(row.split()[0] for row in rows) == [job.name for job in jobs]
    assert header.split()[:6] == ["job", "config", "batch", "load", "reason", "validity"]
    assert sorted(row.split()[1:8] for row in rows) == [
        ["toy", "1/1", "poisson", "1e+05/s", "target", "reached", "INVALID"],
        ["toy", "1/1", "poisson", "50/s", "target", "reached", "VALID"]]
    (why,) = [line for line in done.stdout.splitlines() if "-mi0.01-" in line and "INVALID:" in line]
    assert why.split("INVALID: ")[1].startswith("overloaded: offered ")


@pytest.mark.slow
def test_a_real_bisection_brackets_the_bound_between_two_measured_loads(
        real_sweep: tuple[Path, subprocess.CompletedProcess], tmp_path: Path) -> None:
    """The bound lies between the sweep's two measured p90s (machine speed varies); one midpoint is run for real."""
    logs, _ = real_sweep
    measured: dict[float, Trial] = {}
    for job in logs.iterdir():
        rate = 1000.0 / json.loads((job / "meta.json").read_text())["args"]["mean_interval_ms"]
        measured[rate] = measure_trial(RunOutcome(job, 0), rate, 90.0)

    def measure(rate: float) -> Trial:
        if rate not in measured:
            outcome = run_benchmark("config/toy.json", 1000.0 / rate, tmp_path, ["-v", "20", "--warmup", "0"])
            measured[rate] = measure_trial(outcome, rate, 90.0)
        return measured[rate]

    low, high = measured[50.0], measured[100000.0]
    bound = math.sqrt(low.latency_ms * high.latency_ms)
    assert low.latency_ms < bound < high.latency_ms
    result = bisect_rate(measure, 50.0, 100000.0, bound, max_steps=1)
    assert [trial.rate_per_s for trial in result.trials] == [50.0, 100000.0, 50025.0]
    assert len(list(tmp_path.iterdir())) == 1
    assert result.best.rate_per_s < result.above.rate_per_s
    assert result.best.latency_ms < bound <= result.above.latency_ms
    assert {result.best, result.above} <= set(result.trials)


def test_a_sweep_plot_names_the_jobs_whose_time_rows_it_left_out(tmp_path: Path) -> None:
    done = sweep_over_stub(tmp_path, "--mi", "10,20,30,40,50,60,70", "-v", "40", "--plot", str(tmp_path / "sweep.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert done.stderr == ("sweep: --plot draws the time rows of the first 6 jobs; left out: stub-mi70 "
                           "(analyze.py with them alone draws theirs).\n")
