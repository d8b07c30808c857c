"""What bench/gpu_check.py brings to a GPU machine that has its own torch, no FFmpeg and no internet.

The lent machine's image holds Python 3.12, torch 2.11.0+cu130 (CUDA 13),
torchvision, pyarrow, fsspec, tqdm and pytest, but neither torchcodec,
FFmpeg's shared libraries nor py3nvml. Three wheels close the gap, 42 MiB
together, under the 64 MiB the device tool carries with the working tree:

- torchcodec 0.15.0 from PyPI (3 MB): its Linux wheel is the CUDA 13 build
  (libcudart.so.13, libnvrtc.so.13, both loaded by torch+cu130 already) and
  it calls torch only through torch's stable C ABI (the 78 `aoti_torch_*` /
  `torch_*` functions of 0.14, whose README gives torch >= 2.11), so it loads
  on torch 2.11. Its default CUDA backend drives NVDEC through the driver's
  libnvcuvid itself; FFmpeg only demuxes, so FFmpeg needs no NVDEC support.
- PyAV 16.1.0 (41 MB), used only for FFmpeg 8.0's shared libraries bundled
  in it (`av.libs/`: libavcodec.so.62 and the libraries it needs, x264
  among them for the synthetic datasets). torchcodec finds them through
  LD_LIBRARY_PATH and symbolic links under their sonames.
- py3nvml 0.2.7 and xmltodict (70 kB) for the GPU checks (rnb.pipeline.gpus).

`prepare` downloads them here; `install` unpacks them there and returns the
environment a process needs, which must be set before it starts (the dynamic
loader reads LD_LIBRARY_PATH once).

torchcodec's cp312 custom-ops library needs libpython3.12.so.1.0 and has no
RPATH to find it; a Python 3.12 built without a shared libpython beside it
(as Ubuntu 24.04's is, without python3-dev) fails the import. `install`
points the loader at the running interpreter's library where the loader
cannot find it on its own, and says what it found.
"""
from __future__ import annotations

import ctypes.util
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

WHEELS = ("torchcodec==0.15.0", "av==16.1.0", "py3nvml==0.2.7", "xmltodict==1.0.4")
PLATFORM = ("--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64")
CARRY_LIMIT_BYTES = 64 * 2**20
FFMPEG_LIBRARIES = ("avutil", "avcodec", "avformat", "avdevice", "avfilter", "swscale", "swresample")
DRIVER_LIBRARIES = "/usr/local/nvidia/lib64"  # libnvcuvid (NVDEC) on the lent machines
_BUNDLED = re.compile(r"lib(?P<name>[a-z0-9]+)-[0-9a-f]{8}\.so\.(?P<major>\d+)(\.\d+)*$")


def prepare(wheel_dir: Path) -> int:
    """Download the wheels (here, where PyPI is reachable); their total size in bytes."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *PLATFORM,
                    "-d", str(wheel_dir), *WHEELS], check=True)
    total = sum(path.stat().st_size for path in wheel_dir.glob("*.whl"))
    if total > CARRY_LIMIT_BYTES:
        raise RuntimeError(f"{wheel_dir} holds {total / 2**20:.1f} MiB of wheels, more than the device tool "
                           f"carries ({CARRY_LIMIT_BYTES / 2**20:.0f} MiB with the working tree)")
    return total


def install(wheel_dir: Path, target: Path) -> tuple[dict[str, str], str]:
    """Unpack the Python wheels into `target/site` and FFmpeg's libraries into `target/ffmpeg`.

    Returns the variables to add to a new process's environment, and a sentence for the log on libpython.
    """
    site, ffmpeg = target / "site", target / "ffmpeg"
    python_wheels = [str(path) for path in sorted(wheel_dir.glob("*.whl")) if not path.name.startswith("av-")]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *python_wheels], check=True)
    (av_wheel,) = wheel_dir.glob("av-*.whl")
    with zipfile.ZipFile(av_wheel) as archive:
        archive.extractall(ffmpeg, [name for name in archive.namelist() if name.startswith("av.libs/")])
    links = link_sonames(ffmpeg / "av.libs", ffmpeg / "lib")
    missing = sorted(set(FFMPEG_LIBRARIES) - {name.split(".so")[0][3:] for name in links})
    if missing:
        raise RuntimeError(f"{av_wheel.name} lacks FFmpeg's {', '.join(missing)}")
    libpython, said = libpython_directory()
    paths = [str(ffmpeg / "lib"), str(ffmpeg / "av.libs"), DRIVER_LIBRARIES, libpython,
             os.environ.get("LD_LIBRARY_PATH", "")]
    return ({"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.getcwd(), os.environ.get("PYTHONPATH")])),
             "LD_LIBRARY_PATH": os.pathsep.join(filter(None, paths))}, said)


def libpython_directory(candidates: tuple[str, ...] | None = None) -> tuple[str, str]:
    """The folder to add to LD_LIBRARY_PATH for this interpreter's libpython ("" if none is needed or found), and why.

    By default the candidates are the running interpreter's LIBDIR and its base prefix's lib/.
    """
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    soname = f"lib{name}.so.1.0"
    if candidates is None and ctypes.util.find_library(name):
        return "", f"{soname}: the dynamic loader finds it"
    if candidates is None:
        candidates = tuple(filter(None, (sysconfig.get_config_var("LIBDIR"), os.path.join(sys.base_prefix, "lib"))))
    for folder in candidates:
        if (Path(folder) / soname).exists():
            return folder, f"{soname}: not on the dynamic loader's path; LD_LIBRARY_PATH now includes {folder}"
    return "", (f"{soname}: found neither by the dynamic loader nor in {', '.join(candidates)}; torchcodec's "
                "custom ops will fail to load, and with them every check that decodes or makes a dataset")


def link_sonames(bundled: Path, links: Path) -> list[str]:
    """Symbolic links such as libavcodec.so.62 -> libavcodec-e57b519c.so.62.11.100, for FFmpeg's libraries.

    A wheel's bundled libraries carry a hash in their names; torchcodec's libraries ask for the plain
    sonames. The libraries they need in turn keep their hashed names and are found beside them.
    """
    links.mkdir(parents=True, exist_ok=True)
    made = []
    for path in sorted(bundled.iterdir()):
        match = _BUNDLED.match(path.name)
        if match and match["name"] in FFMPEG_LIBRARIES:
            link = links / f"lib{match['name']}.so.{match['major']}"
            link.unlink(missing_ok=True)
            link.symlink_to(os.path.relpath(path, links))
            made.append(link.name)
    return made
