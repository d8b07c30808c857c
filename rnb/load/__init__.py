"""Load modes: how requests arrive, each mode declared once.

A load mode is one class here.  It declares the run keys that choose and
tune it (each a flag of benchmark.py and a key of a config's "run" object,
with its range), names itself in the job id, generates its arrival times,
and tells the analysis where its jobs go on a load curve.  The command line
(rnb.cli), the config's checks (rnb.pipeline.config), the job's settings
(rnb.engines.job.RunArgs), the client (rnb.engines.client) and the analysis
(rnb.analysis) read these declarations instead of keeping lists of their
own; docs/development.md says how to add a mode.


A module a job: keys (RunKey, a key's range), settings (LoadSettings),
mode (what a mode answers), one module per family of modes (poisson,
streams, replay, scenario_modes), scenarios (LoadGen's), inputs (a trace
and a schedule read and refused) and modes (all of them in order, and what
is decided across them).  The package imports only rnb.flags, so that
every layer may import it; importers take its names from here.
"""
from __future__ import annotations

from rnb.load.inputs import OFFERED_FILE, Span, parse_schedule
from rnb.load.keys import MAX_SEMAPHORE_VALUE, RunKey, Setting
from rnb.load.mode import (
    DEADLINE_FIELD,
    DUE_FIELD,
    FATES,
    FRAME_FIELD,
    LATE_FIELD,
    STREAM_FIELD,
    Arrival,
    CurvePoint,
    LoadMode,
    logged_seed,
)
from rnb.load.modes import DEFAULTS, EXCLUSIVE, LOAD_KEYS, MODES, logged_mode, logged_settings, mode_of, refusal, with_scenario
from rnb.load.scenarios import SCENARIO_KEYS, SCENARIOS, Scenario
from rnb.load.settings import LoadSettings

__all__ = ["Arrival", "CurvePoint", "DEADLINE_FIELD", "DEFAULTS", "DUE_FIELD", "EXCLUSIVE", "FATES", "FRAME_FIELD",
           "LATE_FIELD", "LOAD_KEYS", "LoadMode", "LoadSettings", "MAX_SEMAPHORE_VALUE", "MODES", "OFFERED_FILE",
           "RunKey", "SCENARIOS", "SCENARIO_KEYS", "STREAM_FIELD", "Scenario", "Setting", "Span", "logged_mode",
           "logged_seed", "logged_settings", "mode_of", "parse_schedule", "refusal", "with_scenario"]
