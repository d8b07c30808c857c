"""The GPU run's checks through jobs of the harness: stage times, NVDEC and its fallback, CUDA contexts, a busy
GPU, CUDA slots across jobs."""
from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

from bench.bounded import Deadline, finish, first_line, isolated, kill_group, start
from bench.gpu_kit import (
    DISCARD,
    FRAME_TOLERANCE,
    IPC_WARNING,
    ISOLATED_S,
    JOB_S,
    LOADER,
    REPO,
    SPIN_MS,
    TOY,
    Check,
    Datasets,
    Job,
    pipeline,
    run_job,
    verdict,
)


def check_stage_times(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    import pyarrow.parquet as pq

    from rnb.core.stages import END_TO_END, part_latencies

    spin = ("models.toy.GpuSpin", {"ms": SPIN_MS, **TOY})
    job = run_job(pipeline([(*spin, 0), (*spin, 0), (*spin, 0)]), 40, work, deadline)
    if job.code != 0 or job.job_dir is None:
        return verdict("stage-times", False, f"the job exited {job.code}: {job.stderr.strip()[-300:]}")
    short, slow = [], []
    for row in job.rows:
        for k in range(3):
            inside = (row[f"inference{k}_finish"] - row[f"inference{k}_start"]) * 1000
            device = row.get(f"device_ms{k}")
            if device is None or inside < device - 0.2:
                short.append((row["item_id"], k, inside, device))
            elif device < SPIN_MS / 2:  # the spin's cycles were counted at load; clocks may rise since
                slow.append((row["item_id"], k, device))
    parts = part_latencies(pq.read_table(job.job_dir / "timings.parquet"), 3)
    total = sum(values for key, values in parts.items() if key != END_TO_END.key)
    adds_up = bool(abs(total - parts[END_TO_END.key]).max() < 1e-6)
    device = sorted(value for value in job.column("device_ms1") if value is not None)
    inside = sorted((row["inference1_finish"] - row["inference1_start"]) * 1000 for row in job.rows)
    median_device = f"{device[len(device) // 2]:.2f} ms" if device else "missing"
    ok = not short and not slow and adds_up and len(job.rows) == 40
    return verdict("stage-times", ok, f"{3 * len(job.rows) - len(short)}/{3 * len(job.rows)} item-steps inside >= "
                                      f"device_ms; step 1 median device_ms {median_device}, inside "
                                      f"{inside[len(inside) // 2] if inside else math.nan:.2f} ms ({SPIN_MS:g} ms "
                                      f"spins); stages add up: {adds_up}", short=short[:5], slow=slow[:5])


def check_nvdec(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    """NVDEC decodes every item. NVML's decoder percentage is shown, not judged: a whole-percent average over
    NVML's sample period can read 0 for a few small items."""
    import pyarrow.parquet as pq

    loader = (LOADER[0], {**LOADER[1], "require_nvdec": True})
    source = {"dataset": str(datasets.get("good", deadline))}
    job = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], source), 80, work, deadline, ["--sample-interval-ms", "50"])
    if job.code != 0 or job.job_dir is None:
        return verdict("nvdec", False, f"the job exited {job.code}: {job.meta.get('error') or job.stderr[-300:]}")
    devices = set(job.column("decode_device"))
    notes = job.meta.get("notes", [])
    decode_ms = [(row["decode_finish"] - row["decode_start"]) * 1000 for row in job.rows]
    median = sorted(decode_ms)[len(decode_ms) // 2]
    samples = pq.read_table(job.job_dir / "samples.parquet").column("nvdec_util_percent").to_pylist()
    busiest = max((value for value in samples if value is not None), default=0)
    warmed = any("warm-up decoded one frame" in note for note in notes)
    said = any("frames decode on NVDEC" in note for note in notes)
    ok = devices == {"nvdec"} and warmed and said and decode_ms[0] <= 3 * median
    return verdict("nvdec", ok, f"decode_device {sorted(devices)}; item 0 decoded in {decode_ms[0]:.1f} ms, median "
                                f"{median:.1f} ms; warm-up noted: {warmed}; NVML decoder busy up to {busiest}% "
                                "(shown, not judged)", notes=notes)


def check_nvdec_overlap(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    """The loader decodes on NVDEC while the network fetches: clips fetched ahead through the WAN profile reach the
    slower of the link and decoding from local disk (bench.overlap_bench.overlap_rates)."""
    from bench.overlap_bench import overlap_rates

    found = isolated(overlap_rates, str(datasets.get("good", deadline)), "cuda:0", deadline=deadline, own_s=ISOLATED_S)
    bound = min(found["local_items_per_s"], found["link_items_per_s"])
    ok = found["devices"] == ["nvdec"] and found["fetched_ahead"] == 1.0 and found["wan_items_per_s"] >= 0.9 * bound
    return verdict("nvdec-overlap", ok, f"items/s through the WAN profile {found['wan_items_per_s']:.1f}, from local "
                                        f"disk {found['local_items_per_s']:.1f}, the link's {found['link_items_per_s']:.1f} "
                                        f"(goal: 0.9 of the slower); fetched ahead {found['fetched_ahead']:.0%}, waited "
                                        f"{found['wait_ms']:.1f} ms, decoding {found['decode_ms']:.1f} ms; decode_device "
                                        f"{found['devices']}", **found)


def compare_frames(root: str) -> dict[str, float]:
    """Frames of three instants of each episode decoded on NVDEC and on the CPU: the largest and mean differences."""
    from episodes import EpisodeByteCache, FrameRequest, open_dataset

    ds = open_dataset(root)
    key = ds.video_keys[0]
    worst, total, count, psnr = 0.0, 0.0, 0, math.inf
    with EpisodeByteCache(ds) as cache:
        for episode in range(ds.num_episodes):
            n = ds.episode_length(episode)
            asked = [FrameRequest(episode, key, frame_numbers=[0, n // 2, n - 1])]
            gpu = cache.read_frames(asked, device="cuda:0")[0]
            cpu = cache.read_frames(asked)[0].frames
            if gpu.backend.device != "nvdec":
                raise RuntimeError(f"episode {episode} decoded as {gpu.backend}")
            difference = (gpu.frames.cpu().float() - cpu.float()).abs()
            worst, total, count = max(worst, float(difference.max())), total + float(difference.sum()), count + difference.numel()
            mse = float((difference ** 2).mean())
            psnr = min(psnr, math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse))
    return {"max_abs": worst, "mean_abs": total / count, "min_psnr_db": psnr}


def check_nvdec_frames(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    found = isolated(compare_frames, str(datasets.get("good", deadline)), deadline=deadline, own_s=ISOLATED_S)
    return verdict("nvdec-frames", found["max_abs"] <= FRAME_TOLERANCE,
                   f"NVDEC vs CPU: max |difference| {found['max_abs']:.0f} (tolerance {FRAME_TOLERANCE}), mean "
                   f"{found['mean_abs']:.3f}, lowest PSNR {found['min_psnr_db']:.1f} dB", **found)


def check_fallback(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    source = {"dataset": str(datasets.get("tiny", deadline))}
    loader = (LOADER[0], {**LOADER[1], "num_clips": 1, "clip_length": 4, "size": 32})
    quiet = run_job(pipeline([(*loader, 0), (*DISCARD, 0)], source), 4, work / "quiet", deadline)
    strict = run_job(pipeline([(loader[0], {**loader[1], "require_nvdec": True}, 0), (*DISCARD, 0)], source), 4,
                     work / "required", deadline)
    said = [note for note in quiet.meta.get("notes", []) if "on the CPU instead of NVDEC" in note]
    error = strict.meta.get("error") or ""
    ok = (quiet.code == 0 and set(quiet.column("decode_device")) == {"cpu-fallback"} and bool(said)
          and strict.code == 1 and "require_nvdec is set, but torchcodec decodes" in error and "\n" not in error)
    return verdict("fallback", ok, f"without require_nvdec: exit {quiet.code}, decode_device "
                                   f"{sorted(set(map(str, quiet.column('decode_device'))))}; with it: exit "
                                   f"{strict.code}: {error[:160]}", note=said[:1], error=error)


TWO_JOBS = textwrap.dedent("""
    import json, sys
    import torch
    from rnb import cli
    from rnb.pipeline.gpus import Nvml
    runs = []
    for n in range(3):
        code = cli.main(["-c", sys.argv[1], "-v", "20", "-mi", "0", "--log-dir", sys.argv[2]])
        with Nvml() as nvml:
            used = nvml.device(0).memory_used_bytes
        runs.append([code, [torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())], used])
    print(json.dumps(runs))
""")


def check_ipc(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    from rnb.pipeline.gpus import Nvml, child_environment

    work.mkdir(parents=True, exist_ok=True)
    config = work / "ipc.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    with Nvml() as nvml:
        before = nvml.device(0).memory_used_bytes
    child = start([sys.executable, "-c", TWO_JOBS, str(config), str(work / "logs")], cwd=REPO, env=child_environment())
    stdout, stderr = finish(child, deadline, 3 * JOB_S, "three jobs in one process")
    with Nvml() as nvml:
        after = nvml.device(0).memory_used_bytes
    runs = json.loads(stdout.strip().splitlines()[-1]) if child.returncode == 0 else []
    warned = IPC_WARNING in stderr
    codes = [run[0] for run in runs]
    reserved = [run[1] for run in runs]
    used = [run[2] / 2**20 for run in runs]  # MiB on the GPU after each job, the process's own context included
    grew = used[-1] - used[0] if used else math.inf
    ok = (codes == [0, 0, 0] and all(not any(held) for held in reserved) and not warned and grew < 16
          and abs(after - before) < 64 * 2**20)
    return verdict("ipc", ok, f"three jobs in one process (exit {child.returncode}): exits {codes}, reserved after "
                              f"each {reserved} B, GPU used after each {[round(mib) for mib in used]} MiB (grew "
                              f"{grew:.0f} MiB); IPC warning: {warned}; {before / 2**20:.0f} MiB used before, "
                              f"{after / 2**20:.0f} MiB once it left", stderr=stderr[-500:])


def contexts_seen(job: Job, expected: set[str]) -> tuple[bool | None, str]:
    """Whether NVML saw exactly the `expected` processes of `job` on the GPU (None: it could not tell), and how."""
    watch = job.watch
    if watch.error:
        return None, f"unknown: NVML could not list the compute processes ({watch.error})"
    named = {name for name, pid in job.pids().items() if pid in watch.pids}
    if named:  # NVML reports pids of this namespace: the processes themselves must match
        return (named == expected and len(watch.pids) == len(expected),
                f"{len(watch.pids)} on the GPU by pid: {', '.join(sorted(named))}")
    # another namespace's pids: only their number can be compared, as the most entries NVML listed at once
    return watch.most == len(expected), (f"NVML listed at most {watch.most} at once, under {len(watch.pids)} pid(s) "
                                         "of another pid namespace")


def check_contexts(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    frames: tuple[str, dict[str, Any]] = ("models.toy.SyntheticFrames", TOY)
    net: tuple[str, dict[str, Any]] = ("models.toy.TinyConvNet", {})
    to_cpu = run_job(pipeline([(*frames, 0), (*net, -1)]), 60, work / "cpu", deadline, watch_gpu=True)
    through = run_job(pipeline([(*frames, 0), (*net, 0), (*DISCARD, -1)]), 60, work / "gpu", deadline, watch_gpu=True)
    lines, results = [], []
    for job, expected in ((to_cpu, {"step0-g0-r0"}), (through, {"main", "step0-g0-r0", "step1-g0-r0"})):
        matches, how = contexts_seen(job, expected)
        results.append(job.code == 0 and matches)
        lines.append(f"exit {job.code}, expected {len(expected)} ({', '.join(sorted(expected))}), {how}")
    host: dict[str, Any] = next((p for p in to_cpu.meta.get("processes", []) if p["name"] == "step0-g0-r0"), {})
    figure = (f"GPU step -> CPU step: {lines[0]}, its slots on {host.get('output_device')}; GPU -> GPU -> CPU: "
              f"{lines[1]}")
    if None in results:
        return Check("contexts", "SKIP", figure)
    return verdict("contexts", all(results) and host.get("output_device") == "cpu", figure)


HOLDS_A_CONTEXT = textwrap.dedent("""
    import sys, time
    import torch
    torch.zeros(1, device="cuda:0")
    print("holding", flush=True)
    time.sleep(float(sys.argv[1]))
""")


def start_job_holding_a_context(config: str, logs: str) -> tuple[int, str]:
    """In a process that holds a CUDA context (a bench that ran a loop, pytest after a CUDA test): a job of its own.

    Its session is the isolated process's, so a kill of that reaches it too.
    """
    import subprocess

    import torch

    from rnb.pipeline.gpus import child_environment

    torch.zeros(1, device="cuda:0")
    done = subprocess.run([sys.executable, str(REPO / "benchmark.py"), "-c", config, "-mi", "0", "-v", "10",
                           "--log-dir", logs], cwd=REPO, capture_output=True, text=True, env=child_environment())
    return done.returncode, done.stderr[-300:]


def check_busy(datasets: Datasets, work: Path, deadline: Deadline) -> Check:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "busy.json"
    config.write_text(json.dumps(pipeline([("models.toy.SyntheticFrames", TOY, 0), ("models.toy.TinyConvNet", {}, 0)])))
    own_code, own_err = isolated(start_job_holding_a_context, str(config), str(work / "own"), deadline=deadline,
                                 own_s=JOB_S)
    stranger = start([sys.executable, "-c", HOLDS_A_CONTEXT, str(2 * JOB_S)])
    try:
        first_line(stranger, deadline, 60.0, "a stranger's process taking a CUDA context")
        refused = run_job(json.loads(config.read_text()), 10, work / "stranger", deadline)
    finally:
        kill_group(stranger.pid)
        stranger.communicate()
    sentence = refused.stderr.strip().splitlines()[-1] if refused.stderr.strip() else ""
    ok = own_code == 0 and refused.code == 2 and "to be free, found" in sentence
    return verdict("busy", ok, f"started from a process holding a context: exit {own_code}; beside a stranger's: "
                               f"exit {refused.code}: {sentence[:200]}", own=own_err)
