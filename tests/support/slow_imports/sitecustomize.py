"""Makes the fork server and spawned children slow to import torch, so tests can act while they are starting.

On PYTHONPATH (tests/engines/test_reliability.py puts it there), Python runs this at
start-up.  In multiprocessing's fork server (which imports torch before it
forks any child) or a child spawned afresh (its command line ends with
--multiprocessing-fork), the first import of torch waits
RNB_TEST_IMPORT_DELAY_S seconds, as a loaded machine importing torch from a
slow disk would.
"""
from __future__ import annotations

import os
import sys
import time


class _SlowTorch:
    """A meta-path finder that only delays: it finds nothing, so the real finders import torch afterwards."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torch" and self.delay_s:
            delay, self.delay_s = self.delay_s, 0.0
            time.sleep(delay)
        return None


def _is_a_child_or_the_fork_server() -> bool:
    with open("/proc/self/cmdline", "rb") as own:
        command = own.read()
    return b"--multiprocessing-fork" in command or b"multiprocessing.forkserver" in command


if _is_a_child_or_the_fork_server():
    sys.meta_path.insert(0, _SlowTorch(float(os.environ.get("RNB_TEST_IMPORT_DELAY_S", "0"))))
