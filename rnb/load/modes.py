"""Every load mode, asked in order, and what is decided across them: the job's mode, a bad mix refused, a log read back."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import rnb.flags as flags
from rnb.load.keys import RunKey, Setting
from rnb.load.mode import LoadMode
from rnb.load.poisson import Bulk, ClosedLoop, Poisson
from rnb.load.replay import Schedule, Trace
from rnb.load.scenario_modes import LoadGenDriven, MultiStream
from rnb.load.scenarios import SCENARIO_KEYS, SCENARIOS
from rnb.load.settings import LoadSettings
from rnb.load.streams import Streams

# Asked in this order: the first mode whose `chosen` says yes is the job's.
MODES: tuple[LoadMode, ...] = (LoadGenDriven(), Streams(), Trace(), Schedule(), MultiStream(), ClosedLoop(), Bulk(),
                               Poisson())
# The keys that each choose a mode of their own: at most one may be set.
EXCLUSIVE = ("streams", "arrivals", "rate_schedule", "concurrency")
# Every load key once, in LoadSettings' order: flags, run keys and LoadSettings fields.
_DECLARED = {**{key.name: key for key in SCENARIO_KEYS}, **{key.name: key for mode in MODES for key in mode.keys}}
LOAD_KEYS: dict[str, RunKey] = {field.name: _DECLARED[field.name] for field in dataclasses.fields(LoadSettings)}
DEFAULTS: dict[str, Setting] = dataclasses.asdict(LoadSettings())


def mode_of(settings: LoadSettings) -> LoadMode:
    """The job's load mode."""
    return next(mode for mode in MODES if mode.chosen(settings))


def with_scenario(settings: LoadSettings, given: Iterable[str]) -> LoadSettings:
    """The settings with their scenario's keys set where the command line and the config left them to defaults
    (for RnB's client: LoadGen issues a LoadGen-driven job's requests itself)."""
    spec = SCENARIOS.get(settings.scenario or "")
    if spec is None or settings.client == "loadgen":
        return settings
    chosen = spec.sets(settings)
    return _settings({**dataclasses.asdict(settings), **{key: value for key, value in chosen.items() if key not in set(given)}})


def refusal(settings: LoadSettings, given: Iterable[str], videos: int) -> tuple[str, str] | None:
    """What is wrong with a job's load settings, if anything: (the key to blame, what was expected).

    `given` are the keys the command line or the config set; a key that
    means something only beside another (--fps beside --streams) is refused
    alone, rather than silently ignored.
    """
    given = list(given)
    for name in given:
        needed = LOAD_KEYS[name].needs
        if needed is not None and getattr(settings, needed) is None:
            return name, (f"expected {flags.flag_name(LOAD_KEYS[needed].spellings)} (or run.{needed}) beside it, "
                          "found none")
    problem = _scenario_refusal(settings, given, videos)
    if problem is not None:
        return problem
    chosen = [name for name in EXCLUSIVE if getattr(settings, name) is not None]
    if len(chosen) > 1:
        return chosen[0], f"expected one load mode, found {' and '.join(_flag(name) for name in chosen)} together"
    return mode_of(settings).refusal(settings, videos)


def _scenario_refusal(settings: LoadSettings, given: list[str], videos: int) -> tuple[str, str] | None:
    """A scenario's own refusals: keys it does not read, keys it contradicts, a -v it cannot split into queries."""
    spec = SCENARIOS.get(settings.scenario or "")
    if spec is None:
        return None
    if settings.client == "loadgen":
        stray = [name for name in given if name in (*EXCLUSIVE, *LoadGenDriven.reads)
                 and not (name == "mean_interval_ms" and spec.name == "server")]
        if stray:
            return stray[0], (f"expected none beside --client loadgen, whose {spec.name} scenario LoadGen issues itself"
                              f", found {_flag(stray[0])}")
    for key, value in spec.sets(settings).items():
        if settings.client == "rnb" and getattr(settings, key) != value:
            return "scenario", (f"expected {_flag(key)} {value} or none beside it (the {settings.scenario} scenario), "
                                f"found {_flag(key)} {getattr(settings, key)}")
    if "samples_per_query" in given and spec.name != "multi-stream":
        return "samples_per_query", f"expected the multi-stream scenario beside it, found {spec.name}"
    if "target_latency_ms" in given and spec.target_latency_ms is None:
        return "target_latency_ms", f"expected a scenario with a latency target beside it, found {spec.name}"
    if spec.name == "multi-stream" and videos % settings.samples_per_query:
        blamed = "samples_per_query" if "samples_per_query" in given else "scenario"
        return blamed, (f"expected -v to be whole queries of {settings.samples_per_query} requests "
                        f"({_flag('samples_per_query')}), found -v {videos}")
    return None


def _flag(name: str) -> str:
    return flags.flag_name(LOAD_KEYS[name].spellings)


def logged_mode(args: Mapping[str, object]) -> LoadMode:
    """The load mode of a logged job, from the load keys of its meta.json `args` (or of an analyze.py row).

    The keys decide, as they did for the job; `load_mode`, which meta.json
    also holds, is for a reader, and a log from before it was written has none.
    """
    return mode_of(logged_settings(args))


def logged_settings(args: Mapping[str, object]) -> LoadSettings:
    """The load settings of a logged job, from the load keys of its meta.json `args`: what its client offered."""
    return _settings({key: args[key] for key in DEFAULTS if args.get(key) is not None})


def _settings(values: Mapping[str, object]) -> LoadSettings:
    """LoadSettings from values by key, each already checked against its RunKey (or read from a log written so)."""
    return LoadSettings(**values)  # type: ignore[arg-type]
