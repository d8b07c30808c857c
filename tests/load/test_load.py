"""Load modes (rnb.load): each mode's choice, job-id label, arrival times against its definition, and refusals."""
from __future__ import annotations

import dataclasses
import itertools
import json
import random

import pytest

from rnb import cli
from rnb.load import LOAD_KEYS, MODES, LoadSettings, logged_mode, mode_of
from rnb.pipeline.config import ConfigError, parse_config


def test_every_load_key_is_a_settings_field_and_every_field_a_key() -> None:
    assert {field.name for field in dataclasses.fields(LoadSettings)} == set(LOAD_KEYS)
    assert len({mode.name for mode in MODES}) == len(MODES)


@pytest.mark.parametrize(("settings", "mode", "label"), [
    (LoadSettings(mean_interval_ms=2.5), "poisson", "mi2.5"),
    (LoadSettings(mean_interval_ms=0), "bulk", "mi0"),
    (LoadSettings(mean_interval_ms=0.5, concurrency=8), "closed_loop", "c8"),   # closed loop ignores -mi
])
def test_the_settings_choose_one_mode_which_names_the_job(settings: LoadSettings, mode: str, label: str) -> None:
    assert mode_of(settings).name == mode
    assert mode_of(settings).job_label(settings) == label


def test_poisson_arrivals_are_the_seeded_exponential_gaps_summed() -> None:
    settings = LoadSettings(mean_interval_ms=4)
    rng = random.Random(7)
    expected = list(itertools.accumulate(rng.expovariate(250.0) for _ in range(1000)))
    due = [arrival.due_s for arrival in itertools.islice(mode_of(settings).arrivals(settings, 7), 1000)]
    assert due == expected
    assert sum(b - a for a, b in itertools.pairwise(due)) / 999 == pytest.approx(0.004, rel=0.1)


@pytest.mark.parametrize("settings", [LoadSettings(mean_interval_ms=0), LoadSettings(concurrency=3)])
def test_bulk_and_closed_loop_requests_are_due_at_once(settings: LoadSettings) -> None:
    arrivals = list(itertools.islice(mode_of(settings).arrivals(settings, 0), 50))
    assert {arrival.due_s for arrival in arrivals} == {None}


def test_a_logged_jobs_mode_is_the_one_its_load_keys_choose() -> None:
    assert logged_mode({"load_mode": "bulk", "mean_interval_ms": 0}).name == "bulk"
    assert logged_mode({"load_mode": "bulk", "mean_interval_ms": 5}).name == "poisson"   # an edited copy
    assert logged_mode({"mean_interval_ms": 3, "concurrency": 4}).name == "closed_loop"
    assert logged_mode({"mean_interval_ms": 3, "concurrency": None}).name == "poisson"


@pytest.mark.parametrize(("argv", "sentence"), [
    (["-mi", "-1"], "command line: -mi/--mean_interval_ms: expected a number from 0 to 8.64e+07, found -1"),
    (["-mi", "nan"], "command line: -mi/--mean_interval_ms: expected a number from 0 to 8.64e+07, found nan"),
    (["-mi", "1e12"], "command line: -mi/--mean_interval_ms: expected a number from 0 to 8.64e+07, found 1e12"),
    (["--scenario", "server", "--min-duration-ms", "1e12"],
     "command line: --min-duration-ms: expected a number from 0 to 8.64e+07, found 1e12"),
    (["--scenario", "server", "--target-latency-ms", "1e12"],
     "command line: --target-latency-ms: expected a number > 0 and <= 8.64e+07, found 1e12"),
    (["--scenario", "multi-stream", "--samples-per-query", "3000000000"],
     "command line: --samples-per-query: expected an integer from 1 to 2147483647, found 3000000000"),
    (["--concurrency", "0"], "command line: --concurrency: expected an integer from 1 to 2147483647, found 0"),
    (["--concurrency", "2.5"], "command line: --concurrency: expected an integer from 1 to 2147483647, found 2.5"),
])
def test_a_bad_load_flag_is_one_sentence_and_exit_2(argv: list[str], sentence: str, capsys) -> None:
    assert cli.main(["--check", *argv]) == 2
    assert capsys.readouterr().err.strip() == sentence


@pytest.mark.parametrize(("run", "sentence"), [
    ({"mean_interval_ms": "3"}, 'c.json: run.mean_interval_ms: expected a number from 0 to 8.64e+07, found the string "3"'),
    ({"streams": 20000}, "c.json: run.streams: expected an integer from 1 to 10000, found 20000"),
    ({"concurrency": True}, "c.json: run.concurrency: expected an integer from 1 to 2147483647, found true"),
])
def test_a_bad_load_run_key_names_its_json_path(run: dict, sentence: str) -> None:
    document = json.loads(open("config/toy.json").read())
    with pytest.raises(ConfigError) as caught:
        parse_config({**document, "run": run}, "c.json")
    assert str(caught.value) == sentence


def test_the_command_line_beats_the_config_which_beats_the_defaults(tmp_path) -> None:
    document = json.loads(open("config/toy.json").read())
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**document, "run": {"concurrency": 4, "mean_interval_ms": 7}}))
    config = parse_config(json.loads(path.read_text()), str(path))
    assert cli.resolve_args(cli.parse_args([]), config).load == LoadSettings(mean_interval_ms=7, concurrency=4)
    assert cli.resolve_args(cli.parse_args(["--concurrency", "2"]), config).load.concurrency == 2
    assert cli.resolve_args(cli.parse_args([]), parse_config(document, "toy.json")).load == LoadSettings()


def test_a_flags_load_mode_replaces_the_configs(tmp_path) -> None:
    """docs/running.md: flags override the config's run keys; a flag that chooses a mode replaces the config's
    mode, whose other keys then stand only where they belong to the flag's mode."""
    document = json.loads(open("config/streams-example.json").read())   # run: streams 1, fps 30, deadline 250 ms
    config = parse_config(document, "streams-example.json")
    trace = tmp_path / "trace.csv"
    trace.write_text("offset_s\n" + "".join(f"{i / 10}\n" for i in range(600)))
    replayed = cli.resolve_args(cli.parse_args(["--arrivals", str(trace)]), config).load
    assert replayed == LoadSettings(arrivals=str(trace))
    more = cli.resolve_args(cli.parse_args(["--streams", "3"]), config).load
    assert more == LoadSettings(streams=3, fps=30, deadline_ms=250)
    assert cli.resolve_args(cli.parse_args(["-mi", "5"]), config).load == LoadSettings(mean_interval_ms=5)
    assert cli.resolve_args(cli.parse_args(["--fps", "15"]), config).load == LoadSettings(streams=1, fps=15,
                                                                                          deadline_ms=250)
    assert cli.resolve_args(cli.parse_args(["--scenario", "offline"]), config).load == LoadSettings(
        mean_interval_ms=0, scenario="offline")
