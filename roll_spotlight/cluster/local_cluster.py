"""A multi-node Ray cluster on one machine: a head and spot raylets that a spot trace makes come and go.

    SpotMarket --ClusterTraceDriver--> LocalCluster
      NODE_UP    -> `ray start --address HEAD --block` (spot label + resource) + the node's notice agent
      NOTICE     -> the node's metadata answer flips (k8s: the agent gets SIGTERM); the agent drains it
      NODE_DOWN  -> SIGKILL of the raylet's process group (the deadline, or a drop without notice)

The head (``ray start --head --block``) is the on-demand node: it declares ``ondemand_gpu`` for
the trainer and on-demand rollout workers; the driver, the request queue, the weight store and the
reward actors live there (the driver attaches to the head of its host; those actors are pinned to
the driver's node). Each spot node is a raylet of its own with ``--num-cpus 0``, the resource
``spot_gpu: gpus_per_node``, the label ``spot=true`` and ``RAY_NODE_MARKET_TYPE=spot`` (Ray's
``ray.io/market-type`` label, as KubeRay sets it), and the trace's zone as
``ray.io/availability-zone``. Its notice agent (`spotlight notice-agent`) polls a loopback
`MetadataStub` answering as the trace's provider.

Isolation from other Ray clusters on the host: every raylet uses a private ``--temp-dir`` under
one ``mkdtemp`` (so nothing is recorded in /tmp/ray, and ``ray.init()`` without an address never
finds this cluster), and every fixed port of Ray (GCS, dashboard, dashboard agent, metrics, client
server) is picked free. Only processes this harness started are ended, by process group and then
by the pids of their descendants; ``leftovers`` lists anything still running from its temp dir.
Ray's CLI refuses a second node when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (so joining nodes
set it to 1) and turns a joining node's literal ``--address 127.0.0.1`` into the host's network
address, so raylets start through `RAY_START_ON_LOOPBACK`, Ray's own CLI with that one
substitution switched off: every node and its workers use 127.0.0.1 (docs/security.md). The same
command works with ROLL's Ray 2.48 and with Ray 2.60.

Deliberately not here: the market (``spot.market``), the pool that follows the nodes
(``spot_pool.ray_nodes.RayNodeWatcher``) and the replay loop (``benchmarks.replay``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from roll_spotlight.config.run import ONDEMAND_RESOURCE, SPOT_RESOURCE
from roll_spotlight.checks import require_choice, require_int
from roll_spotlight.spot.market import EventKind, SpotMarket
from roll_spotlight.spot.notices import PROVIDERS
from roll_spotlight.spot.market import MarketSchedule

log = logging.getLogger(__name__)

SPOT_LABEL = "spot=true"
# Memory (RSS) of a spot node: `ray start`, raylet, dashboard and runtime-env agents and the
# notice agent (NODE_BASE_MB), plus one rollout worker (torch + the tiny policy) per GPU; the head
# with the driver and the on-demand worker take HEAD_MB. Sized from a soak's peak (docs/cluster.md).
NODE_BASE_MB = 450.0
WORKER_MB = 500.0
HEAD_MB = 1500.0


def node_memory_mb(gpus_per_node: int, worker_mb: float = WORKER_MB) -> float:
    return NODE_BASE_MB + gpus_per_node * worker_mb


def check_capacity(nodes: int, gpus_per_node: int, available_mb: float, *, nodes_key: str = "--nodes",
                   gpus_key: str = "--gpus-per-node", worker_mb: float = WORKER_MB, head_mb: float = HEAD_MB,
                   head: str = "the head") -> None:
    """ValueError naming the keys when ``nodes`` spot nodes of ``gpus_per_node`` workers (``worker_mb``
    each) and ``head`` (``head_mb``) need more memory than ``available_mb``: checked before anything starts."""
    require_int(nodes_key, nodes, ">= 0")
    require_int(gpus_key, gpus_per_node)
    per_node = node_memory_mb(gpus_per_node, worker_mb)
    need = head_mb + nodes * per_node
    if need > available_mb:
        fits = max(0, math.floor((available_mb - head_mb) / per_node))
        raise ValueError(f"{nodes_key} {nodes} x {gpus_key} {gpus_per_node} and {head} need about {need / 1024:.1f} "
                         f"GiB and this machine has {available_mb / 1024:.1f} GiB available: at most {nodes_key} "
                         f"{fits} here")


def available_memory_mb() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**20


def free_port() -> int:
    """A port nothing listens on now (on 127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class LocalClusterConfig:
    """``provider``: what the nodes' notice agents poll (k8s: SIGTERM). ``notice_s``: the gcp
    agent's TRUE-to-stop time and the k8s grace period (aws and azure read the deadline from the
    answer). ``health_check_period_ms``: how often the GCS checks raylets (Ray's default 3000);
    a SIGKILLed raylet is declared dead after 3 missed checks. ``keep_logs``: leave the temp dir
    (every raylet's and agent's log) in place at the end."""

    gpus_per_node: int = 1
    ondemand_gpus: int = 2
    head_cpus: int = 2
    provider: str = "aws"
    notice_s: float = 30.0
    agent_poll_s: float = 0.25
    health_check_period_ms: int = 1000
    start_timeout_s: float = 180.0
    keep_logs: bool = False

    def __post_init__(self) -> None:
        require_choice("--provider", self.provider, PROVIDERS)
        require_int("--gpus-per-node", self.gpus_per_node)


@dataclass
class SpotNodeProcesses:
    name: str
    zone: str
    agent: subprocess.Popen
    raylet: subprocess.Popen | None = None  # None until its turn among the raylet starts


class LocalCluster:
    """The head and its spot raylets (see the module docstring). A context manager: the exit
    ends every process it started and removes its temp dir."""

    def __init__(self, config: LocalClusterConfig) -> None:
        self.config = config
        self.root = Path(tempfile.mkdtemp(prefix="rsc", dir="/tmp"))  # short: Ray's socket paths are limited
        self.address: str | None = None
        self.head: subprocess.Popen | None = None
        self.nodes: dict[str, SpotNodeProcesses] = {}
        self._last_start = None  # (sockets before the last raylet started, its process): `_after_last_raylet`
        self._lock = threading.Lock()  # a node's raylet starts, or it is killed, not both at once
        self._starts: queue.SimpleQueue = queue.SimpleQueue()
        self._starter: threading.Thread | None = None
        self.stub = None
        self._gcs = None

    # -- life --------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> str:
        """Start the head and the metadata stub; returns the GCS address (127.0.0.1:port)."""
        from roll_spotlight.cluster.metadata_stub import MetadataStub

        if self.config.provider != "k8s":
            self.stub = MetadataStub(self.config.provider)
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        system = {"health_check_period_ms": self.config.health_check_period_ms, "health_check_failure_threshold": 3}
        args = ["--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.config.head_cpus),
                "--resources", json.dumps({ONDEMAND_RESOURCE: self.config.ondemand_gpus}), "--include-dashboard", "false",
                "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()),
                "--system-config", json.dumps(system)]
        self.head = self._ray_start("head", args, _ray_env(cluster_node=False))
        self._wait(lambda: self._alive_names() is not None and len(self._alive_names()) >= 1, "the head")
        log.info("local cluster: head at %s (%s)", self.address, self.root)
        return self.address

    def close(self) -> None:
        """Kill every spot node, stop the head (SIGTERM, then SIGKILL), sweep leftovers, remove
        the temp dir."""
        for name in list(self.nodes):
            self.kill(name)
        if self._starter is not None:
            self._starts.put(None)
            self._starter.join()
            self._starter = None
        if self.head is not None:
            _end_group(self.head, signal.SIGTERM, wait_s=20.0)
            self.head = None
        if self.stub is not None:
            self.stub.close()
            self.stub = None
        for proc in self.leftovers():
            log.warning("local cluster: ending leftover process %d %s", proc.pid, " ".join(proc.cmdline()[:2]))
            _kill_quietly(proc)
        self._gcs = None
        if self.config.keep_logs:
            log.warning("local cluster: logs kept under %s", self.root)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list:
        """Processes of this user still running from this cluster's temp dir."""
        import psutil

        root, out = str(self.root), []
        for proc in psutil.process_iter(["cmdline", "uids"]):
            try:
                if proc.info["uids"] and proc.info["uids"].real == os.getuid() and \
                        any(root in part for part in proc.info["cmdline"] or []):
                    out.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    # -- spot nodes ----------------------------------------------------------------------------

    def add_spot_node(self, name: str, zone: str = "") -> None:
        """Start a spot raylet called ``name`` and its notice agent; returns at once: the raylet
        starts on the starter thread after those queued before it (`_after_last_raylet`), and the
        node registers with the GCS some seconds later."""
        assert self.address is not None, "start() first"
        if name in self.nodes:
            raise ValueError(f"spot node {name!r} is already running")
        host_port = self.address.rsplit(":", 1)[1]
        args = ["--address", f"127.0.0.1:{host_port}", "--node-ip-address", "127.0.0.1",
                "--node-name", name, "--num-cpus", "0", "--resources",
                json.dumps({SPOT_RESOURCE: self.config.gpus_per_node}), "--labels", SPOT_LABEL]
        env = _ray_env(cluster_node=True) | {"RAY_NODE_MARKET_TYPE": "spot", "RAY_NODE_ZONE": zone}
        with self._lock:
            self.nodes[name] = SpotNodeProcesses(name, zone, self._start_agent(name))
        if self._starter is None:
            self._starter = threading.Thread(target=self._start_raylets, name="raylet-starter", daemon=True)
            self._starter.start()
        self._starts.put((name, args, env))

    def _start_raylets(self) -> None:
        """The starter thread: one raylet after another, so that the caller (the trace's driver,
        whose notices have deadlines of 2 s of wall time in a compressed replay) never waits on a
        start; a node killed before its turn never starts."""
        while (item := self._starts.get()) is not None:
            name, args, env = item
            self._after_last_raylet()
            with self._lock:
                node = self.nodes.get(name)
                if node is not None:
                    try:
                        node.raylet = self._ray_start(name, args, env)
                    except OSError as err:  # the node never registers: `wait_registered` names it
                        log.error("spot node %s: its raylet did not start: %s", name, err)

    def _start_agent(self, name: str) -> subprocess.Popen:
        cfg = self.config
        cmd = [sys.executable, "-m", "roll_spotlight.cluster.notice_agent", "--provider", cfg.provider,
               "--address", self.address, "--node-name", name, "--poll-s", str(cfg.agent_poll_s), "--timeout-s", "2",
               "--retry-s", "0.5", "--notice-s", str(cfg.notice_s), "--grace-s", str(cfg.notice_s), "-v"]
        if self.stub is not None:
            cmd += ["--endpoint", self.stub.url(name)]
        with open(self.root / f"{name}-agent.log", "ab") as out:
            return subprocess.Popen(cmd, env=_ray_env(cluster_node=False), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def notice(self, name: str, deadline_s: float) -> None:
        """The provider's notice for ``name``, reclaimed at ``deadline_s`` (epoch seconds): its
        metadata answer flips (k8s: its agent gets SIGTERM). The agent drains the node."""
        node = self.nodes[name]
        if self.stub is not None:
            self.stub.set_notice(name, deadline_s)
        else:
            os.kill(node.agent.pid, signal.SIGTERM)

    def kill(self, name: str) -> bool:
        """SIGKILL the node's raylet (its process group, then any descendant left) and its agent;
        False if the raylet had already exited (a drained idle raylet shuts itself down)."""
        with self._lock:
            node = self.nodes.pop(name)
        running = node.raylet is not None and node.raylet.poll() is None
        if node.raylet is not None:
            _end_group(node.raylet, signal.SIGKILL, wait_s=5.0)
        _end_group(node.agent, signal.SIGKILL, wait_s=5.0)
        return running

    def node_infos(self) -> dict:
        """Every node the GCS knows (alive or dead): node id -> Ray's ``GcsNodeInfo``."""
        from ray._raylet import GcsClient

        if self._gcs is None:
            self._gcs = GcsClient(address=self.address)
        return self._gcs.get_all_node_info(timeout=5)

    def node_ids(self) -> dict[str, str]:
        """Alive nodes registered with the GCS: name -> node id (hex)."""
        return {info.node_name: node_id.hex() for node_id, info in self.node_infos().items() if info.state == 0}

    def wait_registered(self, names, timeout_s: float | None = None) -> None:
        """Block until every node in ``names`` is alive in the GCS (TimeoutError naming the rest)."""
        wanted = set(names)
        self._wait(lambda: wanted <= set(self._alive_names() or ()), f"spot nodes {sorted(wanted)}", timeout_s)

    def _alive_names(self) -> set[str] | None:
        from roll_spotlight.cluster.node_drain import rpc_errors

        try:
            return set(self.node_ids())
        except rpc_errors():
            return None

    def _wait(self, ready: Callable[[], bool], what: str, timeout_s: float | None = None) -> None:
        end = time.monotonic() + (timeout_s or self.config.start_timeout_s)
        while not ready():
            if self.head is not None and self.head.poll() is not None:
                raise RuntimeError(f"the Ray head exited with {self.head.returncode}; see {self.root}/head.log")
            if time.monotonic() > end:
                raise TimeoutError(f"{what} not up after {timeout_s or self.config.start_timeout_s:.0f} s "
                                   f"(logs under {self.root})")
            time.sleep(0.2)

    def _after_last_raylet(self, timeout_s: float = 30.0) -> None:
        """Wait until the raylet started last has made its object-store socket (or has exited). A
        raylet takes the first free name in the session's sockets folder (and keys its cached
        ports by it), so two that start together can take the same one and fail to bind
        (measured: ray 2.48, where every node uses the head's session folder)."""
        if self._last_start is None:
            return
        before, process = self._last_start
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and process.poll() is None and not self._sockets() - before:
            time.sleep(0.05)

    def _sockets(self) -> set[Path]:
        return {path.resolve() for path in self.root.glob("*/session_*/sockets/plasma_store*")}

    def _ray_start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        """``ray start --block`` in a session of its own (its process group is the node)."""
        before = self._sockets()
        temp_dir = self.root / name
        temp_dir.mkdir()
        cmd = [*RAY_START_ON_LOOPBACK, "start", "--block", "--temp-dir", str(temp_dir),
               "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()),
               "--min-worker-port", "0", "--max-worker-port", "0", "--disable-usage-stats", *args]
        with open(self.root / f"{name}.log", "ab") as out:
            process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self._last_start = (before, process)
        return process


# `ray start` as Ray's CLI runs it, except that a literal 127.0.0.1 stays one: the CLI would turn a
# joining node's --address 127.0.0.1 into the host's network address (ray 2.48 to 2.60 at least)
RAY_START_ON_LOOPBACK = [sys.executable, "-c", "import sys, ray._private.services as s; "
                         "s.resolve_ip_for_localhost = lambda a: a; from ray.scripts.scripts import main; "
                         "sys.argv[0] = 'ray'; main()"]


def _ray_env(*, cluster_node: bool) -> dict[str, str]:
    """The environment of the harness's processes: loopback Ray, no auth token, no usage stats,
    no SIGTERM self-drain (the harness kills at the deadline itself). A joining node's CLI needs
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 (see the module docstring)."""
    from roll_spotlight.loopback import LOOPBACK_ENV

    env = dict(os.environ) | LOOPBACK_ENV | {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    env.pop("RAY_ADDRESS", None)
    if cluster_node:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    return env


def _end_group(proc: subprocess.Popen, sig: int, wait_s: float) -> None:
    """Send ``sig`` to the process group ``proc`` leads, wait for it, then SIGKILL the group and
    any descendant that left it (by pid, checked against its start time)."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for target_sig in (sig, signal.SIGKILL):
        try:
            os.killpg(proc.pid, target_sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    for child in family:
        _kill_quietly(child)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        log.error("process %d did not exit after SIGKILL", proc.pid)


def _kill_quietly(proc) -> None:
    import psutil

    try:
        proc.kill()  # psutil checks the pid still names the same process (start time)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass  # already gone (or never ours): nothing to end


# ---------------------------------------------------------------------------------------------
# A trace driving the cluster


@dataclass
class DriverStats:
    joins: int = 0
    notices: int = 0
    kills_after_notice: int = 0
    kills_without_notice: int = 0
    gone_before_kill: int = 0  # raylets that had exited by their kill (drained while idle)


class ClusterTraceDriver:
    """Applies a ``SpotMarket``'s events to a cluster on the market's wall clock (see the module
    docstring). ``epoch0``: the epoch second of market time 0 (deadlines are sent in epoch
    seconds). ``before_kill(name, noticed)`` runs just before a node is killed (the soak reads
    what the node's workers had not handed to the queue). ``no_notice``: every NOTICE is dropped,
    so every NODE_DOWN is a kill without notice. ``lead_s``: how long a node takes to come up (its
    start is that much early, `MarketSchedule`). ``cluster`` needs ``add_spot_node``, ``notice``
    and ``kill`` (tests pass a fake)."""

    def __init__(self, market: SpotMarket, cluster, epoch0: float,
                 before_kill: Callable[[str, bool], None] | None = None, *, no_notice: bool = False,
                 lead_s: float = 0.0) -> None:
        self.schedule = MarketSchedule(market, lead_s)
        self.cluster, self.epoch0, self.no_notice = cluster, epoch0, no_notice
        self.before_kill = before_kill or (lambda name, noticed: None)
        self.names: dict[str, str] = {}  # market node id -> cluster node name
        self.noticed: set[str] = set()
        self.stats = DriverStats()

    def tick(self, now: float) -> list:
        """Apply every market event due by ``now``; returns them."""
        events = self.schedule.due(now)
        for event in events:
            self._apply(event)
        return events

    def _apply(self, event) -> None:
        log.info("market %.2f s: %s of %s", event.time_s, event.kind.value, event.node_id)
        name = self.names.get(event.node_id)
        if event.kind is EventKind.NODE_UP:
            name = self.names[event.node_id] = f"spot-{len(self.names)}"
            self.cluster.add_spot_node(name, zone=event.zone)
            self.stats.joins += 1
        elif event.kind is EventKind.NOTICE and name is not None and not self.no_notice:
            deadline = self.schedule.deadline(event.node_id)
            self.cluster.notice(name, self.epoch0 + (deadline if deadline is not None else event.time_s))
            self.noticed.add(name)
            self.stats.notices += 1
        elif event.kind is EventKind.NODE_DOWN and name is not None:
            noticed = name in self.noticed
            self.before_kill(name, noticed)
            self.stats.gone_before_kill += self.cluster.kill(name) is False
            self.stats.kills_after_notice += noticed
            self.stats.kills_without_notice += not noticed
