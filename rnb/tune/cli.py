"""rnb-tune: find the replicas, batch sizes and placement that serve the most under a latency bound.

    rnb-tune -c config/tune-example.json --cpu-slots 6 --latency-bound-ms 100 --out tune-out
    rnb-tune -c config/x.json --gpus 0,1,2,3 --latency-bound-ms 100 --percentile 99 --out tune-out
    rnb-tune -c config/x.json --gpus 0,1 --latency-bound-ms 80 --objective devices --target-rate 300 --out out
    rnb-tune -c config/streams-example.json --cpu-slots 1 --objective streams --fps 30 --out out

Profile each step alone through the harness, predict every candidate with a
discrete-event simulation, search, run the best few for real through the
sweep, and report (docs/tuner.md).  A second run with the same arguments
reuses the profiles and every finished measurement.

Exit codes: 0 a best configuration was found and written to DIR/best.json;
1 failed after profiling started (a step failed while profiling, or no
finalist met the bound as measured); 2 invalid request (arguments, config,
a budget that cannot hold the pipeline, GPUs); 130 interrupted (what was
measured is kept).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

import rnb.flags as flags
from rnb.analysis.jobs import JobLogError, ValidityRules
from rnb.analysis.sweep import RunOutcome, SweepError, run_benchmark
from rnb.console import terminal_logging
from rnb.engines.registry import EngineUnavailable
from rnb.pipeline.config import ConfigError, parse_config
from rnb.pipeline.gpus import GpuRequestError, validate_gpus
from rnb.tune.cli_flags import add_flags, check_flags
from rnb.tune.estimate import Estimator
from rnb.tune.hosts import hosts_of
from rnb.tune.profile import SAMPLE_INTERVAL_MS, Bench, Profile, ProfileError, ProfileJob, ProfileKey
from rnb.tune.profile_cache import ProfileCache, profile_all
from rnb.tune.profile_plan import plan_profiles
from rnb.tune.report import BEST, REPORT, Outcome, Request, resolution_note, winner_of, write_report
from rnb.tune.search import Evaluated, Goal, Memory, Search, choose_mode, finalists, search
from rnb.tune.sim_records import EstimateError
from rnb.tune.space import Budget, TuneRequestError, TuneSpace
from rnb.tune.streams import StreamGoal, measure_finalist, stream_finalists
from rnb.tune.streams_report import StreamOutcome, write_streams_report
from rnb.tune.tuning_config import read_space
from rnb.tune.verify import Verified, VerifySettings, closest, verify

log = logging.getLogger(__name__)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = flags.CommandParser("rnb-tune", __doc__.splitlines()[0])
    add_flags(parser)
    args = parser.parse_args(argv)
    check_flags(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with terminal_logging("rnb-tune"), logging_redirect_tqdm():
        return _tune(args)


def read_request(args: argparse.Namespace) -> TuneSpace:
    """The tuning config and budget, checked together before anything runs."""
    path = Path(args.config)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(str(path), "(file)", f"expected a readable JSON file, found an error: {error.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(str(path), "(file)", f"expected valid JSON, found {error}") from None
    budget = Budget(tuple(args.gpus or ()), args.cpu_slots)
    return read_space(document, str(path), budget, args.batch, args.segments, args.max_replicas)


def _bench_and_memory(space: TuneSpace, engine: str, address: str | None) -> tuple[Bench, Memory]:
    """Where profiles are measured and what each device holds; GPUs are checked (exit 2 when absent or busy),
    and a Ray cluster is asked where its nodes are (exit 2 when it cannot be reached)."""
    bench, memory = _devices(space, engine)
    try:
        hosts = hosts_of(space.config, engine, address, bench.cores.usable)
    except EngineUnavailable as error:
        raise TuneRequestError(str(error)) from None
    return dataclasses.replace(bench, hosts=hosts), memory


def _devices(space: TuneSpace, engine: str) -> tuple[Bench, Memory]:
    if space.budget.cpu_only:
        return Bench("cpu", engine), Memory({}, psutil.virtual_memory().available)
    document = space.document_for(space.minimal())
    try:
        infos = validate_gpus(parse_config(document, space.config.path), cpu_only=False)
    except GpuRequestError as error:
        raise TuneRequestError(f"{error}; to tune on the CPU give --cpu-slots N in place of --gpus.") from None
    by_index = {info.logical_index: info for info in infos}
    first = by_index[space.budget.gpus[0]]
    return (Bench(first.name, engine, space.budget.gpus[0]),
            Memory({i: info.memory_total_bytes for i, info in by_index.items()}, psutil.virtual_memory().available))


@contextlib.contextmanager
def _job_output(out: Path) -> Iterator[IO[str]]:
    """Where the children's own summaries go: DIR/tune.log, so the terminal keeps the progress bars."""
    with open(out / "tune.log", "a", encoding="utf-8") as handle:
        yield handle


def _tune(args: argparse.Namespace) -> int:
    started = time.monotonic()
    ready = _ready(args)
    if isinstance(ready, int):
        return ready
    space, bench, memory = ready
    out: Path = args.out
    streams = StreamGoal.of(space, args.fps, args.streams_bound, args.deadline_ms) if args.objective == "streams" else None
    bound_ms = args.latency_bound_ms if streams is None else streams.deadline_ms
    settings = _verify_settings(args, bound_ms)
    goal = Goal("throughput" if streams is not None else args.objective, args.target_rate)
    mode = choose_mode(space, args.search)
    seconds: dict[str, float] = {}
    try:
        with _job_output(out) as output:
            profiles = _profile(space, bench, args, out, output)
            seconds["profile"] = time.monotonic() - started
            phase = time.monotonic()
            estimator = Estimator(space, profiles, bench, bound_ms, args.percentile, args.sim_items, args.seed)
            with tqdm(desc="rnb-tune: predict", unit=" candidates", file=sys.stderr, leave=False) as bar:
                found = search(space, estimator, goal, memory, mode, args.trials, args.seed, lambda e: bar.update())
            seconds["search"] = time.monotonic() - phase
            if streams is not None:
                asked = StreamRequest(str(args.config), space.budget.describe(), streams, mode, args.engine)
                return _tune_streams(space, found, asked, out, settings, output, args.top,
                                     _labelled(space, bench, args, profiles), seconds)
            phase = time.monotonic()
            verified = _verify_finalists(space, found, args.top, out, settings, output, goal)
            if verified is None:
                return 1
            seconds["verify"] = time.monotonic() - phase
    except KeyboardInterrupt:
        print(f"rnb-tune: interrupted; the profiles and runs measured so far are kept in {out}, and a second run "
              "with the same arguments reuses them.", file=sys.stderr)
        return 130
    except (ProfileError, EstimateError, SweepError, JobLogError) as error:
        print(f"rnb-tune: {error}", file=sys.stderr)
        return 1
    request = Request(str(args.config), space.budget.describe(), goal, bound_ms, args.percentile, mode, args.engine)
    outcome = Outcome(request, found, tuple(verified), winner_of(verified, space, goal),
                      tuple(_labelled(space, bench, args, profiles)), seconds)
    write_report(out, space, outcome, settings)
    print(_summary(space, outcome, out))
    if outcome.winner is None:
        print(f"rnb-tune: {_impossible(space, verified, args)}", file=sys.stderr)
        return 1
    return 0


def _verify_settings(args: argparse.Namespace, bound_ms: float) -> VerifySettings:
    """How every finalist's jobs run and are judged, from the flags."""
    rules = ValidityRules(min_duration_s=args.min_duration, min_items=args.min_items)
    extra = ("--ray-address", args.ray_address) if args.ray_address else ()
    return VerifySettings(bound_ms, args.percentile, args.engine, args.verify_steps, args.verify_seconds, args.warmup,
                          rules, args.max_reruns, args.timeout, extra, args.verify_repeats)


def _ready(args: argparse.Namespace) -> tuple[TuneSpace, Bench, Memory] | int:
    """The request checked, the devices found and DIR made; else the exit code (2), its sentence printed."""
    try:
        space = read_request(args)
        bench, memory = _bench_and_memory(space, args.engine, args.ray_address)
    except (ConfigError, TuneRequestError) as error:
        print(f"rnb-tune: {error}", file=sys.stderr)
        return 2
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"rnb-tune: {args.out}: cannot hold the tuner's files ({error.strerror}).", file=sys.stderr)
        return 2
    return space, bench, memory


def _verify_finalists(space: TuneSpace, found: Search, top: int, out: Path, settings: VerifySettings,
                      output: IO[str], goal: Goal) -> list[Verified] | None:
    """The best-ranked predictions run for real; None (its sentence printed) where no candidate fits."""
    chosen = finalists(found, top)
    if not chosen:
        print(f"rnb-tune: no candidate fits the budget and memory ({next(iter(found.pruned.values()), '-')}).",
              file=sys.stderr)
        return None
    hopeless = all(e.estimate.rate_per_s is None for e in chosen)
    if hopeless:   # predicted to miss the bound everywhere: one job of the closest shows what it does
        log.info("no candidate is predicted to meet the bound; measuring the closest once")
        chosen = chosen[:1]
    return _verify(space, chosen, out, settings, output, goal, widen=not hopeless)


@dataclasses.dataclass(frozen=True)
class StreamRequest:
    """What --objective streams was asked, as its report repeats it."""

    config: str
    budget: str
    goal: StreamGoal
    search: str
    engine: str


def _tune_streams(space: TuneSpace, found: Search, request: StreamRequest, out: Path, settings: VerifySettings,
                  output: IO[str], top: int, profiles: Sequence[tuple[str, Profile]], seconds: dict[str, float]) -> int:
    """--objective streams after the search: rank by predicted streams, measure the finalists, report (0, or 1 when
    none sustained one stream)."""
    goal = request.goal
    ranked = stream_finalists(found, goal)
    phase = time.monotonic()
    measured = [measure_finalist(space, finalist, goal, out, settings, output)
                for finalist in tqdm(ranked[:top], desc="rnb-tune: verify", unit=" finalists", file=sys.stderr)]
    seconds["verify"] = time.monotonic() - phase
    outcome = StreamOutcome(request.config, request.budget, goal, request.search, request.engine, tuple(ranked),
                            tuple(measured), tuple(profiles), seconds)
    print(write_streams_report(out, space, outcome, settings.rules))
    if outcome.winner is None:
        print(f"rnb-tune: no finalist sustained one stream at {goal.fps:g} fps with at most {goal.bound:.1%} of its "
              f"frames past the {goal.deadline_ms:g} ms deadline.", file=sys.stderr)
        return 1
    return 0


def _profile(space: TuneSpace, bench: Bench, args: argparse.Namespace, out: Path,
             output: IO[str]) -> dict[ProfileKey, Profile]:
    jobs = plan_profiles(space, bench, args.profile_calls)
    log_dir = out / "logs" / "profiles"
    extra = ["--engine", args.engine, *(["--ray-address", args.ray_address] if args.ray_address else [])]

    def run(config_path: Path, videos: int) -> RunOutcome:
        return run_benchmark(str(config_path), 0.0, log_dir, ["-v", str(videos), "--warmup", "0", "--sample-interval-ms",
                                                              str(SAMPLE_INTERVAL_MS), *extra],
                             timeout_s=args.timeout, output=output)

    with tqdm(total=len(jobs), desc="rnb-tune: profile", unit=" jobs", file=sys.stderr) as bar:
        def progress(job: ProfileJob, cached: bool) -> None:
            bar.set_postfix_str(f"{job.what}{' (cached)' if cached else ''}")
            bar.update()
        return profile_all(jobs, ProfileCache(out / "profiles"), run, progress)


SKIP_BELOW = 0.5   # a finalist predicted under this fraction of the best measured rate cannot win: not run


def _labelled(space: TuneSpace, bench: Bench, args: argparse.Namespace,
              profiles: Mapping[ProfileKey, Profile]) -> list[tuple[str, Profile]]:
    """Each profile with what it measured, in the order they were taken."""
    rows = []
    for job in plan_profiles(space, bench, args.profile_calls):
        rows.append((job.what, profiles[job.key]))
        if job.batcher_key is not None:
            rows.append((f"the Batcher before {job.what}", profiles[job.batcher_key]))
    return rows


def _verify(space: TuneSpace, chosen: Sequence[Evaluated], out: Path, settings: VerifySettings,
            output: IO[str], goal: Goal, widen: bool) -> list[Verified]:
    """The finalists measured in rank order; with the throughput objective, one predicted to serve less than
    half of what an earlier finalist measured is left out (it cannot win, and slow rates make long jobs)."""
    verified: list[Verified] = []
    per = (2 + settings.max_steps) * settings.repeats
    with tqdm(total=per * len(chosen), desc="rnb-tune: verify", unit=" runs", file=sys.stderr) as bar:
        for evaluated in chosen:
            measured = max((v.rate for v in verified), default=0.0)
            if goal.objective == "throughput" and evaluated.rate < SKIP_BELOW * measured:
                log.info("%s is not verified: predicted %.4g req/s, under half of the %.4g measured",
                         space.short_label(evaluated.candidate), evaluated.rate, measured)
                bar.update(per)
                continue
            bar.set_postfix_str(space.short_label(evaluated.candidate))
            done = verify(space, evaluated.candidate, evaluated.rate or evaluated.estimate.capacity_per_s * 0.5, out,
                          settings, output, lambda trial: bar.update(), widen)
            verified.append(done)
            bar.n = max(bar.n, per * len(verified))
            bar.refresh()
    return verified


def _summary(space: TuneSpace, outcome: Outcome, out: Path) -> str:
    q = outcome.request.percentile
    lines = []
    for index, verified in enumerate(outcome.verified, start=1):
        best = verified.best
        measured = "no measured rate met the bound" if best is None else \
            f"{best.rate_per_s:.4g} req/s, p{q:g} {best.latency_ms:.3g} ms"
        predicted = outcome.search.evaluated[verified.candidate].rate
        lines.append(f"finalist {index}: {space.short_label(verified.candidate)}  predicted {predicted:.4g} req/s; "
                     f"measured {measured}")
    if outcome.winner is not None:
        lines.append(f"best: {space.label(outcome.winner.candidate)}; {resolution_note(outcome.winner)}")
        lines.append(f"wrote {out / BEST}, {out / REPORT}")
    else:
        lines.append(f"wrote {out / REPORT}")
    return "\n".join(lines)


def _impossible(space: TuneSpace, verified: Sequence[Verified], args: argparse.Namespace) -> str:
    """The one sentence saying that no finalist met the bound, and the closest thing measured."""
    bound = f"p{args.percentile:g} < {args.latency_bound_ms:g} ms"
    near = closest(verified)
    if near is None:
        return f"no finalist met {bound}, and none was measured."
    finalist, trial = near
    latency = ("did not reach its target" if math.isinf(trial.latency_ms)
               else f"had p{args.percentile:g} {trial.latency_ms:.3g} ms")
    job = f" (job {trial.job_dir})" if trial.job_dir is not None else ""
    return (f"no candidate meets {bound} on {space.budget.describe()}: the closest measured, "
            f"{space.short_label(finalist.candidate)}, {latency} at {trial.rate_per_s:.4g} req/s{job}.")


if __name__ == "__main__":
    sys.exit(main())
