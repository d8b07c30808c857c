"""What a command shows on its terminal of what the project's modules log.

Library modules report through `logging` and never print; each command
(benchmark, analyze, sweep, make-dataset, `python -m episodes`) decides, here, that their records
at INFO and above reach stderr as `prog: message`, the way its own error
sentences read.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

PROJECT_LOGGERS = ("rnb", "models", "episodes")


@contextlib.contextmanager
def terminal_logging(prog: str, loggers: tuple[str, ...] = PROJECT_LOGGERS) -> Iterator[None]:
    """While a command runs, the project's log records at INFO and above go to stderr as `prog: message`.

    The handler writes to the stderr of the moment and is removed afterwards,
    so a command called in-process (tests, benches) leaves nothing behind.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    saved = []
    for name in loggers:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        handler.flush()
        for logger, level in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
