"""Job-log analysis on a real toy-config job (made once per module), plus edited copies of it for the other cases."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from rnb.analysis.job_columns import PERCENTILES, stat_column
from rnb.analysis.job_dirs import read_job
from rnb.analysis.jobs import JobLogError, ValidityRules, load_jobs, summarize_job
from rnb.analysis.plots import jobs_figure
from rnb.analysis.summary import job_summary
from rnb.core.joblog import SPOOL_DIR
from rnb.engines.sampler import SampledGpu, Sampler
from rnb.pipeline.gpus import GpuUtilisation
from tests.support.fake_nvml import FakeNvml
from tests.support.shared_jobs import BULK_TOY_VIDEOS, bulk_toy_job

REPO = Path(__file__).resolve().parents[2]
ANALYZE = REPO / "scripts" / "analyze.py"
VIDEOS = BULK_TOY_VIDEOS   # 390 after warm-up: enough to bound the p99 (368), so the job can be VALID
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LENIENT = ValidityRules(min_duration_s=0.0, min_items=1)


@pytest.fixture(scope="module")
def real_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy config's bulk job that other modules read too; tests that edit it take `log_copy`."""
    shared = bulk_toy_job(tmp_path_factory.getbasetemp())
    assert shared.done.returncode == 0, shared.done.stderr
    (job,) = shared.log_dir.iterdir()
    return job


@pytest.fixture()
def log_copy(real_job: Path, tmp_path: Path) -> Path:
    """A private log directory holding a copy of the real job, free to edit."""
    shutil.copytree(real_job, tmp_path / "logs" / real_job.name)
    return tmp_path / "logs"


def edit_meta(job_dir: Path, **changes: object) -> None:
    meta = json.loads((job_dir / "meta.json").read_text())
    meta.update(changes)
    (job_dir / "meta.json").write_text(json.dumps(meta))


def clone_job(log_dir: Path, source: str, name: str, **meta_changes: object) -> Path:
    target = log_dir / name
    shutil.copytree(log_dir / source, target)
    edit_meta(target, job_id=name, **meta_changes)
    return target


def measured_timings(job_dir: Path) -> pa.Table:
    table = pq.read_table(job_dir / "timings.parquet")
    return table.filter(pc.invert(table.column("is_warmup")))


def seconds(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def numpy_stats(values_s: np.ndarray) -> list[float]:
    ms = values_s * 1000.0
    return [ms.min(), ms.mean(), *np.percentile(ms, PERCENTILES), ms.max()]


def stats_of(row: dict, prefix: str) -> list[float]:
    return [row[stat_column(prefix, s)] for s in ("min", "mean", "p50", "p90", "p95", "p99", "p99_9", "max")]


def run_analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ANALYZE), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_latency_statistics_equal_numpy_on_the_same_timings(real_job: Path) -> None:
    row = load_jobs(real_job.parent, rules=LENIENT).jobs.to_pylist()[0]
    t = measured_timings(real_job)
    assert row["num_steps"] == 2
    assert row["measured_items"] == t.num_rows > 0
    enqueue = seconds(t, "enqueue")
    assert stats_of(row, "e2e") == pytest.approx(numpy_stats(seconds(t, "runner1_finish") - enqueue), rel=1e-12)
    previous = enqueue
    for k in range(2):
        start, finish = seconds(t, f"runner{k}_start"), seconds(t, f"runner{k}_finish")
        inside = seconds(t, f"inference{k}_finish") - seconds(t, f"inference{k}_start")
        # Step 0 hands over through a slot; the final step has none, so its slot wait is 0.
        slot_wait = (seconds(t, "slot0_acquired") - seconds(t, "inference0_finish")) if k == 0 else 0.0 * inside
        assert stats_of(row, f"queue{k}") == pytest.approx(numpy_stats(start - previous), rel=1e-12, abs=1e-9)
        assert stats_of(row, f"inside{k}") == pytest.approx(numpy_stats(inside), rel=1e-12, abs=1e-9)
        assert stats_of(row, f"slotwait{k}") == pytest.approx(numpy_stats(slot_wait), rel=1e-9, abs=1e-9)
        assert stats_of(row, f"copy{k}") == pytest.approx(
            numpy_stats(finish - start - inside - slot_wait), rel=1e-9, abs=1e-9)
        previous = finish
    stage_means = sum(row[stat_column(f"{part}{k}", "mean")] for k in range(2)
                      for part in ("queue", "copy", "slotwait", "inside"))
    assert stage_means == pytest.approx(row[stat_column("e2e", "mean")], rel=1e-9)


def test_job_row_carries_meta_args_window_and_devices(real_job: Path, job_log) -> None:
    row = load_jobs(real_job, rules=LENIENT).jobs.to_pylist()[0]
    meta = job_log(real_job).meta
    t = measured_timings(real_job)
    assert row["job_id"] == meta["job_id"] == real_job.name
    assert (row["config_path"], row["termination_reason"]) == (meta["config_path"], "target reached")
    assert (row["mean_interval_ms"], row["videos"]) == (0, VIDEOS)
    assert row["finished_items"] == VIDEOS
    window = seconds(t, "runner1_finish").max() - seconds(t, "enqueue").min()
    assert row["measured_duration_s"] == pytest.approx(window, rel=1e-12)
    assert row["measured_throughput_items_per_s"] == pytest.approx(t.num_rows / window, rel=1e-12)
    assert json.loads(row["items_per_device"]) == {"0": {"cpu": VIDEOS}, "1": {"cpu": VIDEOS}}
    rss = {p["name"]: p["peak_rss_bytes"] for p in meta["processes"] if p["peak_rss_bytes"] is not None}
    assert json.loads(row["peak_rss_bytes"]) == rss
    assert row["max_peak_rss_bytes"] == max(rss.values(), default=None)


def test_energy_per_item_is_the_gpus_sampled_board_power_over_the_job_and_null_on_the_cpu(
        real_job: Path, log_copy: Path) -> None:
    assert load_jobs(real_job, rules=LENIENT).jobs.to_pylist()[0]["energy_per_item_j"] is None   # a CPU job
    job_dir = log_copy / real_job.name
    meta = json.loads((job_dir / "meta.json").read_text())
    start, end = meta["start_time"], meta["end_time"]
    half = (end - start) / 2
    # Two GPUs sampled by the fake NVML at the job's start, middle and end (and one reading after it, outside
    # the job): GPU 0 at 100, 200, 300 W, GPU 1 at 50 W throughout. By trapezoids GPU 0 used (150 + 250) x half
    # joules and GPU 1 100 x half.
    clock = iter([when for when in (start, start + half, end, end + 1.0) for _gpu in range(2)])   # a row's read
    nvml = FakeNvml({0: [GpuUtilisation(90, 2**30, 0, watts) for watts in (100.0, 200.0, 300.0, 900.0)],
                     1: [GpuUtilisation(10, 2**30, 0, 50.0)] * 4})
    sampler = Sampler(0.1, (SampledGpu(0, 0), SampledGpu(1, 1)), nvml, lambda: next(clock))
    for _ in range(4):
        sampler.sample(nvml)
    samples = pq.read_table(job_dir / "samples.parquet")
    pq.write_table(pa.concat_tables([samples, sampler.table()]), job_dir / "samples.parquet")
    row = load_jobs(log_copy, rules=LENIENT).jobs.to_pylist()[0]
    # Epoch seconds in float64 are exact to about 2e-7 s, so the sample times' differences are to about 1e-6.
    assert row["energy_per_item_j"] == pytest.approx(500.0 * half / VIDEOS, rel=1e-5)
    assert f"energy: {row['energy_per_item_j']:.4g} J per item (the GPUs' sampled board power over the job)" in (
        job_summary(job_dir))


def test_items_table_has_one_row_per_finished_item_with_derived_latencies(real_job: Path) -> None:
    items = load_jobs(real_job).items
    timings = pq.read_table(real_job / "timings.parquet")
    assert items.num_rows == VIDEOS
    assert set(items.column("job_id").to_pylist()) == {real_job.name}
    assert items.column("item_id").to_pylist() == timings.column("item_id").to_pylist()
    e2e = (seconds(timings, "runner1_finish") - seconds(timings, "enqueue")) * 1000.0
    assert seconds(items, "e2e_ms") == pytest.approx(e2e, rel=1e-12)


def test_validity_flips_with_each_rule(real_job: Path, log_copy: Path) -> None:
    job = read_job(real_job)
    count = measured_timings(real_job).num_rows
    assert summarize_job(job, ValidityRules(0.0, count))["validity"] == "VALID"
    few = summarize_job(job, ValidityRules(0.0, count + 1))
    assert (few["validity"], few["invalid_because"]) == (
        "INVALID", f"{count} items after warm-up, fewer than --min-items {count + 1}.")
    short = summarize_job(job, ValidityRules(3600.0, 1))
    duration = short["measured_duration_s"]
    assert (short["validity"], short["invalid_because"]) == (
        "INVALID", f"the measured window lasted {duration:.3f} s, less than --min-duration 3600 s.")
    edit_meta(log_copy / real_job.name, termination_reason="request queue full")
    full = load_jobs(log_copy, rules=ValidityRules(0.0, count)).jobs.to_pylist()[0]
    assert (full["validity"], full["invalid_because"]) == (
        "INVALID", "the run ended with 'request queue full', not 'target reached' or 'max duration'.")


def test_a_job_without_items_has_null_latencies_and_is_invalid(real_job: Path, log_copy: Path) -> None:
    job_dir = log_copy / real_job.name
    pq.write_table(pq.read_table(job_dir / "timings.parquet").slice(0, 0), job_dir / "timings.parquet")
    edit_meta(job_dir, termination_reason="process failed", failed_process="runner-1-0-0", error="boom.")
    row = load_jobs(log_copy, rules=ValidityRules(0.0, 1)).jobs.to_pylist()[0]
    assert row["measured_items"] == 0 and row[stat_column("e2e", "p99")] is None
    assert row["invalid_because"] == ("the run ended with 'process failed', not 'target reached' or 'max duration'; "
                                      "0 items after warm-up, fewer than --min-items 1; 0 items cannot bound the "
                                      "p99 from above at 95% confidence, which takes at least 368 (0.99^n <= 0.025).")


def test_analyze_prints_the_table_and_writes_every_export(real_job: Path, tmp_path: Path) -> None:
    out = {kind: tmp_path / f"jobs.{kind}" for kind in ("csv", "json", "parquet")}
    done = run_analyze(str(real_job.parent), "--min-items", "1", "--min-duration", "0",
                       *(arg for kind, path in out.items() for arg in (f"--{kind}", str(path))))
    assert done.returncode == 0, done.stderr
    assert real_job.name in done.stdout and "VALID" in done.stdout and "end to end" in done.stdout
    expected = load_jobs(real_job.parent, rules=LENIENT).jobs
    assert pq.read_table(out["parquet"]).equals(expected)
    csv = pcsv.read_csv(out["csv"])
    assert csv.num_rows == 1 and csv.column("job_id").to_pylist() == [real_job.name]
    (document,) = json.loads(out["json"].read_text())
    assert document[stat_column("e2e", "p99")] == expected.column(stat_column("e2e", "p99"))[0].as_py()
    assert document["items_per_device"] == {"0": {"cpu": VIDEOS}, "1": {"cpu": VIDEOS}}


def test_the_table_names_the_config_and_the_batches_also_of_a_log_in_the_old_layout(real_job: Path, log_copy: Path) -> None:
    assert re.fullmatch(r"\d{6}_\d{6}-toy-mi0-v400-qs12", real_job.name)  # -qs only where not its default
    # A log written before the id named the config and before the route columns: -b's value in the id, no batch_size{k}.
    old = clone_job(log_copy, real_job.name, "261130_091500-mi0-b1-v400-qs50000")
    timings = pq.read_table(old / "timings.parquet")
    pq.write_table(timings.drop_columns(["batch_size0", "batch_size1"]), old / "timings.parquet")
    done = run_analyze(str(log_copy), "--min-items", "1", "--min-duration", "0")
    assert done.returncode == 0, done.stderr
    header, rule, *rows = done.stdout.split("\n\n")[0].splitlines()
    assert header.split()[:6] == ["job", "config", "batch", "load", "reason", "validity"]
    cells = {row.split()[0]: row.split()[1:8] for row in rows}
    assert cells == {real_job.name: ["toy", "1/1", "bulk", "(all", "at", "once)", "target"],
                     old.name: ["toy", "-/-", "bulk", "(all", "at", "once)", "target"]}


def test_the_summary_throughput_is_the_measured_window_analyze_reports(real_job: Path) -> None:
    row = load_jobs(real_job.parent, rules=LENIENT).jobs.to_pylist()[0]
    (line,) = [line for line in job_summary(real_job).splitlines() if line.startswith("throughput: ")]
    meta = json.loads((real_job / "meta.json").read_text())
    assert line == (f"throughput: {row['measured_throughput_items_per_s']:.2f} items/s ({VIDEOS - 10} measured items "
                    f"after 10 warm-up, in {row['measured_duration_s']:.3f} s); all {VIDEOS} items: "
                    f"{meta['throughput_items_per_s']:.2f} items/s in {meta['elapsed_s']:.3f} s")


def test_plot_is_a_png_with_a_load_panel_only_when_a_config_ran_at_several_loads(
        real_job: Path, log_copy: Path, tmp_path: Path) -> None:
    single, several = tmp_path / "single.png", tmp_path / "several.png"
    assert run_analyze(str(log_copy), "--plot", str(single)).returncode == 0
    panels = [axes.get_title() for axes in jobs_figure(load_jobs(log_copy).jobs)[0].axes]
    clone_job(log_copy, real_job.name, "at-mi-5", args={**json.loads((real_job / "meta.json").read_text())["args"],
                                                        "mean_interval_ms": 5})
    assert run_analyze(str(log_copy), "--plot", str(several)).returncode == 0
    for path in (single, several):
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    assert "throughput against p99 latency" not in panels
    assert "throughput against p99 latency" in [axes.get_title() for axes in jobs_figure(load_jobs(log_copy).jobs)[0].axes]
    # Two jobs are drawn one row each over time, under the stages and the load curve, and named in a key.
    assert matplotlib.image.imread(several).shape[0] > matplotlib.image.imread(single).shape[0]


def test_plot_says_which_jobs_time_rows_it_left_out(real_job: Path, log_copy: Path, tmp_path: Path) -> None:
    clones = [clone_job(log_copy, real_job.name, f"z-clone-{i}").name for i in range(6)]   # sorted after the job
    done = run_analyze(str(log_copy), "--plot", str(tmp_path / "many.png"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == (f"analyze: --plot draws the time rows of the first 6 jobs; left out: {clones[-1]} "
                           "(analyze.py with them alone draws theirs).\n")


def test_compare_shows_both_jobs_with_ratios(real_job: Path, log_copy: Path) -> None:
    clone_job(log_copy, real_job.name, "copy-job")
    done = run_analyze(str(log_copy), "--compare", real_job.name, "copy-job")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"A {real_job.name}" in lines[0] and "B copy-job" in lines[0] and "B/A" in lines[0]
    ratios = [line.split()[-1] for line in lines if line.startswith(("measured_items ", stat_column("e2e", "p99")))]
    assert ratios == ["1.000", "1.000"]
    # Memory reads in MiB, as in the summary table, and says so.
    (rss,) = [line.split() for line in lines if line.startswith("max_peak_rss")]
    peak = json.loads((real_job / "meta.json").read_text())
    expected = max(p["peak_rss_bytes"] for p in peak["processes"] if p.get("peak_rss_bytes") is not None) / 2**20
    assert rss == ["max_peak_rss", "MiB", f"{expected:.1f}", f"{expected:.1f}", "1.000"]
    missing = run_analyze(str(log_copy), "--compare", real_job.name, "no-such-job")
    assert (missing.returncode, missing.stderr) == (2, f"analyze: {log_copy}: no job named 'no-such-job'.\n")


def test_bytes_reused_show_next_to_bytes_fetched(real_job: Path, log_copy: Path) -> None:
    job_dir = log_copy / real_job.name
    table = pq.read_table(job_dir / "timings.parquet")
    # As a loader reports them: an item either fetches its episode or finds it fetched by an earlier one.
    fetched = pa.array([1000 * (i % 3 == 0) for i in range(table.num_rows)], pa.int64())
    reused = pa.array([1000 * (i % 3 != 0) for i in range(table.num_rows)], pa.int64())
    table = table.set_column(table.schema.get_field_index("bytes_fetched"), "bytes_fetched", fetched)
    pq.write_table(table.append_column("bytes_reused", reused), job_dir / "timings.parquet")
    clone_job(log_copy, real_job.name, "copy-job")
    row = load_jobs(job_dir, rules=LENIENT).jobs.to_pylist()[0]
    measured = measured_timings(job_dir)
    window = row["measured_duration_s"]
    assert row["bytes_fetched_per_s"] == pytest.approx(pc.sum(measured.column("bytes_fetched")).as_py() / window)
    assert row["bytes_reused_per_s"] == pytest.approx(pc.sum(measured.column("bytes_reused")).as_py() / window)
    assert row["bytes_reused_per_s"] == pytest.approx(2 * row["bytes_fetched_per_s"], rel=0.02)
    done = run_analyze(str(log_copy), "--compare", real_job.name, "copy-job")
    assert done.returncode == 0, done.stderr
    names = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert names[names.index("bytes_fetched_per_s") + 1] == "bytes_reused_per_s"


def test_analyze_rejects_an_empty_log_dir_and_an_unreadable_job(real_job: Path, log_copy: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_analyze(str(empty))
    assert (done.returncode, done.stderr) == (2, f"analyze: {empty}: holds no job directories (none has a meta.json).\n")
    meta = log_copy / real_job.name / "meta.json"
    meta.write_text("{not json")
    done = run_analyze(str(log_copy))
    assert done.returncode == 2 and done.stderr.startswith(f"analyze: {meta}: cannot be read as JSON (")
    assert run_analyze(str(tmp_path / "absent")).stderr == f"analyze: {tmp_path / 'absent'}: no such log or job directory.\n"


def test_a_timings_file_without_a_step_column_is_named(real_job: Path, log_copy: Path) -> None:
    timings = log_copy / real_job.name / "timings.parquet"
    pq.write_table(pq.read_table(timings).drop_columns(["runner1_finish"]), timings)
    with pytest.raises(JobLogError) as error:
        load_jobs(log_copy)
    assert str(error.value) == f"{timings}: lacks the column 'runner1_finish'."


def test_a_job_killed_before_its_meta_json_is_listed_as_incomplete_beside_the_others(
        real_job: Path, log_copy: Path, tmp_path: Path) -> None:
    killed = log_copy / "261130_091500-mi0-b1-v900-qs50000"
    killed.mkdir()
    shutil.copy(real_job / "config.json", killed / "config.json")
    (killed / SPOOL_DIR).mkdir()
    pq.write_table(pq.read_table(real_job / "timings.parquet").slice(0, 7), killed / SPOOL_DIR / "part-000001.parquet")
    (killed / SPOOL_DIR / "part-000002.parquet").write_bytes(b"PAR1 cut short by SIGKILL")
    line = (f"{killed.name}: INCOMPLETE: no meta.json, so the job is still running or its main process was killed; "
            f"7 finished items are in {killed / SPOOL_DIR}\n")
    done = run_analyze(str(log_copy))
    assert done.returncode == 0, done.stderr
    assert real_job.name in done.stdout and done.stdout.endswith(line)
    assert load_jobs(log_copy, rules=LENIENT).jobs.column("job_id").to_pylist() == [real_job.name]
    shutil.rmtree(log_copy / real_job.name)
    done = run_analyze(str(log_copy))
    assert (done.returncode, done.stdout, done.stderr) == (0, line, "")


def test_html_of_several_jobs_names_one_to_pick(real_job: Path, log_copy: Path, tmp_path: Path) -> None:
    clone = clone_job(log_copy, real_job.name, "z-clone")
    done = run_analyze(str(log_copy), "--html", str(tmp_path / "page.html"))
    assert done.returncode == 2
    assert done.stderr == (f"analyze: --html writes one job's page; {log_copy} holds 2 jobs; name one job's directory, "
                           f"such as {clone}.\n")
    assert not (tmp_path / "page.html").exists()
