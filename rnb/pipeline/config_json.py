"""A config file read as JSON, refusing what json would accept silently or choke on.

Not a regular file (a FIFO would hang the harness, /dev/zero never end), too
large, not UTF-8, duplicate keys (json keeps the last), NaN and Infinity,
integers longer than any count, numbers beyond a double, nesting deep
enough to exhaust the recursion of parser and checks: each is one sentence
naming the file and where, before any check of its meaning runs.
"""
from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from typing import NoReturn

from rnb.core.records import Json, JsonObject
from rnb.pipeline.config_records import ConfigError

# A config is a few KB of JSON: anything far larger is a wrong file, not a config.
MAX_CONFIG_BYTES = 1 << 20
# Configs nest a handful of levels; a limit keeps deep JSON from exhausting the recursion of parser and checks.
MAX_JSON_DEPTH = 64
# Integers a config needs (counts, sizes, seeds) fit in 64 bits; longer digit strings cannot work anywhere.
MAX_INTEGER_DIGITS = 19


def read_document(file: str) -> Json:
    """The JSON document of a config file, every refusal of this module a ConfigError naming `file`."""
    text = _read_config_text(file)
    try:
        document: Json = json.loads(text, object_pairs_hook=_unique_keys(file), parse_constant=_no_constant(file),
                              parse_int=_bounded_int(file), parse_float=_finite_float(file))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            file, f"line {exc.lineno} column {exc.colno}", f"expected valid JSON, found a syntax error ({exc.msg})"
        ) from None
    except RecursionError:
        raise ConfigError(file, "(top level)", f"expected JSON nested at most {MAX_JSON_DEPTH} levels deep, "
                          "found far deeper nesting") from None
    _check_depth(document, file)
    return document


def _read_config_text(file: str) -> str:
    """The file's text, refusing before reading anything that is not a small regular file.

    Opening without blocking and checking the opened descriptor means a FIFO
    cannot hang the harness and a device such as /dev/zero is never read.
    """
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(file, "(file)", f"expected a readable UTF-8 JSON file, found an error: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ConfigError(file, "(file)", f"expected a regular JSON file, found {_file_kind(mode)}")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(file, "(file)", f"expected a JSON file of at most {MAX_CONFIG_BYTES} bytes, found a larger one")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "(file)", f"expected a readable UTF-8 JSON file, found an error: {exc}") from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _check_depth(document: Json, file: str) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH, walking iteratively so the check itself cannot recurse too far."""
    stack: list[tuple[Json, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ConfigError(file, "(top level)", f"expected JSON nested at most {MAX_JSON_DEPTH} levels deep, "
                              f"found deeper nesting")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)


def _unique_keys(file: str) -> Callable[[list[tuple[str, Json]]], JsonObject]:
    """Reject duplicate keys, which json would otherwise resolve silently to the last one."""

    def build(pairs: list[tuple[str, Json]]) -> JsonObject:
        result: JsonObject = {}
        for key, value in pairs:
            if key in result:
                raise ConfigError(file, f"key \"{key}\"", "expected each key at most once per object, found it twice")
            result[key] = value
        return result

    return build


def _no_constant(file: str) -> Callable[[str], NoReturn]:
    def reject(name: str) -> NoReturn:
        raise ConfigError(file, f"value {name}", f"expected a finite JSON number, found {name}")

    return reject


def _bounded_int(file: str) -> Callable[[str], int]:
    """Refuse integer literals longer than any count or size can be, before converting them."""

    def parse(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
            raise ConfigError(file, f"value {digits[:12]}... ({len(digits.lstrip('-'))} digits)",
                              f"expected an integer of at most {MAX_INTEGER_DIGITS} digits, found a longer one")
        return int(digits)

    return parse


def _finite_float(file: str) -> Callable[[str], float]:
    """Refuse number literals such as 1e999, which Python would read as infinity."""

    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            shown = text if len(text) <= 24 else text[:21] + "..."
            raise ConfigError(file, f"value {shown}", "expected a finite JSON number, found one beyond the range of a double")
        return value

    return parse
