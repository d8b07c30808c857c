"""The project as `pip install .` leaves it, run from another directory: what a user who installs RnB gets.

A fresh virtual environment is made with the interpreter the running one
was made from, without pip and without system site-packages, and the
project is installed into it as a wheel (`pip install --no-deps
--no-build-isolation --no-index .`, from a copy of the files git tracks,
so the checkout stays clean).  Its dependencies are not installed again
(torch alone is gigabytes, and nothing may be downloaded): one .pth line
adds the running environment's site-packages, after the fresh one's own,
so the fresh environment imports torch and the rest from there.  Only its
directory goes on the path, not its .pth files: the editable install of the
checkout that the running environment holds stays out, and `import rnb`
finds the installed wheel, which the checks below assert.  The commands
run with PYTHONPATH unset, from a directory of their own.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Installed:
    """A fresh environment with the project installed into it."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(self, command: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """One of the environment's commands (`rnb-benchmark`, `python`), with PYTHONPATH unset, in `cwd`."""
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        return subprocess.run([str(self.bin / command), *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)


def tracked_copy(destination: Path) -> Path:
    """The files git tracks in the checkout, copied (links as links) to `destination`: what a clone would hold."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target, follow_symlinks=False)
    return destination


def install(where: Path) -> tuple[Installed, subprocess.CompletedProcess[str]]:
    """A fresh environment at `where`/venv with the project installed from a copy of the checkout at `where`/src."""
    source = tracked_copy(where / "src")
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    root = where / "venv"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    installed = Installed(root)
    purelib = installed.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=where).stdout.strip()
    (Path(purelib) / "running-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # pip comes from the running environment too; --ignore-installed: the editable install it sees there is not ours
    # to remove (pip would refuse anyway, it lies outside this environment).
    done = installed.run("python", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                         "--ignore-installed", "--quiet", ".", cwd=source)
    return installed, done


def check_installed(where: Path, videos: int = 20) -> list[str]:
    """Install the project at `where` and run its command from another directory as a user would: `--check`, then a
    job of `videos` bulk requests on the embedded default config.  What went wrong, one sentence each (none: all well).
    """
    installed, done = install(where)
    if done.returncode:
        return [f"pip install exited {done.returncode}: {done.stderr.strip()[-300:]}"]
    elsewhere = where / "elsewhere"
    elsewhere.mkdir()
    problems = []
    found = installed.run("python", "-c", "import rnb; print(rnb.__file__)", cwd=elsewhere).stdout.strip()
    if not found.startswith(str(installed.root)):
        problems.append(f"rnb was imported from {found or 'nowhere'}, not from the installed environment")
    check = installed.run("rnb-benchmark", "--check", cwd=elsewhere)
    if check.returncode or "<default> is valid" not in check.stdout:
        problems.append(f"rnb-benchmark --check exited {check.returncode}: {(check.stdout + check.stderr).strip()[-300:]}")
    job = installed.run("rnb-benchmark", "-v", str(videos), "-mi", "0", cwd=elsewhere)
    metas = sorted((elsewhere / "logs").glob("*/meta.json"))
    meta = json.loads(metas[0].read_text()) if metas else {}
    if job.returncode or (meta.get("termination_reason"), meta.get("finished_items")) != ("target reached", videos):
        problems.append(f"rnb-benchmark -v {videos} -mi 0 exited {job.returncode} with {meta.get('termination_reason')!r}"
                        f" and {meta.get('finished_items')} items: {job.stderr.strip()[-300:]}")
    return problems
