"""rnb-tune from outside: refused requests, a step that fails while profiling, and one real run on the example.

The real run tunes config/tune-example.json at batch 8 on 4 CPU slots: one
replica per step and one more for any of them, 4 candidates, of which two
loaders (8 ms per item each, against 18 ms per batch of 8 for the network)
serve the most.  Short profiles, one finalist: first interrupted with
Ctrl-C once a profile is kept, then run to the end (reusing that profile),
then run a third time (reusing everything: no job runs).  Its report is
opened in headless chromium.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq
import pytest
import torch

from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import ValidityRules, summarize_job
from rnb.pipeline.config import parse_config
from rnb.tune.cli import main
from rnb.tune.profile import Bench
from rnb.tune.profile_cache import ProfileCache
from rnb.tune.simulation import Simulation
from rnb.tune.space import Budget
from rnb.tune.tuning_config import read_space
from tests.support.tune_support import REPO, example_document, hand_profiles, render, replay, write_example

TUNE = REPO / "scripts" / "tune.py"
ANALYZE = REPO / "scripts" / "analyze.py"
BOUND_MS = 250.0   # generous: the example meets it at a fraction of its peak on a loaded machine too
SHORT = ["--profile-calls", "40", "--top", "1", "--verify-steps", "0", "--verify-seconds", "1.5", "--sim-items", "800",
         "--min-duration", "0.5"]


def tune(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TUNE), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def job_dirs(out: Path) -> list[Path]:
    return sorted(path for path in (out / "logs").glob("*/*") if path.is_dir())


# ---------------------------------------------------------------- refused before anything runs

@pytest.mark.parametrize(("flags", "message"), [
    (["--cpu-slots", "2"], "rnb-tune: {config}: a budget of 2 CPU slots cannot hold the 3 work groups (step 0, step 2, "
                           "step 3), each of which needs at least one replica."),
    ([], "command line: --gpus/--cpu-slots: expected the budget, --gpus LIST and/or --cpu-slots N (N >= 1), found neither"),
    (["--cpu-slots", "3", "--objective", "devices"],
     "command line: --target-rate: expected the items/s that --objective devices must serve, found none"),
    (["--cpu-slots", "3", "--percentile", "100"], "command line: --percentile: expected a number > 0 and < 100, found 100"),
    (["--cpu-slots", "3", "--top", "0"], "command line: --top: expected an integer >= 1, found 0"),
    (["--cpu-slots", "3", "--verify-repeats", "0"], "command line: --verify-repeats: expected an integer >= 1, found 0"),
    (["--cpu-slots", "x"], "command line: --cpu-slots: expected an integer >= 0, found 'x'"),
    (["--cpu-slots", "3", "-b", "0,2"], "command line: -b/--batch_size: expected comma-separated integers >= 1, found '0,2'"),
    # rnb-tune passes no flag on: one it does not know is its own refusal, with its own flag as the hint.
    (["--cpu-slots", "3", "--verify-repeat", "3"],
     "command line: --verify-repeat: expected a flag of rnb-tune, found an unknown one (did you mean --verify-repeats?)"),
    # Nothing listens on port 1: asked where its nodes are, the cluster is refused at once, not retried for minutes.
    (["--cpu-slots", "3", "--engine", "ray", "--ray-address", "127.0.0.1:1"],
     "rnb-tune: could not reach the Ray cluster at 127.0.0.1:1: its GCS did not answer within 5 s"),
])
def test_an_impossible_request_is_one_sentence_and_exit_2_before_any_file(
        tmp_path: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_example(tmp_path)
    out = tmp_path / "out"
    assert refused(["-c", str(config), "--latency-bound-ms", "100", "--out", str(out), *flags], capsys) == (
        f"{message.format(config=config)}\n")
    assert not out.exists()


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What rnb-tune (in this process: nothing it refuses needs a child) says on stderr, asserting exit 2."""
    try:
        code = main(argv)
    except SystemExit as exit:   # argparse's own refusals
        code = int(exit.code or 0)
    assert code == 2
    return capsys.readouterr().err


def test_a_gpu_budget_on_a_machine_without_one_is_refused_with_the_cpu_alternative(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    said = refused(["-c", "config/r2p1d-whole.json", "--gpus", "0", "--latency-bound-ms", "100",
                    "--out", str(tmp_path / "o")], capsys)
    assert said.startswith("rnb-tune: config/r2p1d-whole.json: pipeline[0].queue_groups[0].gpus[0]: expected a "
                           "usable NVIDIA GPU 0")
    assert said.endswith("; to tune on the CPU give --cpu-slots N in place of --gpus.\n") and said.count("\n") == 1


def test_a_config_the_harness_would_refuse_is_refused_the_same_way(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = example_document()
    document["pipeline"][2]["ms_per_itme"] = 1.5
    config = tmp_path / "typo.json"
    config.write_text(json.dumps(document))
    said = refused(["-c", str(config), "--cpu-slots", "3", "--latency-bound-ms", "100", "--out", str(tmp_path / "o")],
                   capsys)
    assert said.startswith(f"rnb-tune: {config}: pipeline[2].ms_per_itme: expected a keyword that ")
    assert 'did you mean "ms_per_item"?' in said and said.count("\n") == 1


@pytest.mark.slow
def test_a_step_that_fails_while_profiling_ends_with_exit_1_and_no_best(tmp_path: Path) -> None:
    config = tmp_path / "failing.json"
    config.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "models.toy.TinyConvNet", "queue_groups": [{"gpus": [-1], "in_queue": 0}], "fail_at_item": 5}]}))
    out = tmp_path / "out"
    done = tune("-c", str(config), "--cpu-slots", "2", "--latency-bound-ms", "100", "--out", str(out),
                "--profile-calls", "20")
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rnb-tune: profiling step 1 (models.toy.TinyConvNet) failed: its job ")
    assert "ended with 'process failed'" in last and "failed on item 5 on purpose (fail_at_item)" in last
    assert "Traceback" not in done.stderr
    assert not (out / "best.json").exists()
    assert len(list((out / "profiles").glob("*.json"))) == 1   # step 0's profile is kept


# ---------------------------------------------------------------- one real run

class Runs(NamedTuple):
    out: Path
    config: Path
    interrupted: subprocess.CompletedProcess[str]
    profiles_kept: int
    first: subprocess.CompletedProcess[str]
    jobs_after_first: list[Path]
    second: subprocess.CompletedProcess[str]
    jobs_after_second: list[Path]
    best_after_first: str


E2E_TIMEOUT_S = 900   # three tuner runs of a dozen jobs: on the shared 2-core machine a job's start-up alone
                      # took 15 to 80 s at loads of 10 to 50


def as_from_a_terminal() -> None:
    """In the tuner's process before exec: Ctrl-C's disposition and mask as a shell gives them.

    A child inherits an ignored or blocked SIGINT from whatever ran earlier
    in this test process; once, in a full run, the tuner here ignored the
    Ctrl-C and ran to the end; started alone it has always stopped.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


# The tests of these runs are marked serial: the tuner verifies a p99 bound on this host's cores, which another
# pytest worker's jobs beside it made it miss (p99 320 ms at 131 req/s against 250 in three runs of three).
@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    work = tmp_path_factory.mktemp("tune")
    config = write_example(work, batches=[8])
    out = work / "out"
    args = ["-c", str(config), "--cpu-slots", "4", "--latency-bound-ms", str(BOUND_MS), "--out", str(out), *SHORT]
    # Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once the first profile is kept.
    child = subprocess.Popen([sys.executable, str(TUNE), *args], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 240
    while not list((out / "profiles").glob("*.json")) and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    interrupted = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    kept = len(list((out / "profiles").glob("*.json")))
    first = tune(*args, timeout=600)
    jobs = job_dirs(out)
    best = (out / "best.json").read_text() if (out / "best.json").is_file() else ""
    second = tune(*args, timeout=300)
    return Runs(out, config, interrupted, kept, first, jobs, second, job_dirs(out), best)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_ctrl_c_stops_the_tuner_with_130_and_keeps_what_it_measured(runs: Runs) -> None:
    assert runs.interrupted.returncode == 130, runs.interrupted.stderr
    assert runs.interrupted.stderr.strip().splitlines()[-1] == (
        f"rnb-tune: interrupted; the profiles and runs measured so far are kept in {runs.out}, and a second run "
        "with the same arguments reuses them.")
    assert "Traceback" not in runs.interrupted.stderr
    assert runs.profiles_kept >= 1
    # What was kept is not measured again: 3 profiling jobs (step 0, steps 2 and 3 at batch 8), and one more
    # only if the Ctrl-C cut a job short; 4 profiles (the Batcher's besides).
    profiling = [job for job in runs.jobs_after_first if job.parent.name == "profiles"]
    assert len(profiling) in (3, 4)
    assert len(list((runs.out / "profiles").glob("*.json"))) == 4


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_the_tuner_writes_a_best_config_that_runs_as_is(runs: Runs) -> None:
    assert runs.first.returncode == 0, runs.first.stderr[-2000:]
    best = json.loads(runs.best_after_first)
    config = parse_config(best, "best.json")
    assert [group.gpus for step in config.steps for group in step.queue_groups] == [(-1, -1), (-1,), (-1,), (-1,)]
    assert config.steps[1].queue_groups[0].model_kwargs["batch"] == 8
    assert best["run"]["mean_interval_ms"] > 0 and best["description"].startswith("rnb-tune's best for p99 < 250 ms")
    check = subprocess.run([sys.executable, "benchmark.py", "-c", str(runs.out / "best.json"), "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert runs.first.stdout.splitlines()[-1] == f"wrote {runs.out / 'best.json'}, {runs.out / 'report.html'}"


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_every_candidate_is_in_the_parquet_with_its_prediction_and_what_was_measured(runs: Runs) -> None:
    table = pq.read_table(runs.out / "candidates.parquet").to_pylist()
    assert sorted(row["short_label"] for row in table) == ["1 | b8 | 1 | 1", "1 | b8 | 1 | 2", "1 | b8 | 2 | 1",
                                                            "2 | b8 | 1 | 1"]
    assert [row["rank"] for row in table] == [1, 2, 3, 4] and table[0]["short_label"] == "2 | b8 | 1 | 1"
    for row in table:
        assert row["predicted_peak_rate_per_s"] > 0 and row["predicted_p99_ms"] < BOUND_MS
        assert row["step 1 batch"] == 8 and row["devices_used"] == row["cpu_slots_used"] in (3, 4)
        assert row["predicted_bottleneck"] in ("step 0", "step 1", "step 2", "step 3")
    assert table[0]["predicted_peak_rate_per_s"] > 1.5 * max(row["predicted_peak_rate_per_s"] for row in table[1:])
    (verified,) = [row for row in table if row["verified"]]
    assert verified["short_label"] == "2 | b8 | 1 | 1" and verified["measured_p99_ms"] < BOUND_MS
    trials = json.loads(verified["verify_trials"])
    assert 2 <= len(trials) <= 4 and all(Path(trial["job_dir"]).is_dir() for trial in trials)
    assert Path(verified["job_log"]).is_dir() and verified["measured_peak_rate_per_s"] > 0


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_a_second_run_with_the_same_arguments_runs_no_job(runs: Runs) -> None:
    assert runs.second.returncode == 0, runs.second.stderr[-2000:]
    assert runs.jobs_after_second == runs.jobs_after_first
    assert (runs.out / "best.json").read_text() == runs.best_after_first
    assert "(cached)" in runs.second.stderr


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_the_report_renders_in_a_browser_without_errors_or_fetches(runs: Runs) -> None:
    seen = render(runs.out / "report.html")
    assert seen.errors == () and seen.fetched == () and seen.misfit_axes == ()
    assert seen.overlaps == () and seen.legends_on_data == ()
    # the Pareto plot, then the finalist's job at its peak rate: its stages, its offered and served rates, its
    # latency over time and its processes
    assert seen.plots == 5 and seen.traces >= 3
    text = (runs.out / "report.html").read_text()
    # At its peak rate the finalist's busiest step is saturated (named, with what one more replica adds), or not
    # (then the latency bound holds it): rnb.analysis.utilisation decides, as for every job.
    saturated = ("step 0&#x27;s 2 replicas are busy" in text or "step 2&#x27;s 1 replica is busy" in text) and (
        "would add" in text or "would bound it next" in text)
    assert saturated != ("no step was saturated at the peak rate" in text)
    assert (runs.out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_analyze_writes_the_same_page_for_one_job(runs: Runs, tmp_path: Path) -> None:
    job = next(Path(row["job_log"]) for row in pq.read_table(runs.out / "candidates.parquet").to_pylist()
               if row["job_log"])
    page = tmp_path / "job.html"
    done = subprocess.run([sys.executable, str(ANALYZE), str(job), "--html", str(page)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = render(page)
    assert seen.errors == () and seen.fetched == () and seen.plots == 4 and seen.misfit_axes == ()
    assert f"job {job.name}" in page.read_text()
    many = subprocess.run([sys.executable, str(ANALYZE), str(job.parent), "--html", str(page)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert many.returncode == 2 and many.stderr.startswith("analyze: --html writes one job's page; ")


# Not serial: no bound of 1 ms holds on any host, so a neighbour's load cannot change the verdict; profiled by hand
# (tests/support/tune_support.py), only the verdict runs.
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_a_bound_no_candidate_meets_names_the_closest_measured_and_exits_1(tmp_path: Path) -> None:
    config = write_example(tmp_path, batches=[8])
    out = tmp_path / "out"
    space = read_space(json.loads(config.read_text()), str(config), Budget(cpu_slots=4))
    cache = ProfileCache(out / "profiles")
    for profile in hand_profiles(space, Bench("cpu", "local")).values():
        cache.put(profile)
    done = tune("-c", str(config), "--cpu-slots", "4", "--latency-bound-ms", "1", "--out", str(out), *SHORT)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rnb-tune: no candidate meets p99 < 1 ms on 4 CPU slots: the closest measured, ")
    assert " ms at " in last and last.endswith(").") and "Traceback" not in done.stderr
    assert not (out / "best.json").exists() and (out / "report.html").is_file()
    assert [job.parent.name for job in job_dirs(out)] == ["verify"]   # the profiles were all found


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.timeout(E2E_TIMEOUT_S)
def test_the_estimator_replays_a_measured_job_from_its_own_calls(runs: Runs) -> None:
    """The finalist's job at its peak, simulated from its own arrivals and calls: what is left is the model's error.

    A job replayed so needs no quiet machine: the calls as measured carry whatever load the machine had.
    Jobs replayed here at a load of 7 agreed within 1% in throughput and p50 and p99; one taken at a load of
    130 within 1% in throughput and 4% in p50, but 34% low in p99: a neighbour's bursts slow consecutive
    calls together, where the simulation draws calls independently.  Hence the wider bound on the p99.
    """
    (row,) = [row for row in pq.read_table(runs.out / "candidates.parquet").to_pylist() if row["job_log"]]
    job = read_job(row["job_log"])
    measured = summarize_job(job, ValidityRules(min_duration_s=0.5))
    pipeline, arrivals = replay(job)
    predicted = Simulation(pipeline, arrivals, len(arrivals.times), warmup=int(job.meta.args["warmup"]),
                           percentiles=(50.0, 99.0)).run()
    assert predicted.items == measured["measured_items"]
    assert predicted.throughput_items_per_s == pytest.approx(measured["measured_throughput_items_per_s"], rel=0.05)
    assert predicted.latency_ms[50.0] == pytest.approx(measured["e2e_p50_ms"], rel=0.15)
    assert predicted.latency_ms[99.0] == pytest.approx(measured["e2e_p99_ms"], rel=0.4)
