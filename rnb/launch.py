"""`python benchmark.py` and `rnb-benchmark`: the job's fork server starts before the command imports torch.

A local job forks its children from a fork server that imports torch and
whatever else they need first (rnb.engines.local.lifeline).  Started
first, the server imports them on the second core while this process
imports its own, instead of after it: on an idle two-core host a job
starts 2 to 3 s sooner, which a sweep or a tuner gains on every job.
Whether the command will start children here is guessed from its
arguments before they are parsed (parsing them needs the heavy imports),
and what the server should import from the config's JSON as read here
(`early_preload`); a wrong guess costs only the server's imports, 2 to 4 s
of CPU: a job that the config sends to Ray, or a config that fails its
checks, leaves an idle server that is stopped at exit.

This module imports no more than the standard library, rnb.engines.stopping,
rnb.engines.registry, rnb.flags and the config's default path (then
lifeline), so that Ctrl-C and SIGTERM are the command's from its first act
(a stop before the job's log exists: exit 130 or 143 and one line, nothing
written), and the guess and the start come before anything slow.
"""
from __future__ import annotations

import gc
import json
import sys
from collections.abc import Sequence

from rnb.engines import stopping
from rnb.engines.registry import DEFAULT_ENGINE, ENGINES
from rnb.flags import CONFIG
from rnb.pipeline import DEFAULT_CONFIG_PATH

NO_CHILDREN_FLAGS = frozenset({"-h", "--help", "--check"})


def starts_local_children(argv: Sequence[str]) -> bool:
    """Whether these arguments ask for a job that forks children here: not help, not `--check`, and --engine (else
    the default engine) one whose job does (rnb.engines.registry); a name no engine has is the command's error."""
    if NO_CHILDREN_FLAGS.intersection(argv):
        return False
    name = DEFAULT_ENGINE
    for flag, value in zip(argv, [*argv[1:], ""]):   # the last --engine wins, as argparse has it
        if flag == "--engine":
            name = value
        elif flag.startswith("--engine="):
            name = flag.removeprefix("--engine=")
    engine = ENGINES.get(name)
    return engine is None or engine.forks_here


def config_document(argv: Sequence[str]) -> object:
    """The JSON of the config these arguments name (the last -c/--config, else the embedded default), read before
    they are parsed; None where it cannot be read, which the command will say once it parses them."""
    path = str(DEFAULT_CONFIG_PATH)
    for flag, value in zip(argv, [*argv[1:], ""]):
        if flag in CONFIG:
            path = value
        elif flag.startswith(tuple(f"{long}=" for long in CONFIG[1:])):
            path = flag.partition("=")[2]
        elif flag.startswith(CONFIG[0]) and not flag.startswith("--") and len(flag) > len(CONFIG[0]):
            path = flag[len(CONFIG[0]):]   # -cFILE, as argparse takes a short flag's value
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def main() -> int:
    try:
        stopping.install()
        # Imported only now, as the command: a stop while they import is already the command's.
        from rnb.engines.local.lifeline import early_preload, start_fork_server

        if starts_local_children(sys.argv[1:]):
            start_fork_server(early_preload(config_document(sys.argv[1:])))
        from rnb.cli import main as run_command

        code = run_command()
    except stopping.Stopped as stopped:
        print(f"benchmark.py: {stopped}", file=sys.stderr)
        code = stopped.stop.exit_code
    # Everything is written: the interpreter's last garbage collection walks every object torch, torchvision and
    # torchcodec made (0.6 to 1.1 s of CPU here), which would only hold the command (and a stopped one past its bound
    # of 3 s) before its exit.
    gc.freeze()
    return code
