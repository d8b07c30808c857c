"""The flags the commands share, and the one way every command refuses a bad one.

benchmark.py, sweep.py and rnb-tune accept RnB's own flags by the same
spellings: the original's short flags (`-c`, `-mi`, `-v`, `-b`, `-qs`) and
long names, and the dashed twins of those names.  A bad value, whether
argparse or the command found it, is one sentence in the style of a config
error, `command line: -v/--videos: expected an integer >= 1, found 0`, and
exit 2.
"""
from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from collections.abc import Callable, Collection, Sequence
from typing import NoReturn

CONFIG = ("-c", "--config_file_path", "--config", "--config-file-path")
MEAN_INTERVAL = ("-mi", "--mean_interval_ms", "--mean-interval-ms")
VIDEOS = ("-v", "--videos")
BATCH = ("-b", "--batch_size", "--batch-size")
QUEUE_SIZE = ("-qs", "--queue_size", "--queue-size")
QUIET = ("-q", "--quiet")
# The run keys' flags without a short form (their ranges and help: rnb.pipeline.run_keys).
WARMUP, SEED, STALL, MAX_DURATION, ENGINE = ("--warmup",), ("--seed",), ("--stall-s",), ("--max-duration",), ("--engine",)
WHERE = "command line"   # where a flag's error is, as a config error names its file
# Every spelling benchmark.py takes besides its load modes' (rnb.load), so that sweep.py, which passes the flags
# it does not know on to benchmark.py, can refuse one that neither knows; tests/analysis/test_sweep.py holds the two
# commands to each other.
BENCHMARK: tuple[str, ...] = (
    *CONFIG, *VIDEOS, *BATCH, *QUEUE_SIZE, *QUIET, *WARMUP, *SEED, *STALL, *MAX_DURATION, *ENGINE, "--check", "--cpu",
    "--log-dir", "--sample-interval-ms", "--dataset", "--allow-busy-gpus", "--max-replicas", "--ray-address", "-h",
    "--help")


def flag_name(spellings: tuple[str, ...]) -> str:
    """How an error names a flag: its short and its first long spelling, e.g. `-mi/--mean_interval_ms`."""
    return "/".join(spellings[:2])


def shown(text: str) -> str:
    """A flag's text as a refusal quotes it: a number as written, anything else in quotes."""
    return text if _is_number(text) else repr(text)


def _is_number(text: str) -> bool:
    """Whether a token is a number (a negative value such as `-1` is not a flag)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum], refused in the config's words."""
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, found {shown(text)}")
        return value
    return convert


def number(minimum: float, above: bool = False, below: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number >= minimum (> with `above`) and < `below` if given."""
    bounds = f"{'>' if above else '>='} {minimum:g}" + (f" and < {below:g}" if below is not None else "")

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if (not math.isfinite(value) or value < minimum or (above and value == minimum)
                or (below is not None and value >= below)):
            raise argparse.ArgumentTypeError(f"expected a number {bounds}, found {shown(text)}")
        return value
    return convert


def integers(minimum: int) -> Callable[[str], list[int]]:
    """An argparse type: comma-separated integers, each >= minimum (e.g. `1,2,4`)."""
    def convert(text: str) -> list[int]:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts or not all(re.fullmatch(r"[+-]?\d+", part) and int(part) >= minimum for part in parts):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {minimum}, found {text!r}")
        return [int(part) for part in parts]
    return convert


def numbers(minimum: float) -> Callable[[str], list[float]]:
    """An argparse type: comma-separated finite numbers, each >= minimum (e.g. `0,1,2.5`)."""
    one = number(minimum)

    def convert(text: str) -> list[float]:
        try:
            values = [one(part) for part in text.split(",") if part.strip()]
        except argparse.ArgumentTypeError:
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= {minimum:g}, found {text!r}")
        return values
    return convert


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose every refusal is one `command line: ...` sentence and exit 2, never a usage dump."""

    def __init__(self, prog: str, description: str, epilog: str | None = None) -> None:
        super().__init__(prog=prog, description=description, epilog=epilog, allow_abbrev=False,
                         formatter_class=argparse.RawDescriptionHelpFormatter)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """argparse's parse, where a value that starts with a minus and a digit is the value of the flag before it.

        argparse takes `-5` after a flag for a negative number, but `-5@10s`
        (a rate schedule) for an unknown flag, and the flag before it then
        has "no value": the value is given to the flag, whose own check
        then says what is wrong with it.
        """
        given = list(sys.argv[1:] if args is None else args)
        takes_one = {s for action in self._actions if action.nargs is None for s in action.option_strings}
        joined: list[str] = []
        for token in given:
            if joined and joined[-1] in takes_one and re.match(r"-[\d.]", token):
                token = f"{joined.pop()}={token}"
            joined.append(token)
        return super().parse_known_args(joined, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{WHERE}: {self.sentence(message)}\n")

    def parse_passing_on(self, argv: Sequence[str] | None, known: Collection[str],
                         to: str) -> tuple[argparse.Namespace, list[str]]:
        """This command's flags, and the rest to pass on to the command `to`, whose flags are `known`; a flag that
        neither command knows is refused here, with the closest flag of either as the hint."""
        args, extra = self.parse_known_args(argv)
        for token in extra:
            name = token.split("=")[0]
            if name.startswith("-") and name not in known and not _is_number(name):
                own = [spelling for action in self._actions for spelling in action.option_strings]
                close = difflib.get_close_matches(name, [*own, *known], n=1)
                hint = f" (did you mean {close[0]}?)" if close else f" (see {self.prog} --help and {to} --help)"
                self.exit(2, f"{WHERE}: {name}: expected a flag of {self.prog} or of {to}, which {self.prog} passes "
                             f"on, found an unknown one{hint}\n")
        return args, extra

    def refuse(self, spellings: tuple[str, ...] | str, expected: str) -> NoReturn:
        """Refuse one flag's value found bad after parsing: `command line: FLAG: expected ..., found ...`."""
        name = spellings if isinstance(spellings, str) else flag_name(spellings)
        self.exit(2, f"{WHERE}: {name}: {expected}\n")

    def sentence(self, message: str) -> str:
        """argparse's message in the project's words: each flag by its short name, the fault as expected/found."""
        for action in self._actions:
            if len(action.option_strings) > 2:
                message = message.replace("/".join(action.option_strings), "/".join(action.option_strings[:2]))
        argument = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
        if argument is None:
            return self._general(message)
        flag, fault = argument.groups()
        choice = re.fullmatch(r"invalid choice: (.*) \(choose from (.*)\)", fault)
        if choice is not None:
            return f"{flag}: expected one of {choice.group(2)}, found {choice.group(1)}"
        if fault.startswith("expected one argument"):
            return f"{flag}: expected a value, found none"
        return f"{flag}: {fault}"

    def _general(self, message: str) -> str:
        required = re.fullmatch(r"the following arguments are required: (.*)", message, re.DOTALL)
        if required is not None:
            names = required.group(1)
            what = ("values", "them") if ", " in names else ("a value", "it")
            return f"{names}: expected {what[0]} ({self.prog} requires {what[1]}), found none"
        unknown = re.fullmatch(r"unrecognized arguments: (\S+).*", message, re.DOTALL)
        if unknown is None:
            return message
        token = unknown.group(1)
        known = [s for action in self._actions for s in action.option_strings]
        close = difflib.get_close_matches(token.split("=")[0], known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (see {self.prog} --help)"
        return f"{token}: expected a flag of {self.prog}, found an unknown one{hint}"
