"""The Ray a job runs on: a cluster it is given, or one it starts on this machine and stops again.

    --ray-address ADDR (or RAY_ADDRESS)   connect to that cluster; the job leaves it running
    neither, no node labels in the config  start a one-node Ray on 127.0.0.1 for the job
    neither, node labels in the config     start a simulated cluster on 127.0.0.1: a head node
                                            for the driver, plus one node per label
                                            (ray.cluster_utils.Cluster), so a cluster config
                                            runs here as it would on the real cluster

Token authentication: Ray enables it for a cluster that `ray start` starts
where a token exists (~/.ray/auth_token, RAY_AUTH_TOKEN or
RAY_AUTH_TOKEN_PATH), and for the Ray that `ray.init()` starts for a job; but
a driver given an explicit address (`--ray-address`, RAY_ADDRESS) does not
turn it on for itself, and is refused after some 20 s of retries.  Before
connecting, `prepare` asks the cluster's GCS once (one gRPC call, about 10
ms) whether it wants a token and whether this driver's is the right one:
where it does, the driver runs in token mode (RAY_AUTH_MODE=token) and sends
it, authentication staying on; where it does not, a token lying in
~/.ray/auth_token must not turn token mode on either (RAY_AUTH_MODE=
disabled: the cluster has none).  A missing or wrong token is one sentence
at once.

What this module starts listens on the loopback address only.  Ray rewrites
a loopback address given to `ray.init` into this machine's network address
(it assumes a cluster spans machines), which a loopback-only cluster does
not listen on; Ray's own setting RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it
take 127.0.0.1 as this machine's address instead.  Ray reads that setting
when it is imported, so `use_loopback_if_local` must run before anything
imports ray.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from rnb.engines.ray.own_processes import OwnProcesses
from rnb.engines.registry import EngineUnavailable, engine_named
from rnb.engines.stopping import STOPS, handlers_kept

LOOPBACK = "127.0.0.1"
NAMESPACE = "rnb"            # the Ray namespace of every job's named actors
LABEL_KEY = "node"           # a group's "node": "loaders" selects nodes labelled node=loaders
SIMULATED_OBJECT_STORE_BYTES = 200 * 2**20  # per simulated node (they share this machine); past it Ray spills to disk
# For a Ray of the job's own: Ray's memory monitor would kill our actors when this machine's memory runs
# short whoever uses it, where the local engine's processes would carry on; the job's own Ray does without.
OWN_SYSTEM_CONFIG = {"memory_monitor_refresh_ms": 0}
# samples.parquet's name prefix for the cluster's own processes on the driver's machine (raylets, the GCS, agents).
DAEMON_SAMPLES = engine_named("ray").daemon_samples
# How long the driver's Ray waits at shutdown to send its last task events to a GCS, which a SIGTERM to the process
# group may have ended: Ray's default (seconds) would hold a stopped command past its 3 s.
SHUTDOWN_FLUSH_ENV = {"RAY_task_events_shutdown_flush_timeout_ms": "500"}

log = logging.getLogger(__name__)


class ClusterStartError(EngineUnavailable):
    """The job's own Ray could not be started, or the given cluster could not be reached."""


def is_loopback_address(address: str | None) -> bool:
    """Whether a Ray address (host:port) names this machine's loopback interface."""
    host = (address or "").rpartition(":")[0] or address or ""
    return host.strip("[]") in ("127.0.0.1", "localhost", "::1")


def resolve_address(given: str | None) -> str | None:
    """The cluster to connect to: --ray-address, else RAY_ADDRESS (as "auto"), else None: start our own."""
    if given:
        return given
    return "auto" if os.environ.get("RAY_ADDRESS") else None


def prepare(address: str | None) -> None:
    """Before ray is imported: what the driver's environment needs to reach the cluster (loopback, auth token).

    Raises ClusterStartError when the cluster wants a token this driver does not have.
    """
    use_loopback_if_local(address)
    use_token_as_the_cluster_wants(address)
    for key, value in SHUTDOWN_FLUSH_ENV.items():
        os.environ.setdefault(key, value)


AUTH_MODE_ENV = "RAY_AUTH_MODE"
# Any GCS call answers UNAUTHENTICATED without the cluster's token; this one is small and has no side effect.
_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Token:
    """This driver's Ray auth token and where it was found."""

    value: str
    source: str   # "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH (path)" or "~/.ray/auth_token"


def find_token() -> Token | None:
    """The driver's token where Ray itself looks for one, in Ray's order; None where there is none."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return Token(os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    for path, source in ((given, f"RAY_AUTH_TOKEN_PATH ({given})"),
                         (str(Path.home() / ".ray" / "auth_token"), "~/.ray/auth_token")):
        try:
            value = Path(path).read_text().strip() if path else ""
        except OSError:
            continue
        if value:
            return Token(value, source)
    return None


def gcs_accepts(address: str, token: str | None) -> bool | None:
    """Whether the GCS at `address` answers a call carrying `token` (None: no token); None if it cannot tell."""
    import grpc

    metadata = None if token is None else (("authorization", f"Bearer {token}"),)
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(_PROBE_METHOD, request_serializer=lambda raw: raw,
                                   response_deserializer=lambda raw: raw)
        try:
            call(b"", timeout=PROBE_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as error:
            return False if error.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def use_token_as_the_cluster_wants(address: str | None) -> None:
    """Token mode on exactly when the cluster to join wants a token, and this driver's is the one it takes.

    A job that starts its own Ray, or joins the local one found by "auto",
    is left to Ray.  A cluster whose GCS does not answer within
    PROBE_TIMEOUT_S is a ClusterStartError now: `ray.init` would retry such
    an address for minutes, saying nothing.
    """
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if not target or "://" in target:
        return
    open_to_all = gcs_accepts(target, None)
    if open_to_all is None:
        raise ClusterStartError(f"could not reach the Ray cluster at {target}: its GCS did not answer within "
                                f"{PROBE_TIMEOUT_S:g} s")
    if open_to_all:
        os.environ.setdefault(AUTH_MODE_ENV, "disabled")  # the cluster has no authentication to turn off
        return
    token = find_token()
    if token is None or os.environ.get(AUTH_MODE_ENV, "token").lower() != "token" or \
            gcs_accepts(target, token.value) is False:
        raise ClusterStartError(auth_refused_sentence(target, token))
    os.environ[AUTH_MODE_ENV] = "token"


def use_loopback_if_local(address: str | None) -> None:
    """Before ray is imported: if the cluster lives on this machine's loopback, make Ray see this machine there."""
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if target is None or is_loopback_address(target):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


@dataclass(frozen=True)
class NodeInfo:
    """One alive node of the cluster, as placement needs it."""

    node_id: str
    ip: str
    labels: Mapping[str, str]
    resources: Mapping[str, float]   # totals: "CPU", "GPU", custom resources
    manager_port: int | None = None  # its raylet's port: whether it still answers tells a lost node from a dead actor

    def describe(self) -> str:
        """The node as a user names it: its address and the labels they gave it, e.g. "127.0.0.1 (node=loaders)"."""
        labels = ", ".join(f"{key}={value}" for key, value in self.labels.items() if not key.startswith("ray.io/"))
        return f"{self.ip} ({labels})" if labels else self.ip

    @property
    def cpus(self) -> int:
        return int(self.resources.get("CPU", 0))

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0))


@dataclass
class JobRay:
    """A context manager: connected to Ray inside, and on exit nothing of the job's own Ray left running.

    `labels` are the node labels the config names (simulated nodes when the
    job starts its own Ray); `gpu_labels` those of them that host GPU runners
    (their simulated nodes get this machine's GPUs).
    """

    address: str | None
    labels: Sequence[str] = ()
    gpu_labels: frozenset[str] = frozenset()
    machine_gpus: int = 0
    cluster: Any = field(default=None, init=False)   # ray.cluster_utils.Cluster when simulated
    processes: OwnProcesses = field(default_factory=OwnProcesses, init=False)   # own Ray: what it started

    @property
    def own(self) -> bool:
        """True when this job started the Ray it runs on (and so stops it)."""
        return self.address is None

    @property
    def simulated(self) -> bool:
        return self.cluster is not None

    def __enter__(self) -> JobRay:
        said: list[str] = []
        try:
            with self.processes.starting() if self.own else contextlib.nullcontext(), handlers_kept():
                self._connect(said)
        except Exception as error:
            self._shutdown()
            if self.address is not None and _refused_auth(error, "".join(said)):
                raise ClusterStartError(auth_refused_sentence(self.address, find_token())) from None
            where = f"the Ray cluster at {self.address}" if self.address else "a Ray instance for the job on 127.0.0.1"
            raise ClusterStartError(f"could not start or reach {where} ({type(error).__name__}: "
                                    f"{(str(error).splitlines() or [''])[0]})") from None
        except SystemExit:  # ray.init's own SIGTERM handler, set while it runs, exits so: the stop is ours
            self._shutdown()
            raise STOPS.answered_elsewhere(signal.SIGTERM) from None
        except BaseException:  # a stop (rnb.engines.stopping.Stopped): what Ray started so far goes
            self._shutdown()
            raise
        sys.stderr.write("".join(said))  # what Ray said on a connection that worked is the user's to see
        return self

    def _connect(self, said: list[str]) -> None:
        import ray

        if self.address is not None:
            # Ray's own client logs each refused connection attempt to stderr from C++ for as long as it
            # retries; kept aside, they tell why it failed.
            with _stderr_kept_in(said):
                ray.init(address=self.address, namespace=NAMESPACE, logging_level=logging.WARNING)
        elif self.labels:
            self.cluster = _simulated_cluster(self.labels, self.gpu_labels, self.machine_gpus)
            ray.init(address=self.cluster.address, namespace=NAMESPACE, logging_level=logging.WARNING)
        else:
            ray.init(address="local", _node_ip_address=LOOPBACK, include_dashboard=False,
                     num_cpus=len(os.sched_getaffinity(0)), num_gpus=self.machine_gpus,
                     _system_config=OWN_SYSTEM_CONFIG, namespace=NAMESPACE, logging_level=logging.WARNING)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        """Disconnect; a Ray of the job's own goes too, at once (SIGKILL, every process): its daemons do not hear
        SIGTERM, with which Ray's orderly shutdown would ask them and then wait a second for each."""
        import ray

        if self.own:
            self.processes.end()
        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None

    def nodes(self) -> list[NodeInfo]:
        """The alive nodes, head first as Ray lists them."""
        import ray

        return [NodeInfo(node["NodeID"], node["NodeManagerAddress"], dict(node.get("Labels") or {}),
                         dict(node["Resources"]), node.get("NodeManagerPort")) for node in ray.nodes() if node["Alive"]]


def auth_refused_sentence(address: str, token: Token | None) -> str:
    """The one sentence for a cluster that refused the driver's authentication."""
    mode = os.environ.get(AUTH_MODE_ENV, "token").lower()
    if token is None:
        has = "this driver has no token (none in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
    elif mode != "token":
        has = f"{AUTH_MODE_ENV}={os.environ[AUTH_MODE_ENV]} keeps this driver from sending its token"
    else:
        has = f"refused the token this driver has from {token.source}"
    return (f"could not join the Ray cluster at {address}: it requires token authentication and {has}; give the "
            "driver the token every node of the cluster has (docs/ray.md, token authentication)")


def _refused_auth(error: Exception, said: str) -> bool:
    return type(error).__name__ == "AuthenticationError" or "InvalidAuthToken" in said or "Unauthenticated" in said


@contextlib.contextmanager
def _stderr_kept_in(said: list[str]) -> Iterator[None]:
    """Send what is written to file descriptor 2 (C++ logs included) into `said` instead of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+b") as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            said.append(kept.read().decode(errors="replace"))


@contextlib.contextmanager
def shared_simulated_cluster(labels: Sequence[str]) -> Iterator[str]:
    """The simulated cluster a job with these node labels would start, kept for every job run inside: its address
    (give it as --ray-address or RAY_ADDRESS).

    Jobs that each start their own spend some 10 s of a 2-core machine on
    it, and run their first seconds beside a Ray still starting its own
    processes; jobs that share one, as on a real cluster, measure neither.
    """
    use_loopback_if_local(None)
    cluster = _simulated_cluster(labels, frozenset(), 0)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def _simulated_cluster(labels: Sequence[str], gpu_labels: frozenset[str], machine_gpus: int) -> Any:
    """A head node (the driver's) and one node per label, all on 127.0.0.1, sharing this machine's cores."""
    from ray.cluster_utils import Cluster

    cpus = simulated_node_cpus(len(labels))
    cluster = Cluster(initialize_head=True, head_node_args={
        "node_ip_address": LOOPBACK, "num_cpus": cpus, "object_store_memory": SIMULATED_OBJECT_STORE_BYTES,
        "num_gpus": 0, "include_dashboard": False, "_system_config": OWN_SYSTEM_CONFIG})
    try:
        for label in labels:
            key, value = split_label(label)
            cluster.add_node(node_ip_address=LOOPBACK, num_cpus=cpus, object_store_memory=SIMULATED_OBJECT_STORE_BYTES,
                             labels={key: value}, num_gpus=machine_gpus if label in gpu_labels else 0)
    except BaseException:
        cluster.shutdown()
        raise
    log.info("started a simulated Ray cluster on 127.0.0.1: a head node and %d labelled nodes (%s)",
             len(labels), ", ".join(labels))
    return cluster


def daemons_here(session: str, ours: Collection[int]) -> list[tuple[str, int]]:
    """The cluster's processes on this machine other than `ours`: (sample name, pid) of each.

    They are what carries the job's items besides its actors: raylets with
    their object stores, the GCS, the agents, the job's control actor and
    idle workers.  Every one of them was started with the session's name
    (Ray's --session-name flag), which tells them from another cluster's.
    """
    flag = f"--session-name={session}"
    found = []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        pid, cmdline = process.info["pid"], process.info["cmdline"] or ()
        if pid not in ours and flag in cmdline:
            found.append((f"{DAEMON_SAMPLES}{process.info['name']}:{pid}", pid))
    return found


def simulated_node_cpus(labels: int) -> int:
    """The CPU resource of each node of a simulated cluster of a head and `labels` nodes: this machine's, shared."""
    return max(1, len(os.sched_getaffinity(0)) // (labels + 1))


def split_label(node: str) -> tuple[str, str]:
    """A group's "node" as a (label key, value) pair: "loaders" is node=loaders, "key=value" is itself."""
    key, sep, value = node.partition("=")
    return (key, value) if sep else (LABEL_KEY, node)
