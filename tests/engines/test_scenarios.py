"""LoadGen's scenarios: RnB's multi-stream lockstep, LoadGen itself as the client (`--client loadgen`) in each of
its four scenarios, judged by its own log and by RnB's reading of the same rules, and the refusals around both."""
from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from rnb import cli
from rnb.analysis.jobs import load_jobs
from rnb.analysis.loadgen_log import SUMMARY_FILE, read_detail
from rnb.analysis.loadgen_rules import loadgen_percentile
from rnb.analysis.rnb_analyze import main as analyze_main

REPO = Path(__file__).resolve().parents[2]
STEP_MS = 2.0


def one_step(tmp: Path, replicas: int = 2) -> str:
    """One step of STEP_MS of sleeping (models.toy.SyncSleep) on `replicas` CPU runners."""
    path = tmp / "sleep.json"
    path.write_text(json.dumps({"source": {"synthetic": True}, "pipeline": [
        {"model": "models.toy.SyncSleep", "ms": STEP_MS, "queue_groups": [{"gpus": [-1] * replicas}]}]}))
    return str(path)


def benchmark(*argv: str) -> subprocess.CompletedProcess[str]:
    """benchmark.py in a process of its own: these jobs' children take nothing from the test process (its fork
    server, its semaphores' tracker), which other modules' in-process jobs share."""
    return subprocess.run([sys.executable, "benchmark.py", *argv, "-q"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_multi_stream_sends_each_query_only_once_every_request_of_the_one_before_finished(tmp_path: Path, job_log):
    done = benchmark("-c", one_step(tmp_path), "--scenario", "multi-stream", "--samples-per-query", "4", "-v", "24",
                     "--min-duration-ms", "0", "--log-dir", str(tmp_path / "logs"))
    log = job_log(tmp_path / "logs")
    assert done.returncode == 0, done.stderr
    assert log.meta["args"]["load_mode"] == "multi_stream" and log.meta["args"]["warmup"] == 0
    rows = sorted(log.rows, key=lambda row: row["item_id"])
    queries = [rows[q * 4:(q + 1) * 4] for q in range(6)]
    for before, after in zip(queries, queries[1:]):
        assert min(row["enqueue"] for row in after) >= max(row["runner0_finish"] for row in before)
    assert log.meta["scenario"] == "multi-stream"
    assert [rule["rule"] for rule in log.meta["loadgen_rules"]["rules"]] == [
        "min duration satisfied", "min queries satisfied", "early stopping satisfied"]
    assert log.meta["loadgen_rules"]["rules"][-1]["why"] == "656 more queries needed"   # 662 against 6


RUNS = {   # scenario: its flags, -v, what LoadGen's early stopping says of it
    "offline": ([], 40, ""),
    "server": (["-mi", "5", "--target-latency-ms", "10000"], 40, "419 more queries needed"),   # 459 against 40
    "single-stream": (["--target-latency-ms", str(STEP_MS)], 40, "24 more queries needed"),   # 64 against 40
    "multi-stream": (["--samples-per-query", "4"], 16, "658 more queries needed"),           # 662 against 4
}


@pytest.fixture(scope="module")
def loadgen_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    """One job of each scenario with LoadGen as its client: its exit code and its job directory."""
    pytest.importorskip("mlperf_loadgen")
    base = tmp_path_factory.mktemp("loadgen")
    config = one_step(base)
    jobs = {}
    for scenario, (flags, videos, _) in RUNS.items():
        logs = base / scenario
        done = benchmark("-c", config, "--scenario", scenario, "--client", "loadgen", *flags, "-v", str(videos),
                         "--min-duration-ms", "0", "--log-dir", str(logs))
        jobs[scenario] = (done.returncode, next(logs.iterdir()))
    return jobs


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(RUNS))
def test_loadgen_drives_each_scenario_and_its_logs_agree_with_rnb_s_time_cards(scenario: str, loadgen_jobs) -> None:
    code, job_dir = loadgen_jobs[scenario]
    _, videos, early = RUNS[scenario]
    assert code == 0 and (job_dir / SUMMARY_FILE).is_file()
    detail = read_detail(job_dir)
    assert detail is not None and detail["effective_scenario"] == {"offline": "Offline", "server": "Server",
                                                                   "single-stream": "SingleStream",
                                                                   "multi-stream": "MultiStream"}[scenario]
    row = load_jobs(job_dir).jobs.to_pylist()[0]
    assert row["load_mode"] == "loadgen" and row["client"] == "loadgen"
    assert row["loadgen_log_samples"] == row["measured_items"] == videos   # every sample LoadGen issued, served
    # The same rules, read by LoadGen from its own clock and by RnB from the time cards, say the same.
    assert row["loadgen_rules"] == row["loadgen_log_rules"]
    assert row["loadgen_rules"].endswith(f"early stopping satisfied: {'no, ' + early if early else 'yes'}")
    assert row["loadgen_log_validity"] == ("VALID" if scenario == "offline" else "INVALID") == row["validity"]
    ours, theirs = json.loads(row["loadgen_result"]), json.loads(row["loadgen_log_result"])
    assert set(ours) == set(theirs)
    for name, value in ours.items():
        # LoadGen times each sample from before its issue to after its hand-over reached this process, which
        # the time cards' enqueue and hand-over lie within: its latencies are no shorter, its rates no higher.
        assert theirs[name] <= value if "per second" in name else theirs[name] >= value, (name, theirs, ours)


@pytest.mark.slow
def test_a_loadgen_job_keeps_rnb_s_verdict_beside_loadgen_s_in_meta_json(loadgen_jobs) -> None:
    _, job_dir = loadgen_jobs["server"]
    meta = json.loads((job_dir / "meta.json").read_text())
    assert meta["scenario"] == "server" and meta["args"]["client"] == "loadgen"
    assert meta["loadgen_rules"]["valid"] is False
    assert meta["loadgen_rules"]["rules"][-1] == {"rule": "early stopping satisfied", "met": False,
                                                  "why": "419 more queries needed"}
    timings = pq.read_table(job_dir / "timings.parquet")
    latency = (timings.column("runner0_finish").to_numpy() - timings.column("enqueue").to_numpy())
    assert meta["loadgen_rules"]["result"]["99th percentile latency ms"] == pytest.approx(
        loadgen_percentile(np.asarray(latency), 0.99) * 1000)


@pytest.mark.slow
def test_analyze_s_csv_and_page_name_each_rule_beside_loadgen_s_own(loadgen_jobs, tmp_path: Path) -> None:
    _, job_dir = loadgen_jobs["single-stream"]
    assert analyze_main([str(job_dir), "--csv", str(tmp_path / "jobs.csv"), "--html", str(tmp_path / "job.html")]) == 0
    (row,) = pcsv.read_csv(tmp_path / "jobs.csv").to_pylist()
    rules = ("min duration satisfied: yes; min queries satisfied: yes; early stopping satisfied: no, 24 more queries "
             "needed")
    assert (row["scenario"], row["validity"], row["loadgen_rules"], row["loadgen_log_rules"]) == (
        "single-stream", "INVALID", rules, rules)
    page = html.unescape((tmp_path / "job.html").read_text())
    assert f"verdict: INVALID by LoadGen's single-stream rules: {rules}" in page
    assert f"LoadGen's own verdict (40 samples, its log): INVALID: {rules}; its figures: " in page


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--scenario", "multi-stream", "-v", "20"],
     "command line: --scenario: expected -v to be whole queries of 8 requests (--samples-per-query), found -v 20"),
    (["--scenario", "multi-stream", "--samples-per-query", "3", "-v", "20"],
     "command line: --samples-per-query: expected -v to be whole queries of 3 requests (--samples-per-query), found -v "
     "20"),
    (["--scenario", "server", "--samples-per-query", "4"],
     "command line: --samples-per-query: expected the multi-stream scenario beside it, found server"),
    (["--scenario", "offline", "--target-latency-ms", "50"],
     "command line: --target-latency-ms: expected a scenario with a latency target beside it, found offline"),
    (["--client", "loadgen"], "command line: --client: expected --scenario (or run.scenario) beside it, found none"),
    (["--scenario", "single-stream", "--client", "loadgen", "--concurrency", "2"],
     "command line: --concurrency: expected none beside --client loadgen, whose single-stream scenario LoadGen issues "
     "itself, found --concurrency"),
    (["--scenario", "server", "--client", "loadgen", "--max-duration", "5"],
     "command line: --client: expected no --max-duration beside it, found 5 s: LoadGen ends its run when its last "
     "query completes, and a job ended before then would leave LoadGen waiting for samples"),
    (["--scenario", "server", "--client", "loadgen", "--engine", "ray"],
     "command line: --client: expected the local engine, found the ray engine: on Ray the final step's actors would "
     "have to send each completion to the client actor, which holds LoadGen, and that path is not built"),
])
def test_a_scenario_s_bad_mix_of_flags_is_one_sentence_and_exit_2(flags: list[str], sentence: str, tmp_path: Path,
                                                                  capsys) -> None:
    pytest.importorskip("mlperf_loadgen")
    assert cli.main(["-c", one_step(tmp_path), "--check", *flags]) == 2
    assert capsys.readouterr().err.strip() == sentence


def test_loadgen_as_the_client_without_its_package_is_refused_naming_the_extra(tmp_path: Path, capsys,
                                                                                monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)   # as if not installed: find_spec finds nothing
    assert cli.main(["-c", one_step(tmp_path), "--check", "--scenario", "server", "--client", "loadgen"]) == 2
    assert capsys.readouterr().err.strip() == (
        "command line: --client: expected MLPerf LoadGen's Python package installed (pip install '.[loadgen]'), found "
        "no mlperf_loadgen module")
