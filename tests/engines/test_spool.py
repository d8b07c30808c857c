"""The timings spool: rows reach disk in batches while a job runs, and merge into one file in item order."""
from __future__ import annotations

import random

import pyarrow.parquet as pq

from rnb.core.joblog import SPOOL_DIR, timings_table
from rnb.core.timecard import TimeCard
from rnb.engines.spool import TimingsSpool


def cards(count: int) -> list[TimeCard]:
    """Cards in a plausible finishing order: ids out of order within a window, a few very late stragglers.

    Items 3000 on carry a field the earlier ones lack, as a model that sets it only sometimes would.
    """
    made = []
    for item in range(count):
        card = TimeCard(item, f"request {item}")
        card.record("enqueue", 1000.0 + item)
        for name in ("runner0_start", "inference0_start", "inference0_finish", "runner0_finish"):
            card.record(name, 1000.5 + item)
        card.record("decode_finish", 1000.25 + item)
        if item >= 3000:
            card.set_field("prediction", item % 7)
        made.append(card)
    rng = random.Random(4)
    order = sorted(range(count), key=lambda i: i + rng.uniform(0, 40))
    stragglers = order[10:15]
    return [made[i] for i in order if i not in stragglers] + [made[i] for i in stragglers]


def test_rows_stream_to_parts_and_merge_in_item_order_with_every_column(tmp_path):
    arriving = cards(5000)
    spool = TimingsSpool(tmp_path, num_steps=1, warmup=10, batch_rows=300, max_parts=8)
    for start in range(0, len(arriving), 7):  # results arrive a few cards per message
        spool.add(arriving[start:start + 7])
        assert len(spool.pending) < 300  # main never holds more than one batch of cards
        assert len(spool.parts) < 8      # parts are compacted before they pile up
    assert spool.rows == 5000 and any((tmp_path / SPOOL_DIR).iterdir())
    path = spool.close()
    assert not (tmp_path / SPOOL_DIR).exists()
    written = pq.read_table(path)
    expected = timings_table(arriving, 1, 10)
    assert written.column("item_id").to_pylist() == list(range(5000))
    assert sorted(written.column_names) == sorted(expected.column_names)
    for name in expected.column_names:
        assert written.column(name).to_pylist() == expected.column(name).to_pylist(), name


def test_a_short_job_writes_one_table_without_parts(tmp_path):
    spool = TimingsSpool(tmp_path, num_steps=1, warmup=0)
    spool.add(cards(20))
    assert not (tmp_path / SPOOL_DIR).exists()
    assert pq.read_table(spool.close()).column("item_id").to_pylist() == list(range(20))


def test_a_slow_job_still_reaches_disk_every_flush_interval(tmp_path):
    spool = TimingsSpool(tmp_path, num_steps=1, warmup=0, flush_s=0.0)
    spool.add(cards(3)[:1])
    (part,) = (tmp_path / SPOOL_DIR).iterdir()
    assert pq.read_table(part).num_rows == 1 and spool.pending == []
