"""A stand-in for models.toy.AsyncSleep until it reaches main (issue 18), and the tuner tests' shared helpers.

`SleepStep` has AsyncSleep's interface and costs: a call of n items (time
cards) takes `ms + ms_per_item * n` milliseconds of emulated device time
(here a plain sleep, which holds no CPU either) and outputs the toy
geometry of models.toy.SyntheticFrames, (clips, 3, frames, height, width)
per item, stacked for a batch as the Batcher does.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import models.toy
from rnb.harness.timecard import as_cards
from rnb.tune.profile import Bench, Profile, ProfileKey, plan_profiles
from rnb.tune.space import TuneSpace

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "tune-example.json"
ASYNC_SLEEP = "models.toy.AsyncSleep"
SLEEP_MODEL = ASYNC_SLEEP if hasattr(models.toy, "AsyncSleep") else "tests.tune_support.SleepStep"


class SleepStep:
    def __init__(self, device: torch.device, ms: float = 0.0, ms_per_item: float = 0.0, clips: int = 2,
                 frames: int = 4, height: int = 16, width: int = 16,
                 input_shapes: tuple[tuple[int, ...], ...] | None = None) -> None:
        self.ms, self.ms_per_item, self.clips = ms, ms_per_item, clips
        rows = SleepStep.output_shape(clips, frames, height, width, input_shapes)[0][0]
        self.output = torch.zeros((rows, 3, frames, height, width), device=device)

    @staticmethod
    def output_shape(clips: int = 2, frames: int = 4, height: int = 16, width: int = 16,
                     input_shapes: tuple[tuple[int, ...], ...] | None = None, **kwargs: Any) -> tuple[tuple[int, ...], ...]:
        rows = clips if input_shapes is None else max(clips, input_shapes[0][0])
        return ((rows, 3, frames, height, width),)

    def __call__(self, tensors: tuple[torch.Tensor, ...], non_tensors: dict, time_card: Any) -> tuple:
        items = len(as_cards(time_card))
        time.sleep((self.ms + self.ms_per_item * items) / 1000.0)
        return (self.output[: items * self.clips],), non_tensors, time_card


def example_document(path: Path = EXAMPLE) -> dict[str, Any]:
    """config/tune-example.json, its sleeping steps run by SleepStep where AsyncSleep is not there yet."""
    document = json.loads(path.read_text())
    for step in document["pipeline"]:
        if step["model"] == ASYNC_SLEEP:
            step["model"] = SLEEP_MODEL
    return document


def hand_profiles(space: TuneSpace, bench: Bench, hop_s: float = 0.0003) -> dict[ProfileKey, Profile]:
    """Profiles of a space's sleeping steps as their keywords say they cost, plus `hop_s` of harness per call.

    What the profiler would measure on an idle machine, without a process:
    the search tests need exact, known costs to have a hand-worked optimum.
    """
    profiles = {}
    for job in plan_profiles(space, bench, calls=1):
        step = job.document["pipeline"][job.position]
        device_s = (step.get("ms", 0.0) + step.get("ms_per_item", 0.0) * job.form.cards) / 1000.0
        profiles[job.key] = Profile(job.key, (device_s + hop_s,), (), (device_s,), 24576, 100 * 2**20, None, "hand")
        if job.batcher_key is not None:
            profiles[job.batcher_key] = Profile(job.batcher_key, (hop_s,), (hop_s,), (1e-5,), 24576, 100 * 2**20, None,
                                                "hand")
    return profiles


def write_example(directory: Path, batches: list[int] | None = None) -> Path:
    """The example document written where a test can point rnb-tune at it (optionally with other batches)."""
    document = example_document()
    if batches is not None:
        document["pipeline"][1]["batch"] = batches
    path = directory / "tune-example.json"
    path.write_text(json.dumps(document, indent=1))
    return path


@dataclass(frozen=True)
class Rendered:
    """What a headless browser saw of a page."""

    plots: int                 # plotly plots drawn (their <svg class="main-svg"> is there)
    traces: int                # paths drawn by their traces: bars, lines, markers
    errors: tuple[str, ...]    # console messages at SEVERE
    fetched: tuple[str, ...]   # resources the page loaded (a self-contained page loads none)


def render(page: Path) -> Rendered:
    """Open a page from a file:// URL in Debian's headless chromium and report what it drew."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--window-size=1280,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(page.resolve().as_uri())
        plots = driver.execute_script(
            "return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.querySelector('.main-svg')).length")
        drawn = driver.execute_script("return document.querySelectorAll('.js-plotly-plot .trace path').length")
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        errors = tuple(entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE")
    finally:
        driver.quit()
    return Rendered(int(plots), int(drawn), errors, tuple(fetched))
