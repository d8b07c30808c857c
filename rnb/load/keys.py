"""A load key: a config's `run` key, a flag of benchmark.py and a LoadSettings field, with its range written once."""
from __future__ import annotations

import argparse
import math
from collections.abc import Collection
from dataclasses import dataclass

import rnb.flags as flags

# The largest count a POSIX semaphore holds (SEM_VALUE_MAX on Linux): the bound of every queue and of the
# closed loop's requests in flight.
MAX_SEMAPHORE_VALUE = 2**31 - 1

Setting = int | float | str | None   # one load setting's value, as a flag, a config and meta.json give it


@dataclass(frozen=True)
class RunKey:
    """One setting of a load mode: a config's `run` key, a flag of benchmark.py, and a LoadSettings field.

    Its range is written once, as the phrase both refusals use: the command
    line's (`command line: --fps: expected a number > 0, found 0`) and the
    config's (`config.json: run.fps: expected a number > 0, found 0`).
    """

    name: str
    spellings: tuple[str, ...]
    metavar: str
    help: str                           # names the key's default as {default}, its choices as {choices} (flag_help)
    integral: bool = False
    minimum: float = 0
    maximum: float | None = None        # the value may reach it (an integer for an integer key)
    above: bool = False                 # the value must exceed `minimum`, not merely reach it
    choices: Collection[str] = ()       # a choice key: one of these strings (read at each use: a registry may grow)
    text: str = ""                      # a text key: what its string names ("a trace file ..."); its mode checks it
    needs: str | None = None            # a key that must be set for this one to mean anything

    @property
    def expected(self) -> str:
        """What the key accepts, as an error sentence says it after `expected`."""
        if self.choices:
            return "one of " + ", ".join(f'"{choice}"' for choice in self.choices)
        if self.text:
            return self.text
        if self.integral:
            return (f"an integer >= {self.minimum:g}" if self.maximum is None
                    else f"an integer from {self.minimum:g} to {int(self.maximum)}")
        if self.maximum is None:
            return f"a number {'>' if self.above else '>='} {self.minimum:g}"
        return (f"a number > {self.minimum:g} and <= {self.maximum:g}" if self.above
                else f"a number from {self.minimum:g} to {self.maximum:g}")

    def accepts(self, value: object) -> bool:
        """Whether a value from JSON or a parsed flag is in this key's range."""
        if self.choices:
            return isinstance(value, str) and value in self.choices
        if self.text:
            return isinstance(value, str) and bool(value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integral and not isinstance(value, int)):
            return False
        return (math.isfinite(value) and value >= self.minimum and not (self.above and value == self.minimum)
                and (self.maximum is None or value <= self.maximum))

    def flag_help(self, default: Setting) -> str:
        """The help of this key's flag: the key's default, and a choice key's choices, filled in where the text
        names them."""
        return self.help.format(default=default, choices=", ".join(self.choices))

    def parse(self, text: str) -> Setting:
        """The argparse type of this key's flag: its value, or ArgumentTypeError in the project's words."""
        if self.choices or self.text:
            value: Setting = text
        elif self.integral:
            value = int(text) if text.strip().lstrip("+-").isdigit() else None
        else:
            try:
                value = float(text)
            except ValueError:
                value = None
        if not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected}, found {flags.shown(text)}")
        return value

