"""benchmark.py, sweep.py and rnb-tune: RnB's flags by the same spellings, one way to refuse, defaults in every --help."""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from rnb import cli
from rnb.analysis import rnb_sweep
from rnb.tune import cli as tune_cli

COMMANDS: dict[str, Callable[[Sequence[str]], object]] = {
    "benchmark.py": cli.main, "sweep.py": rnb_sweep.main, "rnb-tune": tune_cli.main}


def said(main: Callable[[Sequence[str]], object], argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """A command's exit code, stdout and stderr, whether it returned its code or argparse exited."""
    try:
        code = main(argv)
    except SystemExit as exited:
        code = exited.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


@pytest.mark.parametrize("spelling", ["-c", "--config", "--config_file_path", "--config-file-path"])
def test_every_command_takes_the_config_by_each_spelling(spelling: str) -> None:
    assert cli.parse_args([spelling, "x.json"]).config_file_path == "x.json"
    args, extra = rnb_sweep.parse_args([spelling, "x.json", "-mi", "1,2"])
    assert (args.config_file_path, args.mi, extra) == ("x.json", [1.0, 2.0], [])
    tune_args = tune_cli.parse_args([spelling, "x.json", "--cpu-slots", "1", "--latency-bound-ms", "5", "--out", "o"])
    assert tune_args.config == "x.json"


def test_the_long_names_of_rnb_flags_have_their_dashed_twins() -> None:
    underscored = cli.parse_args(["--mean_interval_ms", "2", "--videos", "7", "--batch_size", "3", "--queue_size", "9"])
    dashed = cli.parse_args(["--mean-interval-ms", "2", "-v", "7", "--batch-size", "3", "--queue-size", "9"])
    short = cli.parse_args(["-mi", "2", "-v", "7", "-b", "3", "-qs", "9"])
    assert vars(underscored) == vars(dashed) == vars(short)
    assert (short.mean_interval_ms, short.videos, short.batch_size, short.queue_size) == (2.0, 7, 3, 9)
    for spelling in ("-mi", "--mean_interval_ms", "--mean-interval-ms", "--mi"):
        assert rnb_sweep.parse_args(["-c", "x.json", spelling, "0,5"])[0].mi == [0.0, 5.0]
    for spelling in ("-b", "--batch_size", "--batch-size", "--batch"):
        assert tune_cli.parse_args(["-c", "x", "--cpu-slots", "1", "--latency-bound-ms", "5", "--out", "o",
                                    spelling, "2,4"]).batch == [2, 4]


def test_sweep_passes_the_flags_it_does_not_know_on_to_each_run() -> None:
    args, extra = rnb_sweep.parse_args(["-c", "x.json", "-mi", "1", "-b", "4", "-qs", "100", "--warmup", "0", "-v", "50"])
    assert extra == ["-v", "50", "-b", "4", "-qs", "100", "--warmup", "0"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_flag_without_its_value_is_the_same_sentence_in_every_command(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert said(COMMANDS[name], ["-c"], capsys) == (2, "", "command line: -c/--config_file_path: expected a value, found none\n")


@pytest.mark.parametrize(("name", "argv", "sentence"), [
    ("benchmark.py", ["-v", "abc"], "-v/--videos: expected an integer >= 1, found 'abc'"),
    ("sweep.py", ["-c", "x.json", "-v", "abc"], "-v/--videos: expected an integer >= 1, found 'abc'"),
    ("benchmark.py", ["--warmup", "-2"], "--warmup: expected an integer >= 0, found -2"),
    ("sweep.py", ["-c", "x.json", "-mi", "1", "--min-items", "-2"], "--min-items: expected an integer >= 0, found -2"),
    ("rnb-tune", ["-c", "x", "--cpu-slots", "1", "--latency-bound-ms", "5", "--out", "o", "--warmup", "-2"],
     "--warmup: expected an integer >= 0, found -2"),
    ("rnb-tune", ["-c", "x", "--cpu-slots", "1", "--latency-bound-ms", "inf", "--out", "o"],
     "--latency-bound-ms: expected a number > 0, found inf"),
    ("sweep.py", ["-c", "x.json", "--latency-bound-ms", "0"], "--latency-bound-ms: expected a number > 0, found 0"),
    ("rnb-tune", ["-c", "x", "--cpu-slots", "1", "--out", "o"], "--latency-bound-ms: expected a value (rnb-tune requires it, "
                                                                 "except under --objective streams), found none"),
    ("sweep.py", ["-mi", "1"], "-c/--config_file_path: expected a value (sweep.py requires it), found none"),
])
def test_a_bad_value_is_one_command_line_sentence_and_exit_2(
        name: str, argv: list[str], sentence: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert said(COMMANDS[name], argv, capsys) == (2, "", f"command line: {sentence}\n")


def help_entries(text: str) -> dict[str, str]:
    """Each option of an argparse --help, by its spellings, with its help text on one line."""
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", text.split("options:", 1)[1]):
        invocation, _, rest = block.strip().partition("  ")
        entries[invocation.strip()] = " ".join(f"{invocation} {rest}".split())
    return entries


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_help_says_the_default_of_each_flag_that_takes_a_value(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = said(COMMANDS[name], ["--help"], capsys)
    assert (code, err) == (0, "")
    entries = help_entries(out)
    assert "-c CONFIG_FILE_PATH, --config_file_path CONFIG_FILE_PATH, --config CONFIG_FILE_PATH, --config-file-path " \
           "CONFIG_FILE_PATH" in entries or name == "rnb-tune"
    valued = {flags: text for flags, text in entries.items()
              if not flags.startswith("-h") and any(not token.startswith("-") for token in flags.replace(",", " ").split())}
    assert len(valued) >= 12
    silent = [flags for flags, text in valued.items() if "(default" not in text and "(required)" not in text]
    assert silent == []


def test_sweep_help_says_that_unknown_flags_go_on_to_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = said(rnb_sweep.main, ["--help"], capsys)
    assert "Flags that sweep.py does not know (-b, -qs, --warmup, --cpu, --engine, ... : benchmark.py --help) go on " \
           "to every benchmark.py run." in " ".join(out.split())
