"""Bad inputs for the reliability bench: configs broken by hand and by random mutation, and faulty servers.

A config check passes when it ends in one of the defined ways: valid (exit
0) or refused with exactly one sentence on stderr (exit 2), never a
traceback, never a hang.  A remote read passes when it returns exactly the
frames a local read returns, or raises a FetchError: never other frames.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TOY = json.loads((REPO / "config" / "toy.json").read_text())

# Values that pass JSON but not what a key means: wrong types, impossible sizes, boundaries.
ODD_VALUES: tuple[Any, ...] = (None, True, False, -1, 0, 1.5, 1e30, 10**18, "", "0", [], {}, [[]], {"a": 1},
                               2**31, -(2**63), "models.toy.NoSuchModel", [-1, -1])


def hand_made(tmp: Path) -> list[tuple[str, list[str]]]:
    """(what, benchmark.py arguments) of inputs broken on purpose, each one way a user could break one."""
    def toy(change: Callable[[dict], None], name: str) -> str:
        document = copy.deepcopy(TOY)
        change(document)
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(document))
        return str(path)

    fifo = tmp / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    (tmp / "huge.json").write_text(json.dumps(TOY) + " " * (1 << 21))
    (tmp / "deep.json").write_text('{"description": ' + "[" * 50000 + "]" * 50000 + "}")
    (tmp / "bigint.json").write_text(json.dumps(TOY).replace('"clips": 2', '"clips": ' + "7" * 5000))
    (tmp / "inf.json").write_text(json.dumps(TOY).replace('"clips": 2', '"clips": 1e999'))

    def step0(key: str, value: Any) -> Callable[[dict], None]:
        return lambda d: d["pipeline"][0].update({key: value})

    cases = [
        ("a FIFO", [str(fifo)]), ("/dev/zero", ["/dev/zero"]), ("a directory", [str(tmp)]),
        ("a 2 MB file", [str(tmp / "huge.json")]), ("50,000 nested lists", [str(tmp / "deep.json")]),
        ("a 5000-digit integer", [str(tmp / "bigint.json")]), ("1e999", [str(tmp / "inf.json")]),
        ("no such file", [str(tmp / "absent.json")]),
        ("clips true", [toy(step0("clips", True), "bool")]), ("height 1e30", [toy(step0("height", 1e30), "float")]),
        ("frames 1e18 (slots beyond memory)", [toy(step0("frames", 10**18), "huge_slots")]),
        ("a misspelt keyword", [toy(step0("clip", 2), "typo")]),
        ("segments never merged", [toy(step0("num_segments", 2), "segments")]),
        ("selector keywords without a selector",
         [toy(lambda d: d["pipeline"][0]["queue_groups"][0].update(queue_selector_kwargs={"x": 1}), "selkw")]),
        ("an unknown source key", [toy(lambda d: d.update(source={"synthetic": True, "seed": 1}), "source")]),
        ("concurrency 2**31", [toy(lambda d: d.update(run={"concurrency": 2**31}), "concurrency")]),
        ("a final step cut 4..2", [toy(lambda d: d["pipeline"].__setitem__(1, {
            "model": "models.r2p1d.R2P1DRunner", "queue_groups": [{"gpus": [-1], "in_queue": 0}],
            "start_index": 4, "end_index": 2}), "cut")]),
        ("an in_queue nobody writes",
         [toy(lambda d: d["pipeline"][1]["queue_groups"][0].update(in_queue=3), "in_queue")]),
        ("a GPU index -2", [toy(lambda d: d["pipeline"][0]["queue_groups"][0].update(gpus=[-2]), "gpu")]),
    ]
    return [(what, ["-c", path]) for what, (path,) in cases]


def load_inputs(tmp: Path) -> list[tuple[str, list[str]]]:
    """(what, benchmark.py arguments) of load-mode values a job could never finish with, or whose refusal once named the
    wrong row or value: each must be refused in one sentence (rnb.load, rnb.load_inputs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def trace(name: str, text: bytes) -> str:
        path = tmp / name
        path.write_bytes(text)
        return str(path)

    pq.write_table(pa.table({"offset_s": ["0.0", "1.0"]}), tmp / "strings.parquet")
    toy = str(REPO / "config" / "toy.json")
    cases = [
        ("a trace row at 1e12 s", ["--arrivals", trace("far.csv", b"offset_s\n0\n1e12\n")]),
        ("'abc' in a trace's row 3", ["--arrivals", trace("abc.csv", b"offset_s\n0\n1\nabc\n")]),
        ("NaN in a trace", ["--arrivals", trace("nan.csv", b"offset_s\n0\nnan\n")]),
        ("a Parquet trace of strings", ["--arrivals", str(tmp / "strings.parquet")]),
        ("a binary file as a trace", ["--arrivals", trace("garbage.csv", bytes(range(256)) * 4)]),
        ("control bytes in a trace", ["--arrivals", trace("control.csv", b"offset_s\n0\x1b[2J\x07\n")]),
        ("a bad stream cell", ["--arrivals", trace("stream.csv", b"offset_s,stream\n0,0\n1,x\n")]),
        ("a blank trace row", ["--arrivals", trace("blank.csv", b"offset_s\n0\n\n1\n")]),
        ("--fps 1e-300", ["--streams", "2", "--fps", "1e-300"]),
        ("--fps 5e-324", ["--streams", "2", "--fps", "5e-324"]),
        ("--streams 1000000000", ["--streams", "1000000000"]),
        ("--streams 10**20", ["--streams", str(10**20)]),
        ("-mi 1e12", ["-mi", "1e12"]),
        ("--deadline-ms 1e12", ["--streams", "2", "--deadline-ms", "1e12"]),
        ("--rate-schedule -5@10s", ["--rate-schedule", "-5@10s"]),
        ("--rate-schedule 1e-9@10s", ["--rate-schedule", "1e-9@10s"]),
        ("--rate-schedule 5@1e6s", ["--rate-schedule", "5@1e6s"]),
        ("--min-duration-ms 1e12", ["--scenario", "server", "--min-duration-ms", "1e12"]),
    ]
    return [(what, ["-c", toy, "-v", "2", *argv]) for what, argv in cases]


def mutants(configs: list[Path], count: int, seed: int) -> list[tuple[str, str]]:
    """(what, JSON text) of `count` random mutations of the shipped configs: values, keys, and raw text."""
    rng = random.Random(seed)
    made = []
    for n in range(count):
        source = rng.choice(configs)
        text = source.read_text()
        kind = rng.choice(("value", "value", "delete", "add", "text"))
        if kind == "text":
            at = rng.randrange(len(text))
            text = rng.choice((text[:at], text[:at] + rng.choice("{}[],:\"0e-") + text[at + 1:]))
            made.append((f"{source.name}: text cut or changed at character {at}", text))
            continue
        document = json.loads(text)
        path, parent, key = _random_place(document, rng)
        if kind == "delete":
            del parent[key]
        elif kind == "add":
            (parent if isinstance(parent, dict) else document)[f"extra_{n}"] = rng.choice(ODD_VALUES)
        else:
            parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        made.append((f"{source.name}: {kind} at {path}", json.dumps(document)))
    return made


def _random_place(document: Any, rng: random.Random) -> tuple[str, Any, Any]:
    """A random (path, container, key) inside the document."""
    places = []
    stack = [("", document)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            places.append((f"{path}/{key}", node, key))
            stack.append((f"{path}/{key}", child))
    return rng.choice(places)


def check_config(argv: list[str]) -> tuple[bool, float, str]:
    """Run `benchmark.py --check ARGV` in this process: (ended a defined way, seconds, what it said)."""
    from rnb import cli

    err = io.StringIO()
    began = time.perf_counter()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main([*argv, "--check", "--cpu"])
    except BaseException as error:  # what a user would have seen as a traceback
        return False, time.perf_counter() - began, f"{type(error).__name__}: {error}"
    said = err.getvalue()
    one_sentence = said.count("\n") == 1 and "Traceback" not in said and said.strip().isprintable()
    return code == 0 or (code == 2 and one_sentence), time.perf_counter() - began, said.strip()[:200]


def remote_trial(root: Path, reference: dict[int, Any], key: str, probability: float, seed: int,
                 cache_dir: Path) -> tuple[bool, float, str]:
    """Read frames 0 and 1 of every episode through a server that misbehaves on `probability` of range requests.

    Passes when each read returns the reference frames or raises a FetchError naming the server's fault.
    """
    import torch

    from episodes import EpisodeByteCache, FetchError, FrameRequest, open_dataset
    from episodes.testing.faults import FAULTS, serve_with_faults

    rng = random.Random(seed)
    faults = [rng.choice(FAULTS) if rng.random() < probability else None for _ in range(10_000)]
    outcomes = []
    began = time.perf_counter()
    with serve_with_faults(root, lambda n: faults[n % len(faults)]) as url:
        try:
            with EpisodeByteCache(open_dataset(url, backoff_s=0.01, timeout_s=5.0), cache_dir=cache_dir) as cache:
                for ep, expected in reference.items():
                    try:
                        got = cache.read_frames([FrameRequest(ep, key, frame_numbers=[0, 1])])[0].frames
                    except FetchError:
                        outcomes.append("refused")
                        continue
                    if not torch.equal(got, expected):
                        return False, time.perf_counter() - began, f"episode {ep}: other frames than the local read"
                    outcomes.append("exact")
        except FetchError:
            outcomes.append("refused at open")
        except Exception as error:  # anything else is a failure of the fault handling itself
            return False, time.perf_counter() - began, f"{type(error).__name__}: {error}"
    return True, time.perf_counter() - began, ", ".join(sorted(set(outcomes)))
