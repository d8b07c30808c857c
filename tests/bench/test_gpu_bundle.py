"""bench/gpu_bundle.py: FFmpeg's bundled libraries become reachable under the sonames torchcodec asks for."""
from __future__ import annotations

import os
import sys

from bench.gpu_bundle import libpython_directory, link_sonames

# as PyAV 16.1.0's wheel names them (FFmpeg 8.0), with two of the libraries they need
BUNDLED = ("libavcodec-e57b519c.so.62.11.100", "libavdevice-dacd4dca.so.62.1.100", "libavfilter-1599fcba.so.11.4.100",
           "libavformat-1a3c09f7.so.62.3.100", "libavutil-9a1620aa.so.60.8.100", "libswresample-14658403.so.6.1.100",
           "libswscale-6b69be0e.so.9.1.100", "libx265-3fd9b07c.so.215", "libdrm-b0291a67.so.2.4.0")


def test_each_ffmpeg_library_gets_its_soname_and_nothing_else_does(tmp_path):
    bundled = tmp_path / "av.libs"
    bundled.mkdir()
    for name in BUNDLED:
        (bundled / name).write_bytes(name.encode())
    made = link_sonames(bundled, tmp_path / "lib")
    # exactly what torchcodec's libtorchcodec_core8.so lists as NEEDED
    assert made == ["libavcodec.so.62", "libavdevice.so.62", "libavfilter.so.11", "libavformat.so.62",
                    "libavutil.so.60", "libswresample.so.6", "libswscale.so.9"]
    assert sorted(os.listdir(tmp_path / "lib")) == sorted(made)
    assert (tmp_path / "lib" / "libavcodec.so.62").read_bytes() == b"libavcodec-e57b519c.so.62.11.100"
    assert os.readlink(tmp_path / "lib" / "libavutil.so.60") == "../av.libs/libavutil-9a1620aa.so.60.8.100"
    assert link_sonames(bundled, tmp_path / "lib") == made  # a second install replaces the links


def test_libpython_is_pointed_at_where_the_loader_cannot_find_it(tmp_path):
    soname = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    empty, holding = tmp_path / "empty", tmp_path / "lib"
    empty.mkdir()
    holding.mkdir()
    (holding / soname).write_bytes(b"")
    assert libpython_directory((str(empty), str(holding))) == (
        str(holding), f"{soname}: not on the dynamic loader's path; LD_LIBRARY_PATH now includes {holding}")
    assert libpython_directory((str(empty),)) == (
        "", f"{soname}: found neither by the dynamic loader nor in {empty}; torchcodec's custom ops will fail to load, "
            "and with them every check that decodes or makes a dataset")
