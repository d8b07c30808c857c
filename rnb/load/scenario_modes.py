"""The modes of LoadGen's scenarios: its multi-stream queries on RnB's client, and jobs LoadGen itself drives."""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from rnb.load.mode import Arrival, CurvePoint, LoadMode, logged_number
from rnb.load.poisson import ClosedLoop
from rnb.load.scenarios import CLIENT, SAMPLES_PER_QUERY, SCENARIOS
from rnb.load.settings import LoadSettings


class MultiStream(ClosedLoop):
    """LoadGen's MultiStream: a query of N requests at once, the next query only when all N have finished (a closed
    loop of N whose room is taken a whole query at a time)."""

    name = "multi_stream"
    keys = (SAMPLES_PER_QUERY,)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.scenario == "multi-stream"

    def job_label(self, settings: LoadSettings) -> str:
        return f"ms{settings.samples_per_query}"

    curve = (" (multi-stream)", "samples_per_query", "ms")

    def query_size(self, settings: LoadSettings) -> int:
        return settings.samples_per_query


class LoadGenDriven(LoadMode):
    """MLPerf LoadGen issues the requests of its scenario itself (rnb.engines.loadgen): none of RnB's modes applies."""

    name = "loadgen"
    keys = (CLIENT,)
    # What a LoadGen-driven job reads besides the scenario's own keys; -mi only as Server's target rate.
    reads = ("mean_interval_ms",)

    def chosen(self, settings: LoadSettings) -> bool:
        return settings.client == "loadgen"

    def job_label(self, settings: LoadSettings) -> str:
        spec = SCENARIOS[settings.scenario or "server"]
        rate = f"-mi{settings.mean_interval_ms:g}" if spec.name == "server" else ""
        size = f"{settings.samples_per_query}" if spec.name == "multi-stream" else ""
        return f"lg-{spec.loadgen.lower()}{size}{rate}"

    def refusal(self, settings: LoadSettings, videos: int) -> tuple[str, str] | None:
        if settings.scenario == "server" and settings.mean_interval_ms <= 0:
            return "mean_interval_ms", ("expected a mean gap > 0 ms, LoadGen's Server target rate being 1000 / -mi, "
                                        f"found {settings.mean_interval_ms:g}")
        return None

    def arrivals(self, settings: LoadSettings, seed: int) -> Iterator[Arrival]:
        """LoadGen keeps its schedule to itself: the requests have no due times of RnB's."""
        while True:
            yield Arrival(None)

    def curve_point(self, args: Mapping[str, object]) -> CurvePoint:
        interval = logged_number(args, "mean_interval_ms")
        return CurvePoint(f" (LoadGen {args.get('scenario')})", -interval, f"lg mi {interval:g}")


