"""What the tuner's tests share: the example config, profiles made by hand, a headless browser."""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rnb.analysis.job_dirs import Job
from rnb.tune.profile import Bench, Profile, ProfileKey
from rnb.tune.profile_plan import plan_profiles
from rnb.tune.profile_read import calls_of, occupancy
from rnb.tune.sim_records import Arrivals, Background, Service, SimGroup, SimPipeline
from rnb.tune.space import TuneSpace

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "tune-example.json"


def example_document(path: Path = EXAMPLE) -> dict[str, Any]:
    """config/tune-example.json as a JSON document."""
    document: dict[str, Any] = json.loads(path.read_text())
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
    misfit_axes: tuple[str, ...] = ()   # axes that do not span their plot's data (axis_misfits), one line each
    overlaps: tuple[str, ...] = ()      # texts drawn over other texts of their plot: "plot: a / b"
    legends_on_data: tuple[str, ...] = ()   # plots whose legend covers one of their plotting areas
    drawn: tuple[dict[str, Any], ...] = ()  # per plot: id, title, axes (type, range, title, tick texts), trace names


# Per plot: every text drawn (its box), whether its legend's box meets a plotting area's, and what its axes show.
_TEXTS_JS = """
const meet = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1 &&
                       Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p._fullLayout).map(p => {
  const texts = Array.from(p.querySelectorAll('text')).filter(t => t.textContent.trim() &&
      getComputedStyle(t).visibility !== 'hidden' && t.getBoundingClientRect().width > 0);
  const overlaps = [];
  for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
    if (texts[i].contains(texts[j]) || texts[j].contains(texts[i])) continue;
    if (meet(texts[i].getBoundingClientRect(), texts[j].getBoundingClientRect()))
      overlaps.push(p.id + ': ' + texts[i].textContent + ' / ' + texts[j].textContent);
  }
  const legend = p.querySelector('g.legend');
  const areas = Array.from(p.querySelectorAll('.bglayer rect')).map(r => r.getBoundingClientRect());
  const onData = legend && legend.getBoundingClientRect().width > 0 &&
                 areas.some(a => meet(a, legend.getBoundingClientRect()));
  const axes = Object.fromEntries(Object.keys(p._fullLayout).filter(k => /^[xy]axis[0-9]*$/.test(k)).map(k => {
    const id = k[0] + k.slice(5);
    return [k, {type: p._fullLayout[k].type, range: p._fullLayout[k].range,
                title: (p._fullLayout[k].title || {}).text || '',
                ticks: Array.from(p.querySelectorAll('.' + id + 'tick text')).map(t => t.textContent)}];
  }));
  return {id: p.id, title: (p._fullLayout.title || {}).text || '', overlaps: overlaps, onData: !!onData,
          axes: axes, names: p._fullData.filter(t => t.visible === true).map(t => t.name || '')};
});
"""


# Per plot as plotly drew it: its id, each cartesian axis's type and range (log10 units on a log axis), how bars
# combine, and each visible trace's kind, axes and values.
_AXES_JS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p._fullLayout).map(p => ({
  id: p.id, barmode: p._fullLayout.barmode,
  axes: Object.fromEntries(Object.keys(p._fullLayout).filter(k => /^[xy]axis[0-9]*$/.test(k))
        .map(k => [k, {type: p._fullLayout[k].type, range: p._fullLayout[k].range}])),
  traces: p._fullData.filter(t => t.visible === true).map(t => ({
    type: t.type, orientation: t.orientation || 'v', xaxis: t.xaxis, yaxis: t.yaxis,
    x: Array.from(t.x || []), y: Array.from(t.y || [])}))}));
"""
# An axis may pad its data, but spanning more than this many times the data's extent (or, for data of no extent,
# this many decades or tenths of its value) draws the data as a flat line: plotly's annotation at 10^bound did so.
MAX_SPAN_RATIO = 3.0


def axis_misfits(plot: dict[str, Any]) -> list[str]:
    """Every axis of a drawn plot whose range leaves out some of its data or dwarfs it, one line each."""
    values: dict[str, list[float]] = {}
    stacked: dict[tuple[str, object], float] = {}
    for trace in plot["traces"]:
        for axis, other, data in (("xaxis", "y", trace["x"]), ("yaxis", "x", trace["y"])):
            name = "xaxis" + trace["xaxis"][1:] if axis == "xaxis" else "yaxis" + trace["yaxis"][1:]
            numbers = [float(v) for v in data if isinstance(v, (int, float))]
            along = (trace["orientation"] == "h") == (axis == "xaxis")
            if trace["type"] == "heatmap" and numbers:   # a cell spans half a step either side of its centre
                step = min((b - a for a, b in zip(sorted(numbers), sorted(numbers)[1:]) if b > a), default=1.0)
                numbers += [min(numbers) - step / 2, max(numbers) + step / 2]
            if trace["type"] == "bar" and along:   # bars start at 0; stacked ones end at their category's sum
                numbers.append(0.0)
                if plot["barmode"] == "stack":
                    for category, value in zip(trace[other], data):
                        stacked[(name, category)] = stacked.get((name, category), 0.0) + float(value)
            values.setdefault(name, []).extend(numbers)
    for (name, _), total in stacked.items():
        values[name].append(total)
    misfits = []
    for name, axis in plot["axes"].items():
        data = values.get(name, [])
        if axis["type"] not in ("linear", "log") or not data:
            continue
        if axis["type"] == "log":
            data = [math.log10(v) for v in data if v > 0]
        elif min(float(v) for v in axis["range"]) == 0.0 and min(data) >= 0:
            data = [*data, 0.0]   # a rate's axis, drawn from 0 on purpose
        low, high = min(data), max(data)
        start, end = sorted(float(v) for v in axis["range"])
        floor = 1.0 if axis["type"] == "log" else 0.1 * max(abs(low), abs(high), 1e-9)
        slack = 1e-6 * max(abs(start), abs(end), 1.0)
        if low < start - slack or high > end + slack or end - start > MAX_SPAN_RATIO * max(high - low, floor):
            misfits.append(f"{plot['id']} {name} ({axis['type']}): range {start:.4g} to {end:.4g}, "
                           f"data {low:.4g} to {high:.4g}")
    return misfits


@dataclass(frozen=True)
class Browser:
    """Debian's chromium and its driver, as found on PATH."""

    chromium: str
    chromedriver: str


def find_browser() -> Browser | None:
    """chromium and chromedriver on PATH, where scripts/setup.sh looks before it installs them; None if one is missing."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    return Browser(chromium, chromedriver) if chromium and chromedriver else None


def render(page: Path) -> Rendered:
    """Open a page from a file:// URL in Debian's headless chromium and report what it drew."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = find_browser()
    assert browser is not None  # the test's `browser` marker saw to it (tests/conftest.py)
    options = webdriver.ChromeOptions()
    options.binary_location = browser.chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--window-size=1280,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # chromium leaves its singleton socket's directory in TMPDIR after the driver's quit: a scratch TMPDIR of the
    # test's own keeps /tmp clean.
    with tempfile.TemporaryDirectory(prefix="rnb-browser-", ignore_cleanup_errors=True) as scratch:
        service = Service(browser.chromedriver, env={**os.environ, "TMPDIR": scratch})
        return _draw(webdriver.Chrome(service=service, options=options), page)


def _draw(driver: Any, page: Path) -> Rendered:
    """What the browser `driver` drew of `page`; the browser quits at the end."""
    try:
        driver.get(page.resolve().as_uri())
        plots = driver.execute_script(
            "return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.querySelector('.main-svg')).length")
        drawn = driver.execute_script("return document.querySelectorAll('.js-plotly-plot .trace path').length")
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        errors = tuple(entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE")
        misfits = tuple(line for plot in driver.execute_script(_AXES_JS) for line in axis_misfits(plot))
        seen = driver.execute_script(_TEXTS_JS)
    finally:
        driver.quit()
    return Rendered(int(plots), int(drawn), errors, tuple(fetched), misfits,
                    tuple(line for plot in seen for line in plot["overlaps"]),
                    tuple(plot["id"] for plot in seen if plot["onData"]), tuple(seen))


def replay(job: Job) -> tuple[SimPipeline, Arrivals]:
    """A measured job as the estimator sees it, from the job's own log: each group's calls as measured in it
    (occupancy, as the profiler reads it), its replicas, queues, slots and batches, and its own arrivals.

    Predicting a job from itself leaves out every error of the profiles (another moment's load, another
    form), so what remains is the simulation's own: how it queues, batches, blocks and routes.
    """
    steps = job.config["pipeline"]
    groups = []
    for k, step in enumerate(steps):
        (group,) = step["queue_groups"]
        emit: list[float] = []
        held: list[float] = []
        inside: list[float] = []
        by_cards: dict[int, list[float]] = {}
        for calls in calls_of(job, k).values():
            e, h, i, cards = occupancy(calls)
            emit += e
            held += h
            inside += i
            for seconds, count in zip(e, cards):
                by_cards.setdefault(count, []).append(seconds)
        full = max(by_cards)
        means = {count: statistics.mean(values) for count, values in by_cards.items()}
        partial = tuple(means.get(m, means[full]) / means[full] for m in range(1, full + 1))
        final = k == len(steps) - 1
        batch = group.get("batch", step.get("batch")) if step["model"] == "models.batcher.Batcher" else None
        groups.append(SimGroup(f"step {k}", k, tuple(group["gpus"]), group.get("in_queue"),
                               tuple(group.get("out_queues", ())), 0 if final else step.get("num_shared_tensors", 10),
                               Service(tuple(emit), tuple(held), tuple(inside), partial), batch=batch))
    enqueued = job.timings.column("enqueue").to_numpy(zero_copy_only=False)
    start = float(enqueued.min())
    return SimPipeline(tuple(groups), len(steps)), Arrivals("trace", times=tuple(float(t) - start for t in sorted(enqueued)))


def cpu_chain(*steps: tuple[float, float, int], cores: float, background: Background | None = None,
              threads: int = 1) -> SimPipeline:
    """A linear pipeline on the CPU: per step (ms per call as profiled, its CPU fraction, replicas)."""
    last = len(steps) - 1
    groups = tuple(SimGroup(
        name=f"step {k}", step=k, devices=(-1,) * replicas, in_queue=None if k == 0 else 0,
        out_queues=() if k == last else (0,), slots=0 if k == last else 10, service=Service.constant(call_ms / 1000.0),
        cpu_fraction=fraction, threads=threads) for k, (call_ms, fraction, replicas) in enumerate(steps))
    return SimPipeline(groups, len(steps), cores, background or Background())
