"""The tuner's estimator against queueing cases worked out by hand (no processes, no clocks)."""
from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from rnb.core.termination import POLL_S
from rnb.load import LoadSettings
from rnb.tune.estimate import peak_rate
from rnb.tune.sim_records import Arrivals, Background, Service, SimGroup, SimPipeline
from rnb.tune.simulation import Simulation, simulate


def chain(*services: Service, replicas: tuple[int, ...] = (), slots: int = 10, batch_at: dict[int, int] | None = None,
          splits: dict[int, int] | None = None, merges: tuple[int, ...] = (), devices: dict[int, tuple[int, ...]] | None = None
          ) -> SimPipeline:
    """A linear pipeline of one group per step, on the CPU unless `devices` says otherwise."""
    last = len(services) - 1
    groups = []
    for k, service in enumerate(services):
        count = replicas[k] if replicas else 1
        groups.append(SimGroup(
            name=f"step {k}", step=k, devices=(devices or {}).get(k, (-1,) * count), in_queue=None if k == 0 else 0,
            out_queues=() if k == last else (0,), slots=0 if k == last else slots, service=service,
            splits=(splits or {}).get(k, 1), batch=(batch_at or {}).get(k), merges=k in merges))
    return SimPipeline(tuple(groups), len(services))


def ms(value: float) -> Service:
    return Service.constant(value / 1000.0)


def test_a_single_deterministic_step_under_poisson_load_waits_as_m_d_1_says() -> None:
    # M/D/1 at rho = 0.5: mean wait rho * S / (2 (1 - rho)) = 5 ms on top of the 10 ms service.
    prediction = simulate(chain(ms(10)), Arrivals.poisson(50.0), items=40000)
    assert prediction.mean_latency_ms == pytest.approx(15.0, rel=0.03)
    assert prediction.throughput_items_per_s == pytest.approx(50.0, rel=0.03)
    assert prediction.busy["step 0"] == pytest.approx(0.5, rel=0.03)


def test_a_deterministic_pipeline_in_bulk_runs_at_its_slowest_stage() -> None:
    prediction = simulate(chain(ms(8), ms(12), ms(3)), Arrivals("bulk"), items=3000, seed=1, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(1000 / 12, rel=0.002)
    assert prediction.bottleneck == "step 1"
    assert prediction.busy["step 1"] == pytest.approx(1.0, abs=0.01)
    assert prediction.busy["step 0"] == pytest.approx(8 / 12, abs=0.01)


def test_replicas_multiply_a_stage_capacity_until_another_stage_bounds_it() -> None:
    two = simulate(chain(ms(8), ms(12), ms(3), replicas=(1, 2, 1)), Arrivals("bulk"), items=3000, warmup=0)
    assert two.throughput_items_per_s == pytest.approx(125.0, rel=0.002)
    assert two.bottleneck == "step 0"
    assert chain(ms(8), ms(12), ms(3), replicas=(1, 2, 1)).capacity_per_s() == pytest.approx(125.0)


def test_one_output_slot_holds_the_producer_until_the_consumer_takes_its_item() -> None:
    simulation = Simulation(chain(ms(1), ms(10), slots=1), Arrivals("bulk"), items=500, warmup=0)
    prediction = simulation.run()
    assert prediction.throughput_items_per_s == pytest.approx(100.0, rel=0.005)
    # The producer is busy 1 ms in 10; the queue between the steps never holds more than its one slot.
    assert prediction.busy["step 0"] == pytest.approx(0.1, abs=0.005)
    assert simulation.queues[(1, 0)].most == 1
    roomy = Simulation(chain(ms(1), ms(10), slots=50), Arrivals("bulk"), items=500, warmup=0)
    roomy.run()
    assert roomy.queues[(1, 0)].most == 50


def test_back_pressure_of_one_slot_costs_throughput_when_the_consumer_varies() -> None:
    varying = Service((0.001, 0.009))        # mean 5 ms, as the producer's
    tight = simulate(chain(ms(5), varying, slots=1), Arrivals("bulk"), items=4000, seed=3, warmup=0)
    roomy = simulate(chain(ms(5), varying, slots=64), Arrivals("bulk"), items=4000, seed=3, warmup=0)
    assert roomy.throughput_items_per_s == pytest.approx(200.0, rel=0.03)
    assert tight.throughput_items_per_s < 0.93 * roomy.throughput_items_per_s


def test_a_closed_loop_of_one_request_runs_the_steps_one_after_the_other() -> None:
    prediction = simulate(chain(ms(8), ms(12), ms(3)), Arrivals("closed", concurrency=1), items=300)
    assert prediction.throughput_items_per_s == pytest.approx(1000 / 23, rel=0.005)
    assert prediction.latency_ms[50.0] == pytest.approx(23.0, rel=0.001)


def test_the_batcher_hands_over_full_batches_under_load() -> None:
    # Batcher (batch 4, no cost) then a network of 6 + 1.5 x 4 = 12 ms per batch: 4 items per 12 ms in bulk.
    network = Service((0.012,), inside=(0.012,), partial=(7.5 / 12, 9 / 12, 10.5 / 12, 1.0))
    pipeline = chain(ms(0.01), Service.constant(0.0), network, batch_at={1: 4})
    prediction = simulate(pipeline, Arrivals("bulk"), items=4000, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(1000 * 4 / 12, rel=0.005)


def test_an_idle_batcher_flushes_a_partial_batch_after_a_poll_interval() -> None:
    # One request a second: every batch of 4 is handed over alone, one poll interval after its item arrived.
    network = Service((0.012,), partial=(7.5 / 12, 9 / 12, 10.5 / 12, 1.0))
    pipeline = chain(ms(1), Service.constant(0.0), network, batch_at={1: 4})
    prediction = simulate(pipeline, Arrivals.poisson(1.0), items=200)
    assert prediction.latency_ms[50.0] == pytest.approx(1 + POLL_S * 1000 + 7.5, abs=0.1)


def test_segments_run_in_parallel_on_replicas_and_merge_before_the_item_finishes() -> None:
    # A loader of 2 ms splits each item in two; each half takes 5 ms on a network replica; a merge of 1 ms.
    half = ms(5)
    split = chain(ms(2), half, ms(1), replicas=(1, 2, 1), splits={0: 2}, merges=(2,))
    whole = chain(ms(2), ms(10), ms(1), replicas=(1, 2, 1), merges=(2,))
    quiet = Arrivals.poisson(2.0)   # items alone: no queueing
    assert simulate(split, quiet, items=100).latency_ms[50.0] == pytest.approx(2 + 5 + 1 + 1, abs=0.01)
    assert simulate(whole, quiet, items=100).latency_ms[50.0] == pytest.approx(2 + 10 + 1, abs=0.01)
    # In bulk both halves of every item pass: two replicas serve 2 halves per 5 ms, one item per 5 ms.
    assert simulate(split, Arrivals("bulk"), items=2000, warmup=0).throughput_items_per_s == pytest.approx(200.0, rel=0.01)


def test_replicas_on_one_gpu_take_turns_inside_their_calls() -> None:
    inside_only = Service.constant(0.010)   # the whole call is device work
    shared = chain(ms(0.01), inside_only, replicas=(1, 2), devices={1: (0, 0)})
    apart = chain(ms(0.01), inside_only, replicas=(1, 2), devices={1: (0, 1)})
    assert simulate(shared, Arrivals("bulk"), items=2000, warmup=0).throughput_items_per_s == pytest.approx(100.0, rel=0.01)
    assert simulate(apart, Arrivals("bulk"), items=2000, warmup=0).throughput_items_per_s == pytest.approx(200.0, rel=0.01)


def test_round_robin_selection_splits_a_producer_s_items_evenly_between_its_queues() -> None:
    groups = (SimGroup("step 0", 0, (-1,), None, (0, 1), 10, ms(1)),
              SimGroup("step 1", 1, (-1,), 0, (), 0, ms(4)),
              SimGroup("step 1 group 1", 1, (-1,), 1, (), 0, ms(4)))
    prediction = simulate(SimPipeline(groups, 2), Arrivals("bulk"), items=2000, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(500.0, rel=0.01)
    assert prediction.busy["step 1"] == pytest.approx(prediction.busy["step 1 group 1"], abs=0.01)


def test_the_peak_rate_under_a_bound_sits_between_a_passing_and_a_failing_simulation() -> None:
    pipeline = chain(ms(10))
    peak = peak_rate(pipeline, bound_ms=40.0, percentile=99.0, items=4000)
    assert peak.capacity_per_s == pytest.approx(100.0)
    assert peak.rate_per_s is not None and 10.0 < peak.rate_per_s < 100.0
    assert peak.at_peak is not None and peak.at_peak.latency_ms[99.0] < 40.0
    assert simulate(pipeline, Arrivals.poisson(peak.rate_per_s * 1.1), items=4000, seed=0, percentiles=(99.0,)
                    ).latency_ms[99.0] >= 40.0
    assert peak_rate(pipeline, bound_ms=5.0, percentile=99.0, items=500).rate_per_s is None


def test_one_camera_stream_at_30_fps_into_a_40_ms_step_is_predicted_late_on_every_frame() -> None:
    # Worked by hand as in tests/load/test_streams.py: a frame every 33.3 ms into a step of 40 ms. The step runs
    # back to back at 25 frames/s, and frame k waits 6.7 ms longer than frame k-1: none meets 33.3 ms.
    arrivals = Arrivals.of_load(LoadSettings(streams=1, fps=30), seed=0, items=300)
    assert arrivals.kind == "trace" and arrivals.times[:3] == pytest.approx((0.0, 1 / 30, 2 / 30))
    prediction = simulate(chain(ms(40)), arrivals, items=300, warmup=0)
    assert prediction.throughput_items_per_s == pytest.approx(25.0, rel=1e-6)
    assert prediction.latency_ms[50.0] > 1000 / 30 and prediction.mean_latency_ms > 40.0
    # Two streams at 30 fps into a step of 12 ms (the streams example): 60 frames/s of 83 served on time.
    served = simulate(chain(ms(12)), Arrivals.of_load(LoadSettings(streams=2, fps=30), 0, 600), items=600, warmup=0)
    assert served.latency_ms[99.0] == pytest.approx(12.0, abs=1e-6)


def test_every_benchmark_load_mode_has_its_simulated_arrivals() -> None:
    poisson = Arrivals.of_load(LoadSettings(mean_interval_ms=4), 0, 10)
    assert poisson.kind == "trace" and len(poisson.times) == 10 and list(poisson.times) == sorted(poisson.times)
    assert Arrivals.of_load(LoadSettings(mean_interval_ms=0), 0, 10) == Arrivals("bulk")
    assert Arrivals.of_load(LoadSettings(concurrency=3), 0, 10) == Arrivals("closed", concurrency=3)
    scheduled = Arrivals.of_load(LoadSettings(rate_schedule="100@10s"), 0, 50)
    assert scheduled.kind == "trace" and len(scheduled.times) == 50 and list(scheduled.times) == sorted(scheduled.times)



def test_a_poisson_load_is_simulated_with_the_arrivals_its_client_draws_from_its_seed() -> None:
    # The client sends request k at the k-th due time of rnb.load's draw: gaps of random.Random(seed).expovariate.
    # The p99 of a few hundred items depends on that draw as much as on the pipeline, so a prediction to hold
    # against a job must offer the job's own draw, not another of the same rate.
    gaps = random.Random(7)
    due = list(itertools.accumulate(gaps.expovariate(250.0) for _ in range(5)))
    arrivals = Arrivals.of_load(LoadSettings(mean_interval_ms=4), 7, 5)
    assert arrivals.kind == "trace" and arrivals.times == pytest.approx(due)
    # One deterministic step of 6 ms at 75% load: item k leaves at max(its arrival, item k-1's departure) + 6 ms,
    # so every latency, and their p99, follows from the due times by hand.
    drawn = random.Random(3)
    times = list(itertools.accumulate(drawn.expovariate(125.0) for _ in range(300)))
    departed, latencies = 0.0, []
    for arrived in times:
        departed = max(arrived, departed) + 0.006
        latencies.append((departed - arrived) * 1000.0)
    prediction = simulate(chain(ms(6)), Arrivals.of_load(LoadSettings(mean_interval_ms=8), 3, 300), items=300, warmup=0)
    assert prediction.latency_ms[99.0] == pytest.approx(float(np.percentile(latencies, 99.0)), rel=1e-9)
    assert prediction.mean_latency_ms == pytest.approx(float(np.mean(latencies)), rel=1e-9)


def test_each_hop_s_latency_adds_to_every_item_s_time_and_not_to_the_throughput() -> None:
    # Two steps of 8 and 12 ms, one at a time (a closed loop of one): 20 ms; two hops of 5 ms (client -> step 0,
    # step 0 -> step 1) make 30 ms. In bulk the latency only delays the items: step 1 still sets 1 item per 12 ms.
    hops = dataclasses.replace(chain(ms(8), ms(12)), delivery_s=0.005)
    assert simulate(hops, Arrivals("closed", concurrency=1), items=200).latency_ms[50.0] == pytest.approx(30.0)
    assert simulate(hops, Arrivals("bulk"), items=2000, warmup=0).throughput_items_per_s == pytest.approx(
        1000 / 12, rel=0.005)


def test_a_slot_freed_by_a_reply_one_hop_later_bounds_a_producer_of_few_slots() -> None:
    # A 1 ms producer and consumer, a 4 ms hop each way: a slot handed over comes back 4 (to the consumer, which
    # takes it at once) + 4 (the reply) = 8 ms later, by when the producer's next output waits for it. So each
    # slot carries one item per 8 ms: 125 items/s with one slot, 375 with three, whatever the steps could do.
    for slots, rate in ((1, 125.0), (3, 375.0)):
        pipeline = dataclasses.replace(chain(ms(1), ms(1), slots=slots), delivery_s=0.004, release_s=0.004)
        prediction = simulate(pipeline, Arrivals("bulk"), items=3000, warmup=0)
        assert prediction.throughput_items_per_s == pytest.approx(rate, rel=0.01), slots


def test_on_ray_an_item_costs_a_call_at_both_ends_unless_it_rides_behind_an_untaken_one_of_its_producer() -> None:
    # Steps that sleep, one core. One request at a time, 0.5 ms of CPU per call at each end: an item costs two
    # calls (client -> step 0 -> step 1), 2 ms of CPU per 4 ms item. In bulk the second step (3 ms) is always
    # behind: step 0's items ride in the call after the untaken one (rnb.engines.ray.handoffs), so only the
    # first few items cost calls.
    def pipeline(*services: Service, call_s: float, replicas: tuple[int, ...] = ()) -> SimPipeline:
        return dataclasses.replace(chain(*services, replicas=replicas), cores=1.0, background=Background(call_s=call_s))

    one_at_a_time = simulate(pipeline(ms(2), ms(2), call_s=0.0005), Arrivals("closed", concurrency=1), items=400,
                             warmup=0)
    assert one_at_a_time.cores_busy == pytest.approx(0.5, rel=0.01)
    assert one_at_a_time.latency_ms[50.0] == pytest.approx(4.0)   # the calls' CPU runs beside the steps
    backlog = simulate(pipeline(ms(2), ms(3), call_s=0.001), Arrivals("bulk"), items=400, warmup=0)
    assert backlog.cores_busy is not None and backlog.cores_busy < 0.01


def test_on_ray_an_item_that_finds_its_consumer_busy_still_costs_a_call_when_none_of_its_producer_waits() -> None:
    # Two requests 0.5 ms apart every 4 ms, to two 1 ms replicas of step 0, then a 1.5 ms step 1: the second
    # item reaches step 1 while it computes the first, and comes from the other replica, so it goes in a call
    # of its own. Four calls a pair at 0.25 ms of CPU each end: 2 ms per 4 ms.
    pipeline = dataclasses.replace(chain(ms(1), ms(1.5), replicas=(2, 1)), cores=1.0,
                                   background=Background(call_s=0.00025))
    times = tuple(t for pair in range(200) for t in (0.004 * pair, 0.004 * pair + 0.0005))
    prediction = simulate(pipeline, Arrivals("trace", times=times), items=len(times), warmup=0)
    assert prediction.cores_busy == pytest.approx(0.5, rel=0.01)
    assert pipeline.cpu_per_item_s() == pytest.approx(0.001)   # what bounds the capacity: a call per item per hop
