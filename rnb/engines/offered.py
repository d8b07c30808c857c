"""Every request the client offered, dropped ones included: the log's offered.parquet.

timings.parquet holds the items a step finished; a frame the drop policy
replaced, or a request still in the pipeline when the job ended, is not
there.  The client tells main what it offered (rnb.core.messages.Offered:
how many, from when, which it dropped), and each request's due time,
stream and frame follow from the load's settings and seed (rnb.load), as
the client drew them.  So the log keeps each offered request with its fate,
and `--arrivals logs/JOB` replays exactly what was offered.
"""
from __future__ import annotations

import itertools
from collections.abc import Collection

import pyarrow as pa

from rnb.core.messages import Offered
from rnb.load import FATES, LoadSettings, mode_of

SCHEMA = pa.schema([("item_id", pa.int64()), ("due", pa.float64()), ("stream", pa.int64()), ("frame", pa.int64()),
                    ("fate", pa.string())])


def offered_table(offered: Offered, settings: LoadSettings, seed: int, finished: Collection[int]) -> pa.Table:
    """One row per request offered, in item order: its due time (epoch seconds on the job's clock; null where the
    load has none, as bulk and the closed loop), its stream and frame (null outside streams and traces with a
    stream column) and its fate: processed, dropped, or unfinished (offered, and in the pipeline at the end)."""
    processed, dropped, unfinished = FATES
    replaced = set(offered.dropped)
    arrivals = list(itertools.islice(mode_of(settings).arrivals(settings, seed), offered.issued))
    return pa.table({
        "item_id": list(range(len(arrivals))),
        "due": [None if a.due_s is None else offered.started + a.due_s for a in arrivals],
        "stream": [a.stream for a in arrivals],
        "frame": [a.frame for a in arrivals],
        "fate": [processed if item in finished else dropped if item in replaced else unfinished
                 for item in range(len(arrivals))],
    }, schema=SCHEMA)
