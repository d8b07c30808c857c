"""The loader decoding while the network fetches: rows P3w and P3m of bench/run.py.

P3w puts the R(2+1)D loader reading clips through the network profile
(episodes.testing.network.WAN) next to the same loader reading the same
files from local disk: both fetch the next items' clips while an item
decodes, so where the link carries an item's bytes in less time than the
item takes to decode, the link hides behind decoding and the ratio is 1.
The loader decodes and resizes on one thread, as one of two replicas does
on this two-core host: the HTTP client's own work, nginx's and the link
relay's then run beside it, on the other core, as they would beside a
replica that leaves one. Where no core is free they are paid in the
loader's time: the note prints the CPU per item of this process and its
children on each side, and the ratio they bound P3w to then.

`overlap_rates` is the same comparison for bench/gpu_check.py's
nvdec-overlap line (NVDEC decoding, nginx not needed), and its CPU stand-in.

P3m follows the loader's resident memory over a long remote run: whatever
it kept of each item (bytes fetched ahead and never let go of, decoders,
time cards) would make it grow by a share of an item's bytes per item. The
bound is an item's bytes: a loader that kept every byte it fetched would
grow by 1.0 of them per item; a flat one by 0. The RSS is read once the C
allocator has handed back its free memory; what is left moves by a few MB
between runs as arenas settle (0.02 to 0.09 of an item's bytes per item
over 480 items from local disk, with and without fetching ahead), so the
goal is 0.1, a tenth of what keeping the bytes would cost. This row found
one: reads kept the callbacks that ran when they landed, which referred
back to the reads, and so each item's bytes lived until the garbage
collector's next full pass (0.28 of an item per item; 0.0004 since).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.access_bench import WAN_CLIPS, decoding_ms, item_requests, loader_rate, resolution, waited_ms
from bench.common import Effort, Goal, Row, Side, compare, measure_pair
from bench.floor_bench import torch_threads
from episodes.testing.faults import serve_with_faults
from episodes.testing.network import WAN, slow_link
from episodes.testing.server import serve_directory
from rnb.core.timecard import TimeCard

# Repetitions of P3w under --quick: a pair takes about 2 s, and on a shared host the ratio of one pair moves by a
# quarter either way, so a median needs more pairs than MIN_REPS.
P3W_QUICK_REPS = 9
_LIBC = ctypes.CDLL(ctypes.util.find_library("c")) if ctypes.util.find_library("c") else None


def _item_bytes(cards: list[TimeCard]) -> float:
    return float(np.median([int(card.fields["bytes_fetched"]) + int(card.fields["bytes_reused"]) for card in cards]))


def wan_loader_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P3w: loader items/s through the network profile / the same loader from local disk (module docstring)."""
    count, reps = effort.pick(12, 24), effort.pick(P3W_QUICK_REPS, effort.reps)
    remote: list[TimeCard] = []
    local: list[TimeCard] = []
    cpu: dict[str, list[float]] = {"WAN": [], "local": []}
    starts = iter(range(1000))
    setup = dataclasses.replace(WAN_CLIPS, decode_threads=1)
    with serve_directory(root, workdir / "nginx-p3w", profile=WAN) as server, torch_threads(1):
        row = measure_pair("P3w", f"R(2+1)D loader items/s, clips fetched ahead, GOP 2, one thread: through {WAN} / "
                           "from local disk", Goal(">=", 0.95),
                           ("WAN", "items/s",
                            lambda: loader_rate(server.url, setup, count, next(starts), remote, cpu["WAN"])),
                           ("local disk", "items/s",
                            lambda: loader_rate(str(root), setup, count, next(starts), local, cpu["local"])),
                           reps)
    item_bytes = _item_bytes(remote)
    wan_ms, local_ms = (1000 * float(np.median(cpu[side])) for side in ("WAN", "local"))
    note = (f"{count} items per repetition, 10 clips of 8 frames resized to 112, {resolution(root)}, decoded and "
            f"resized on one thread, 8 fetch threads, coalesce gap 0, 2 items fetched ahead. Per item (median): "
            f"{item_bytes / 1e6:.2f} MB, which the link "
            f"carries in {1000 * item_bytes / WAN.bytes_per_s:.0f} ms, against {decoding_ms(local):.0f} ms decoding "
            f"from local disk; through the link an item waited {waited_ms(remote):.0f} ms for its first bytes "
            f"(local disk: {waited_ms(local):.0f}). CPU per item of this process, nginx and the link's relay: "
            f"{wan_ms:.1f} ms through the link, {local_ms:.1f} ms from local disk; with no core free beside the "
            f"loader the link's side is bound to {local_ms / wan_ms:.2f}")
    return [dataclasses.replace(row, note=note)]


def _trimmed_rss(process: psutil.Process) -> int:
    """This process's RSS once the C allocator has handed back what it holds free (glibc's malloc_trim): what is
    live, not where the allocator's free lists happen to stand after the last item."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return int(process.memory_info().rss)


def rss_rows(root: Path, workdir: Path, effort: Effort) -> list[Row]:
    """P3m: the loader's RSS growth per item over a long remote run / an item's source bytes (module docstring).

    The growth is that between the medians of the run's second and last
    quarters, over the items between them: a median of a quarter steps over
    the RSS of one item's peaks, and the first quarter (allocator arenas,
    caches and decoders warming up) is left out.
    """
    items = effort.pick(240, 480)
    process = psutil.Process()
    setup = dataclasses.replace(WAN_CLIPS, byte_budget=2**23)
    loader = setup.loader(0)
    rss: list[int] = []
    cards: list[TimeCard] = []
    with serve_directory(root, workdir / "nginx-p3m", profile=WAN) as server:
        started = time.perf_counter()
        for i, request in enumerate(item_requests(server.url, 0, items)):
            card = TimeCard(i)
            loader((), {"request": request}, card)
            cards.append(card)
            rss.append(_trimmed_rss(process))
        elapsed = time.perf_counter() - started
    quarter = items // 4
    second, last = float(np.median(rss[quarter : 2 * quarter])), float(np.median(rss[3 * quarter :]))
    growth = (last - second) / (2 * quarter)
    item_bytes = _item_bytes(cards)
    cache = loader.reader.caches()[0].stats()
    note = (f"{items} items through {WAN} in {elapsed:.0f} s, clips of GOP 2 fetched 2 ahead at coalesce gap 0; RSS "
            f"after the allocator's trim, medians {second / 2**20:.1f} MiB over the second quarter and "
            f"{last / 2**20:.1f} MiB over the last, against the median item's {item_bytes / 1e6:.2f} MB. The cache "
            f"held at most {cache.peak_bytes_held / 1e6:.1f} MB (its budget {setup.byte_budget / 1e6:.1f} MB)")
    return [compare("P3m", f"loader RSS growth per item over a long run through {WAN} / an item's source bytes",
                    Goal("<=", 0.1), Side("RSS growth", "bytes/item", growth, (growth,)),
                    Side("item", "bytes", item_bytes, (item_bytes,)), note)]


def overlap_rates(root: str, device: str = "cuda:0", items: int = 12) -> dict[str, Any]:
    """A loader decoding clips on `device`, fetched ahead: items/s through the network profile (the test kit's
    stdlib server behind its relay) and from local disk, what the link allows, and what each item waited.

    `link_items_per_s` is the link's rate over an item's bytes: the WAN side
    reaches the slower of it and the local side's when fetching hides
    behind decoding. `devices` are the items' decode_device values,
    `fetched_ahead` the share of items after each side's first whose
    bytes were fetched ahead of them.
    """
    setup = dataclasses.replace(WAN_CLIPS, device=device, decode_threads=1)
    remote: list[TimeCard] = []
    local: list[TimeCard] = []
    rates: dict[str, list[float]] = {"wan": [], "local": []}
    with serve_with_faults(Path(root), lambda n: None) as url, slow_link(int(url.rsplit(":", 1)[1]), WAN) as port:
        for seed, (side, where, cards) in enumerate([("wan", f"http://127.0.0.1:{port}", remote),
                                                     ("local", root, local)] * 2):
            rates[side].append(loader_rate(where, setup, items, seed, cards))
    every = remote + local
    later = [card for card in every if card.item_id > 0]
    return {"wan_items_per_s": max(rates["wan"]), "local_items_per_s": max(rates["local"]),
            "link_items_per_s": WAN.bytes_per_s / _item_bytes(remote),
            "devices": sorted({str(card.fields["decode_device"]) for card in every}),
            "fetched_ahead": sum("prefetch_wait_start" in card.events for card in later) / len(later),
            "wait_ms": waited_ms(remote), "decode_ms": decoding_ms(local)}
