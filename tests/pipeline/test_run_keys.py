"""Run keys besides the load keys, declared once (rnb.pipeline.run_keys): the record of defaults, the config's
check, the flag's type and help, and RunArgs all read the one declaration."""
from __future__ import annotations

import dataclasses

import pytest

from rnb import cli
from rnb.engines.job import RunArgs
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.run_keys import RUN_DEFAULTS, RUN_KEYS, JobSettings

TOY = {"source": {"synthetic": True},
       "pipeline": [{"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "out_queues": [0]}]},
                    {"model": "models.toy.SyntheticFrames", "queue_groups": [{"gpus": [-1], "in_queue": 0}]}]}
# A value out of each key's range, as JSON and as the flag's text, and the phrase both refusals give.
BAD = {"videos": (0, "0", "an integer >= 1"), "batch_size": (0, "0", "an integer >= 1"),
       "queue_size": (2**31, "2147483648", "an integer from 1 to 2147483647"),
       "warmup": (-1, "-1", "an integer >= 0"), "seed": (-1, "-1", "an integer >= 0"),
       "stall_s": (-1, "-1", "a number >= 0"), "max_duration_s": (-0.5, "-0.5", "a number >= 0"),
       "engine": ("dask", "dask", 'one of "local", "ray"')}


def test_the_keys_are_the_fields_of_job_settings_in_order_and_run_args_carries_them() -> None:
    names = [field.name for field in dataclasses.fields(JobSettings)]
    assert list(RUN_KEYS) == names == list(BAD)
    assert [field.name for field in dataclasses.fields(RunArgs)][: len(names)] == names
    assert RUN_DEFAULTS == {"videos": 2000, "batch_size": 1, "queue_size": 50000, "warmup": 10, "seed": 0,
                            "stall_s": 60.0, "max_duration_s": 0.0, "engine": "local"}
    assert [name for name, key in RUN_KEYS.items() if not key.accepts(RUN_DEFAULTS[name])] == []


def test_each_flag_s_help_names_the_default_the_job_gets() -> None:
    helps = {action.dest: action.help for action in cli.benchmark_parser()._actions}
    assert helps["videos"] == "number of requests to finish (default 2000)"
    assert helps["stall_s"] == ("end the job as stalled when items wait and none has left any step for S seconds "
                                "(default 60; 0 never)")
    assert helps["max_duration_s"] == ("end the job after S seconds of measured time, keeping what it measured "
                                       "(default 0: no maximum)")
    assert helps["engine"] == "the engine that runs the job, one of local, ray (default: the config's, else local)"
    # The load keys name theirs the same way, from LoadSettings.
    assert (helps["mean_interval_ms"], helps["fps"]) == ("Poisson mean inter-arrival in ms; 0 = bulk (default 3)",
                                                         "frames per second of each stream (default 30)")
    assert helps["client"].endswith("(default rnb)") and helps["min_duration_ms"].endswith(
        "(default 10000, LoadGen's min_duration_ms)")


def test_with_nothing_given_the_job_gets_the_declared_defaults() -> None:
    args = cli.resolve_args(cli.parse_args([]), parse_config(TOY, "c.json"))
    assert {name: getattr(args, name) for name in RUN_KEYS} == RUN_DEFAULTS


@pytest.mark.parametrize("name", list(BAD))
def test_config_and_flag_refuse_a_value_out_of_range_in_the_same_words(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    value, text, expected = BAD[name]
    with pytest.raises(ConfigError) as refused:
        parse_config({**TOY, "run": {name: value}}, "c.json")
    shown = f'the string "{value}"' if isinstance(value, str) else f"{value}"
    assert str(refused.value) == f"c.json: run.{name}: expected {expected}, found {shown}"
    flag = "/".join(RUN_KEYS[name].spellings[:2])
    with pytest.raises(SystemExit) as exited:
        cli.parse_args([f"{RUN_KEYS[name].spellings[-1]}={text}"])
    shown = text if name != "engine" else repr(text)
    sentence = f"command line: {flag}: expected {expected}, found {shown}"
    assert (exited.value.code, capsys.readouterr().err.strip()) == (2, sentence)
