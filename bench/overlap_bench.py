"""The loader decoding while the network fetches: rows P3w and P3m of bench/run.py.

P3w puts the R(2+1)D loader reading clips through the network profile
(episodes.testing.network.WAN) next to the same loader reading the same
files from local disk: both fetch the next items' clips while an item
decodes, so where the link carries an item's bytes in less time than the
item takes to decode, the link hides behind decoding and the ratio is 1.

P3m follows the loader's resident memory over a long remote run: whatever
it kept of each item (bytes fetched ahead and never let go of, decoders,
time cards) would make it grow by a share of an item's bytes per item. The
bound is an item's bytes: a loader that kept every byte it fetched would
grow by 1.0 of them per item; a flat one by 0.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import psutil

from bench.access_bench import WAN_CLIPS, decoding_ms, item_requests, loader_rate, resolution, waited_ms
from bench.common import Effort, Goal, Row, Side, compare, measure_pair
from episodes.testing.network import WAN
from episodes.testing.server import serve_directory
from rnb.core.timecard import TimeCard


def _item_bytes(cards: list[TimeCard]) -> float:
    return float(np.median([int(card.fields["bytes_fetched"]) + int(card.fields["bytes_reused"]) for card in cards]))


def wan_loader_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P3w: loader items/s through the network profile / the same loader from local disk (module docstring)."""
    count = effort.pick(8, 16)
    remote: list[TimeCard] = []
    local: list[TimeCard] = []
    starts = iter(range(1000))
    with serve_directory(root, workdir / "nginx-p3w", profile=WAN) as server:
        row = measure_pair("P3w", f"R(2+1)D loader items/s, clips fetched ahead, GOP 2: through {WAN} / from local disk",
                           Goal(">=", 0.95),
                           ("WAN", "items/s", lambda: loader_rate(server.url, WAN_CLIPS, count, next(starts), remote)),
                           ("local disk", "items/s", lambda: loader_rate(str(root), WAN_CLIPS, count, next(starts),
                                                                         local)),
                           effort.reps)
    item_bytes = _item_bytes(remote)
    note = (f"{count} items per repetition, 10 clips of 8 frames resized to 112, {resolution(root)}, 8 fetch threads, "
            f"coalesce gap 0, 2 items fetched ahead. Per item (median): {item_bytes / 1e6:.2f} MB, which the link "
            f"carries in {1000 * item_bytes / WAN.bytes_per_s:.0f} ms, against {decoding_ms(local):.0f} ms decoding "
            f"from local disk; through the link an item waited {waited_ms(remote):.0f} ms for its first bytes "
            f"(local disk: {waited_ms(local):.0f})")
    return [dataclasses.replace(row, note=note)]


def rss_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P3m: the loader's RSS growth per item over the second half of a long remote run / an item's source bytes."""
    items = effort.pick(120, 300)
    process = psutil.Process()
    setup = dataclasses.replace(WAN_CLIPS, byte_budget=2**23)
    loader = setup.loader(0)
    rss: list[int] = []
    cards: list[TimeCard] = []
    with serve_directory(root, workdir / "nginx-p3m", profile=WAN) as server:
        requests = item_requests(server.url, 0, items)
        started = time.perf_counter()
        for i, request in enumerate(requests):
            card = TimeCard(i)
            loader((), {"request": request}, card)
            cards.append(card)
            rss.append(process.memory_info().rss)
        elapsed = time.perf_counter() - started
    half = items // 2
    growth = float(np.polyfit(np.arange(half, items), np.asarray(rss[half:], dtype=np.float64), 1)[0])
    item_bytes = _item_bytes(cards)
    cache = loader.reader.caches()[0].stats()
    note = (f"{items} items through {WAN} in {elapsed:.0f} s, clips of GOP 2 fetched 2 ahead at coalesce gap 0; RSS "
            f"{rss[half] / 2**20:.0f} MiB at item {half}, {rss[-1] / 2**20:.0f} MiB at the end; the slope of RSS over "
            f"the second half against the median item's {item_bytes / 1e6:.2f} MB. The cache held at most "
            f"{cache.peak_bytes_held / 1e6:.1f} MB (its budget {setup.byte_budget / 1e6:.1f} MB)")
    return [compare("P3m", f"loader RSS growth per item over a long run through {WAN} / an item's source bytes",
                    Goal("<=", 0.05), Side("RSS growth", "bytes/item", growth, (growth,)),
                    Side("item", "bytes", item_bytes, (item_bytes,)), note)]
