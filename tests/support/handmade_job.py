"""A job log made by hand, row by row, as the harness writes one: the trace's, the utilisation's and the plots' tests read it.

Times in its rows are ms after ORIGIN; scripts/analyze.py reads it as it reads a real job's.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
ANALYZE = REPO / "scripts" / "analyze.py"
ORIGIN = 1000.0


def run_analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ANALYZE), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def process(name: str, role: str, step: int | None, group: int | None, instance: int | None,
            device: str | None) -> dict[str, Any]:
    return {"name": name, "role": role, "step": step, "group": group, "instance": instance, "device": device}


def write_job(job_dir: Path, rows: list[dict[str, Any]], processes: list[dict[str, Any]],
              config: dict[str, Any], num_steps: int) -> Path:
    """A job directory as the harness writes one; times in rows are ms after ORIGIN."""
    job_dir.mkdir(parents=True)
    columns: dict[str, list] = defaultdict(list)
    names = sorted({name for row in rows for name in row}, key=lambda name: (name != "item_id", name))
    for row in rows:
        for name in names:
            value = row.get(name)
            columns[name].append(ORIGIN + value / 1000.0 if isinstance(value, float) else value)
    table = pa.table(dict(columns))
    table = table.append_column("is_warmup", pa.array([False] * len(rows)))
    pq.write_table(table, job_dir / "timings.parquet")
    (job_dir / "config.json").write_text(json.dumps(config))
    meta = {"job_id": job_dir.name, "num_steps": num_steps, "host": "testhost", "start_time": ORIGIN,
            "end_time": ORIGIN + 0.030, "termination_reason": "target reached", "processes": processes, "args": {}}
    (job_dir / "meta.json").write_text(json.dumps(meta))
    return job_dir


def step_times(k: int, arrived: float, started: float, finished: float, handed: float,
               acquired: float | None = None) -> dict[str, float]:
    times = {f"runner{k}_start": arrived, f"inference{k}_start": started, f"inference{k}_finish": finished,
             f"runner{k}_finish": handed}
    return times if acquired is None else {**times, f"slot{k}_acquired": acquired}


def handmade_job(tmp_path: Path) -> Path:
    """Three items through a loader (with fetch and decode) and two replicas of a network on two devices.

    Item 2 reaches the CPU replica while it still holds item 0, and its
    slices cross item 0's: it must go onto a second lane.
    """
    config = {"pipeline": [
        {"model": "m.Loader", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
        {"model": "m.Net", "queue_groups": [{"gpus": [-1, 0], "in_queue": 0}]}]}
    processes = [process("client", "client", None, None, None, None),
                 process("step0-g0-r0", "runner", 0, 0, 0, "cpu"),
                 process("step1-g0-r0", "runner", 1, 0, 0, "cpu"),
                 process("step1-g0-r1", "runner", 1, 0, 1, "cuda:0")]
    rows = [
        {"item_id": 0, "enqueue": 1.0, **step_times(0, 2.0, 3.0, 6.0, 8.0, acquired=7.0),
         "fetch_start": 3.5, "fetch_finish": 4.0, "decode_start": 4.0, "decode_finish": 5.0,
         **step_times(1, 10.0, 11.0, 20.0, 21.0), "device0": "cpu", "device1": "cpu"},
        {"item_id": 1, "enqueue": 1.0, **step_times(0, 8.0, 9.0, 12.0, 13.0, acquired=12.0),
         "fetch_start": 9.0, "fetch_finish": 10.0, "decode_start": 10.0, "decode_finish": 11.5,
         **step_times(1, 14.0, 15.0, 18.4, 19.0), "device0": "cpu", "device1": "cuda:0"},
        {"item_id": 2, "enqueue": 2.0, **step_times(0, 13.0, 14.0, 16.0, 18.0, acquired=17.0),
         "fetch_start": 14.0, "fetch_finish": 15.0, "decode_start": 15.0, "decode_finish": 16.0,
         **step_times(1, 18.5, 19.5, 24.0, 25.0), "device0": "cpu", "device1": "cpu"},
    ]
    return write_job(tmp_path / "logs" / "handmade", rows, processes, config, num_steps=2)
