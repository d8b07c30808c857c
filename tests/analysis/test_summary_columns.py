"""The end-of-run summary reads the columns it needs one at a time, and prints what the whole table gives."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rnb.analysis.job_dirs import read_job
from rnb.analysis.summary import summary_text, utilisation_text
from rnb.analysis.utilisation import utilisation_columns
from rnb.core.stages import END_TO_END, PARTS, part_key, part_latencies


def whole_table_lines(timings: Path, num_steps: int) -> list[str]:
    """The latency lines computed the plain way, from every column of every measured row at once: each step's parts,
    then the model's own spans that lie inside its call."""
    table = pq.read_table(timings)
    measured = table.filter(pc.invert(table.column("is_warmup")))
    latencies = part_latencies(measured, num_steps)

    def seconds(name: str) -> np.ndarray:
        return measured.column(name).to_numpy().astype(float)

    rows = []
    for k in range(num_steps):
        rows += [(f"step {k} {part.name}", latencies[part_key(part, k)]) for part in PARTS]
        for span in ("decode", "fetch"):
            begin, end = seconds(f"{span}_start"), seconds(f"{span}_finish")
            inside = (begin >= seconds(f"inference{k}_start")) & (end <= seconds(f"inference{k}_finish"))
            rows.append((f"step {k}  {span}", np.where(inside, end - begin, np.nan)))
    lines = []
    for stage, seconds in [*rows, (END_TO_END.name, latencies[END_TO_END.key])]:
        ms = seconds[~np.isnan(seconds)] * 1000
        if ms.size:
            lines.append(f"  {stage:<22}{ms.mean():>10.2f}{np.percentile(ms, 50):>10.2f}{np.percentile(ms, 99):>10.2f}")
    return lines


def test_the_summary_reads_a_few_columns_at_a_time_and_prints_the_whole_tables_figures(handmade: Path, monkeypatch):
    timings = handmade / "timings.parquet"
    reads: list[list[str] | None] = []
    original = pq.ParquetFile.read

    def recording(self, columns=None, **kwargs):
        reads.append(columns)
        return original(self, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", recording)
    text = summary_text(timings, 2, 0, 3, 0.03, "target reached")
    lines = text.splitlines()
    assert lines[2] == "latency in ms over 3 items (the first 0 items are warmup, excluded):"
    assert lines[4:] == whole_table_lines(timings, 2) and len(lines) > 6
    assert [line.split()[2] for line in lines[4:] if line.startswith("  step 0  ")] == ["decode", "fetch"]
    assert reads[0] == ["is_warmup"] and all(len(columns) == 1 for columns in reads)  # one column at a time
    assert {columns[0] for columns in reads} == {"is_warmup", "enqueue", "slot0_acquired", "fetch_start", "fetch_finish",
                                                 "decode_start", "decode_finish", *(
        f"{event}{k}_{when}" for k in range(2) for event, when in (("runner", "start"), ("inference", "start"),
                                                                    ("inference", "finish"), ("runner", "finish")))}


def test_utilisation_reads_only_who_ran_what_and_says_what_the_whole_job_says(handmade: Path) -> None:
    narrow = read_job(handmade, columns=lambda steps: [f"device{k}" for k in range(steps)] + ["no such column"])
    every = ["item_id", "is_warmup", "enqueue", *(f"{event}{k}_{when}" for k in range(2)
                                                  for event, when in (("runner", "start"), ("inference", "start"),
                                                                      ("inference", "finish"), ("runner", "finish")))]
    assert narrow.timings.column_names == [*every, "device0", "device1"]
    assert utilisation_columns(narrow) == utilisation_columns(read_job(handmade))
    assert utilisation_text(handmade) != ""
