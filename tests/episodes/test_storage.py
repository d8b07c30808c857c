"""Storage: exact byte ranges, retries on transient errors only, one FetchError naming the URL."""
from __future__ import annotations

import asyncio
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodes._errors import DatasetFormatError, FetchError
from episodes._http import run_on_loop
from episodes._storage import FileInfo, Storage, coalesce_ranges, relative_path
from episodes.testing.server import serve_directory

PAYLOAD = bytes(range(256)) * 40  # 10240 bytes, every offset identifiable


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "sub" / "blob.bin").write_bytes(PAYLOAD)
    return tmp_path / "data"


def counting(storage: Storage, monkeypatch: pytest.MonkeyPatch, failures: list[BaseException]) -> list[tuple]:
    """Make the next cat_file calls raise `failures` in turn, then succeed; return the call log."""
    calls: list[tuple] = []
    real = storage.fs.cat_file

    def cat_file(path, start=None, end=None, **kw):
        calls.append((path, start, end))
        if failures:
            raise failures.pop(0)
        return real(path, start=start, end=end, **kw)

    monkeypatch.setattr(storage.fs, "cat_file", cat_file)
    return calls


def test_read_range_returns_exactly_the_bytes(root: Path) -> None:
    st = Storage(str(root))
    assert st.read_range("sub/blob.bin", 0, 10) == PAYLOAD[:10]
    assert st.read_range("sub/blob.bin", 1000, 3333) == PAYLOAD[1000:3333]
    assert st.read_range("sub/blob.bin", 5, 5) == b""
    assert st.read_bytes("sub/blob.bin") == PAYLOAD


def test_short_read_is_a_fetch_error(root: Path) -> None:
    st = Storage(str(root))
    with pytest.raises(FetchError, match=r"blob\.bin: read of bytes \[10000, 10300\) returned 240 bytes, expected 300"):
        st.read_range("sub/blob.bin", 10000, 10300)


def test_read_ranges_coalesces_close_ranges(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root))
    calls = counting(st, monkeypatch, [])
    ranges = [(5000, 5100), (0, 10), (20, 40), (9000, 9100)]
    got = st.read_ranges("sub/blob.bin", ranges, coalesce_gap=100)
    assert got == [PAYLOAD[s:e] for s, e in ranges]
    assert [(c[1], c[2]) for c in calls] == [(0, 40), (5000, 5100), (9000, 9100)]


def test_coalesce_ranges_merges_overlaps_and_gaps_up_to_the_limit() -> None:
    ranges = [(300, 400), (0, 100), (50, 120), (150, 200), (401, 402), (1000, 1000)]
    assert coalesce_ranges(ranges, 0) == [(0, 120), (150, 200), (300, 400), (401, 402), (1000, 1000)]
    assert coalesce_ranges(ranges, 30) == [(0, 200), (300, 402), (1000, 1000)]
    assert coalesce_ranges(ranges, 10**6) == [(0, 1000)]
    assert coalesce_ranges([], 5) == []
    with pytest.raises(ValueError, match=r"bad byte range \[9, 3\)"):
        coalesce_ranges([(9, 3)], 0)
    with pytest.raises(ValueError, match="gap must be >= 0 bytes, not -1"):
        coalesce_ranges([(0, 1)], -1)


def test_read_ranges_runs_merged_requests_on_an_executor(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root))
    calls = counting(st, monkeypatch, [])
    ranges = [(9000, 9100), (0, 10), (5, 30), (5000, 5100)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        got = st.read_ranges("sub/blob.bin", ranges, coalesce_gap=0, executor=pool)
    assert got == [PAYLOAD[s:e] for s, e in ranges]
    assert sorted((c[1], c[2]) for c in calls) == [(0, 30), (5000, 5100), (9000, 9100)]


def test_missing_file_fails_at_once_naming_it(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root), backoff_s=0)
    calls = counting(st, monkeypatch, [])
    with pytest.raises(FetchError, match=r"sub/none\.bin: file not found$"):
        st.read_range("sub/none.bin", 0, 4)
    assert len(calls) == 1


def test_transient_errors_are_retried_then_succeed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root), retries=3, backoff_s=0)
    calls = counting(st, monkeypatch, [ConnectionResetError("reset"), TimeoutError()])
    assert st.read_range("sub/blob.bin", 3, 9) == PAYLOAD[3:9]
    assert len(calls) == 3


def test_transient_errors_give_up_after_the_retries(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root), retries=2, backoff_s=0)
    calls = counting(st, monkeypatch, [TimeoutError()] * 5)
    with pytest.raises(FetchError, match=r"blob\.bin: read of bytes \[0, 4\) failed after 3 attempts \(no complete answer "
                                         r"within the timeout of 30 s\)$"):
        st.read_range("sub/blob.bin", 0, 4)
    assert len(calls) == 3


def test_permanent_errors_are_not_retried(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Storage(str(root), retries=3, backoff_s=0)
    calls = counting(st, monkeypatch, [PermissionError("denied")])
    with pytest.raises(FetchError, match=r"blob\.bin: read of bytes \[0, 4\) failed \(PermissionError: denied\)"):
        st.read_range("sub/blob.bin", 0, 4)
    assert len(calls) == 1


@pytest.mark.parametrize("bad", ["../secret", "sub/../../x", "/etc/passwd", "http://evil/x", "", "."])
def test_paths_outside_the_root_are_refused(root: Path, bad: str) -> None:
    with pytest.raises(DatasetFormatError, match="path"):
        Storage(str(root)).read_bytes(bad)
    with pytest.raises(DatasetFormatError):
        relative_path(bad)


def test_relative_path_normalises_inside_paths() -> None:
    assert relative_path("a/./b/../c.mp4") == "a/c.mp4"


def test_info_gives_size_and_mtime_locally(root: Path) -> None:
    info = Storage(str(root)).info("sub/blob.bin")
    mtime = (root / "sub" / "blob.bin").stat().st_mtime
    assert info == FileInfo(size=len(PAYLOAD), version=str(mtime))


def test_glob_lists_paths_relative_to_the_root(root: Path) -> None:
    (root / "sub" / "other.bin").write_bytes(b"x")
    assert Storage(str(root)).glob("sub/*.bin") == ["sub/blob.bin", "sub/other.bin"]


def test_storage_survives_pickling(root: Path) -> None:
    st = pickle.loads(pickle.dumps(Storage(str(root), retries=1)))
    assert st.retries == 1
    assert st.read_range("sub/blob.bin", 7, 17) == PAYLOAD[7:17]


@pytest.mark.nginx
def test_http_range_info_missing(root: Path, tmp_path: Path) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        st = Storage(server.url, backoff_s=0)
        assert st.read_range("sub/blob.bin", 4000, 4096) == PAYLOAD[4000:4096]
        info = st.info("sub/blob.bin")
        assert info.size == len(PAYLOAD) and info.version and info.version.startswith('"')
        with pytest.raises(FetchError, match=rf"^{server.url}/sub/none\.bin: file not found$"):
            st.read_range("sub/none.bin", 0, 4)
        assert server.requests("/sub/none.bin") == 1


@pytest.mark.nginx
def test_http_503_is_retried_then_named(root: Path, tmp_path: Path) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        st = Storage(server.url + "/fault503", retries=2, backoff_s=0.01)
        url = f"{server.url}/fault503/sub/blob.bin"
        with pytest.raises(FetchError, match=rf"^{url}: read of bytes \[0, 8\) failed after 3 attempts \(HTTP 503"):
            st.read_range("sub/blob.bin", 0, 8)
        assert server.requests("GET /fault503/sub/blob.bin") == 3


@pytest.mark.nginx
def test_http_timeout_is_a_fetch_error(root: Path, tmp_path: Path) -> None:
    with serve_directory(root, tmp_path / "nginx") as server:
        st = Storage(server.url + "/slow", retries=1, backoff_s=0, timeout_s=0.5)
        url = f"{server.url}/slow/sub/blob.bin"
        with pytest.raises(FetchError, match=rf"^{url}: read of bytes \[0, 5000\) failed after 2 attempts \(no complete "
                                             r"answer within the timeout of 0.5 s\)$"):
            st.read_range("sub/blob.bin", 0, 5000)


def test_open_parquet_fetches_only_footer_and_asked_row_groups(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = pa.table({"index": np.arange(200_000), "value": np.arange(200_000) * 0.5})
    pq.write_table(table, root / "rows.parquet", row_group_size=20_000, compression="none")
    st = Storage(str(root))
    calls = counting(st, monkeypatch, [])
    pf = st.open_parquet("rows.parquet")
    assert pf.read_row_groups([3], columns=["value"]).equals(table.slice(60_000, 20_000).select(["value"]))
    fetched = sum(end - start for _, start, end in calls)
    assert fetched < (root / "rows.parquet").stat().st_size / 5


def test_exists(root: Path) -> None:
    st = Storage(str(root))
    assert st.exists("sub/blob.bin") and not st.exists("sub/none.bin")


def test_coroutines_handed_to_a_loop_at_once_settle_their_own_futures_and_a_cancelled_one_its_task() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        gate = threading.Event()
        stopped: list[str] = []

        async def value(x: int) -> int:
            return x * 2

        async def failing() -> int:
            raise ValueError("no answer")

        async def held() -> int:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                stopped.append("held")
                gate.set()
                raise
            return 0

        first, second, bad, waiting = run_on_loop(loop, [value(1), value(2), failing(), held()])
        assert (first.result(5), second.result(5)) == (2, 4)
        with pytest.raises(ValueError, match="^no answer$"):
            bad.result(5)
        assert waiting.cancel() and gate.wait(5) and stopped == ["held"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
