"""Search: which candidates to predict, and in what order they rank.

Exhaustive search predicts every candidate of the grid (replica counts x
batches x segments, GPU placement dealt round robin).  Quick search starts
from one replica per group, each Batcher at the batch whose profile serves
the most items per second, and relieves the predicted bottleneck one move at
a time: a replica more, a batch up or down, a replica moved from the least
busy group or to a freer GPU; it keeps the best neighbour while it ranks
better and stops at a local optimum.  Optuna's TPE sampler (`--search
optuna`) searches the same space where it is installed.

Constraints prune before anything is simulated: the budget (CPU slots,
GPUs), and device memory (each replica's profiled peak plus its output
slots, per GPU; the replicas' peak RSS against the host's memory).  The
latency bound is part of every prediction: a candidate's figure is its
predicted peak rate under it.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from rnb.tune.estimate import Estimator
from rnb.tune.moves import Neighbours
from rnb.tune.profile import Bench, Profile, ProfileKey
from rnb.tune.profile_plan import forms_of, profile_key, unit_plan
from rnb.tune.sim_records import PeakEstimate
from rnb.tune.space import Candidate, GroupChoices, TuneSpace

log = logging.getLogger(__name__)

Objective = Literal["throughput", "devices"]
SearchMode = Literal["exhaustive", "quick", "optuna"]
AUTO_EXHAUSTIVE_MAX = 256   # `--search auto` is exhaustive up to this many candidates, quick beyond
GPU_CONTEXT_BYTES = 512 * 2**20   # a CUDA process's context where its profile could not see it (NVML blind)


@dataclass(frozen=True)
class Goal:
    """Most items/s under the bound, or the fewest devices that serve `target_rate` under it."""

    objective: Objective = "throughput"
    target_rate: float | None = None


@dataclass(frozen=True)
class Evaluated:
    """A candidate with its prediction."""

    candidate: Candidate
    estimate: PeakEstimate
    devices: int

    @property
    def rate(self) -> float:
        return self.estimate.rate_per_s or 0.0


def rank(goal: Goal, evaluated: Evaluated, percentile: float) -> tuple[float, ...]:
    """A sort key, best first.  Ties go to fewer devices, then to the lower latency at the lowest rate tried."""
    closest = evaluated.estimate.lowest.percentile_ms(percentile)
    if goal.objective == "devices" and goal.target_rate is not None:
        if evaluated.rate >= goal.target_rate:
            return (0.0, evaluated.devices, -evaluated.rate, closest)
        return (1.0, -evaluated.rate, evaluated.devices, closest)
    return (-evaluated.rate, evaluated.devices, closest)


@dataclass(frozen=True)
class Memory:
    """What each device holds: total bytes per GPU index, and the host's available bytes (None: unchecked)."""

    gpu_bytes: Mapping[int, int]
    host_bytes: int | None = None


def memory_problem(space: TuneSpace, candidate: Candidate, profiles: Mapping[ProfileKey, Profile], bench: Bench,
                   memory: Memory) -> str | None:
    """Why a candidate does not fit in memory (one phrase), or None when it fits.

    A replica needs its profiled peak (on a GPU what NVML saw its process
    hold, else its allocator's peak plus a CUDA context) and its output
    slots, which the main process allocates on the replica's device.
    """
    plan = unit_plan(space)
    forms = forms_of(space, candidate)
    on_gpu: dict[int, int] = {}
    on_host = 0
    for g in space.groups:
        profile = profiles.get(profile_key(space, plan, g, forms[(g.step, g.group)], bench))
        if profile is None:
            continue
        slots = space.config.steps[g.step].num_shared_tensors * profile.output_bytes
        for device in candidate.group(g.step, g.group).devices:
            if device >= 0:
                on_gpu[device] = on_gpu.get(device, 0) + (profile.peak_device_bytes or GPU_CONTEXT_BYTES) + slots
            else:
                on_host += (profile.peak_rss_bytes or 0) + slots
    for device, need in sorted(on_gpu.items()):
        total = memory.gpu_bytes.get(device)
        if total is not None and need > total:
            return f"GPU {device} would need {need / 2**30:.3g} GiB of its {total / 2**30:.3g} GiB"
    if memory.host_bytes is not None and on_host > memory.host_bytes:
        return f"the CPU replicas would need {on_host / 2**30:.3g} GiB of the {memory.host_bytes / 2**30:.3g} GiB available"
    return None


class Search:
    """The candidates predicted so far, each once, and the constraints every one must meet."""

    def __init__(self, space: TuneSpace, estimator: Estimator, goal: Goal, memory: Memory,
                 progress: Callable[[Evaluated], None] = lambda evaluated: None) -> None:
        self.space = space
        self.estimator = estimator
        self.goal = goal
        self.memory = memory
        self.progress = progress
        self.evaluated: dict[Candidate, Evaluated] = {}
        self.pruned: dict[Candidate, str] = {}   # candidate -> why it was not predicted

    def allowed(self, candidate: Candidate) -> bool:
        if not self.space.within_budget(candidate):
            return False
        if candidate in self.pruned:
            return False
        problem = memory_problem(self.space, candidate, self.estimator.profiles, self.estimator.bench, self.memory)
        if problem is not None:
            self.pruned[candidate] = f"does not fit: {problem}"
            return False
        return True

    def evaluate(self, candidate: Candidate) -> Evaluated:
        if candidate not in self.evaluated:
            evaluated = Evaluated(candidate, self.estimator.peak(candidate), self.space.devices_used(candidate))
            self.evaluated[candidate] = evaluated
            self.progress(evaluated)
        return self.evaluated[candidate]

    def key(self, evaluated: Evaluated) -> tuple[float, ...]:
        return rank(self.goal, evaluated, self.estimator.percentile)

    def ranked(self) -> list[Evaluated]:
        return sorted(self.evaluated.values(), key=lambda e: (*self.key(e), e.candidate.key))

    # ------------------------------------------------------------ exhaustive

    def exhaustive(self) -> list[Evaluated]:
        for candidate in self.space.grid():
            if self.allowed(candidate):
                self.evaluate(candidate)
        return self.ranked()

    # ------------------------------------------------------------ quick

    def quick(self, max_moves: int = 200) -> list[Evaluated]:
        """Relieve the predicted bottleneck move by move while a neighbour ranks better.

        A candidate that meets the bound at no rate has no bottleneck to
        relieve: from it the search tries every single change and climbs
        towards the bound (the lowest percentile at the lowest rate tried)
        until a candidate meets it, then relieves bottlenecks from there.
        """
        current = self.evaluate(self.start())
        for _ in range(max_moves):
            neighbours = [self.evaluate(c) for c in self.moves(current) if self.allowed(c)]
            if not neighbours:
                break
            best = min(neighbours, key=lambda e: (*self._climb(e), e.candidate.key))
            if self._climb(best) >= self._climb(current):
                break
            log.info("quick search: %s -> %s (%.4g items/s)", self.space.short_label(current.candidate),
                     self.space.short_label(best.candidate), best.rate)
            current = best
        return self.ranked()

    def start(self) -> Candidate:
        """One replica per group; each Batcher at the batch its group serves the most items per second at."""
        batches = {}
        for batcher in self.space.batcher_groups:
            fed = self.space.feeds(batcher)
            best, best_rate = min(batcher.batches), -math.inf
            for batch in batcher.batches:
                trial = self.space.minimal({(batcher.step, batcher.group): batch})
                rate = min((self._replica_rate(trial, g) for g in fed), default=0.0)
                if rate > best_rate:
                    best, best_rate = batch, rate
            batches[(batcher.step, batcher.group)] = best
        return self.space.minimal(batches)

    def _climb(self, evaluated: Evaluated) -> tuple[float, ...]:
        """The quick search's order: meeting the bound first, by rank; then closeness to the bound."""
        if evaluated.estimate.rate_per_s is None:
            return (1.0, evaluated.estimate.lowest.percentile_ms(self.estimator.percentile))
        return (0.0, *self.key(evaluated))

    def _replica_rate(self, candidate: Candidate, g: GroupChoices) -> float:
        pipeline = self.estimator.pipeline(candidate)
        sim = next(s for s in pipeline.groups if s.name == g.name)
        cards = len(sim.service.partial) or 1
        return cards / max(sim.service.mean_emit, 1e-9)

    def moves(self, current: Evaluated) -> list[Candidate]:
        """The neighbours that relieve the bottleneck of the current candidate, or trade replicas towards it.

        A CPU replica more is not among them while the host's cores bound the
        candidate's capacity: the cores could not run it.
        """
        if current.estimate.rate_per_s is None:
            return self.single_changes(current.candidate)
        prediction = current.estimate.at_peak or current.estimate.lowest
        around = Neighbours.of(self.space, current.candidate, prediction.busy)
        cores_full = self.estimator.pipeline(current.candidate).bound_by_cores()
        if not (cores_full and -1 in current.candidate.group(*around.where).devices):
            around.add({**around.replicas, around.where: around.replicas[around.where] + 1})
        around.batches_beside_the_neck()
        around.trades_from_the_idlest()
        around.segments_beside_the_neck()
        around.the_neck_on_a_freer_gpu()
        return [c for c in around.made if c != current.candidate]

    def single_changes(self, candidate: Candidate) -> list[Candidate]:
        """Every neighbour one change away: a replica more of a group, a batch or a step's segments one choice
        up or down (GPU replicas placed as the space deals them)."""
        space = self.space
        replicas = space.replicas_of(candidate)
        batches = space.batches_of(candidate)
        segments = list(space.segments_of(candidate))
        result = [space.candidate({**replicas, key: count + 1}, batches, segments) for key, count in replicas.items()]
        for batcher in space.batcher_groups:
            key = (batcher.step, batcher.group)
            choices = sorted(batcher.batches)
            at = choices.index(batches[key])
            result += [space.candidate(replicas, {**batches, key: choices[other]}, segments)
                       for other in (at - 1, at + 1) if 0 <= other < len(choices)]
        for step, options in enumerate(space.segments):
            choices = list(options)
            at = choices.index(segments[step])
            result += [space.candidate(replicas, batches, [*segments[:step], choices[other], *segments[step + 1:]])
                       for other in (at - 1, at + 1) if 0 <= other < len(choices)]
        return [c for c in result if c != candidate]

    # ------------------------------------------------------------ optuna

    def optuna(self, trials: int, seed: int) -> list[Evaluated]:
        """Optuna's TPE sampler over replica counts, batches and segments; over-budget trials score worst."""
        try:
            import optuna
        except ImportError:
            raise RuntimeError("--search optuna needs the optuna package (pip install optuna).") from None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = self.space

        def objective(trial: optuna.Trial) -> float:
            replicas = {(g.step, g.group): trial.suggest_int(f"replicas {g.name}", 1, space.max_replicas)
                        for g in space.tuned_groups}
            batches = {(g.step, g.group): trial.suggest_categorical(f"batch {g.name}", list(g.batches))
                       for g in space.batcher_groups}
            segments = [trial.suggest_categorical(f"segments step {k}", list(choices)) if len(choices) > 1 else choices[0]
                        for k, choices in enumerate(space.segments)]
            candidate = space.candidate(replicas, batches, segments)
            if not self.allowed(candidate):
                return -1e18
            return -_scalar(self.key(self.evaluate(candidate)))

        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        study.optimize(objective, n_trials=trials)
        return self.ranked()


def _scalar(key: tuple[float, ...]) -> float:
    """A rank key folded into one number for Optuna (lower is better), each element dominating the next."""
    value = 0.0
    for weight, element in zip((1e12, 1e6, 1.0), key):
        value += weight * max(min(element, 1e5), -1e5)
    return value


def search(space: TuneSpace, estimator: Estimator, goal: Goal, memory: Memory, mode: SearchMode,
           trials: int = 60, seed: int = 0, progress: Callable[[Evaluated], None] = lambda e: None) -> Search:
    """Run one search mode to its end; the Search holds every prediction made and every candidate pruned."""
    found = Search(space, estimator, goal, memory, progress)
    if mode == "exhaustive":
        found.exhaustive()
    elif mode == "quick":
        found.quick()
    else:
        found.optuna(trials, seed)
    return found


def finalists(found: Search, count: int) -> list[Evaluated]:
    """The `count` best-ranked predictions: what verification runs for real."""
    return found.ranked()[:count]


def choose_mode(space: TuneSpace, requested: SearchMode | Literal["auto"]) -> SearchMode:
    if requested != "auto":
        return requested
    size = 0
    for _ in space.grid():
        size += 1
        if size > AUTO_EXHAUSTIVE_MAX:
            return "quick"
    return "exhaustive"
