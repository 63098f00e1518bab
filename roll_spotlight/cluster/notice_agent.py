"""`spotlight notice-agent`: turn this node's cloud preemption notice into a Ray preemption drain.

    provider signal --(spot.notices: pure)--> Notice(deadline) --RayNodeDrainer--> GCS DrainNode
    (IMDS / GCE metadata / Scheduled Events / SIGTERM)                             (the driver's NOTICE)

One agent runs per spot node, beside its raylet (a systemd unit on a VM, a sidecar container in
a KubeRay pod, a process of the local cluster harness). It polls its provider; on a notice it
drains its own Ray node with the notice's deadline, so the training driver's
``RayNodeWatcher`` sees NOTICE and the node's rollout workers commit before the node goes; then
it idles until it is stopped (or exits with ``--exit-after-drain``).

It never crashes on what the endpoint says and never drains on a bad answer: an unreachable or
slow endpoint (including at start) is logged and retried every ``--retry-s``; an answer that is
neither a notice nor a documented "no notice" (`spot.notices.BadAnswer`) is logged and polled
again. The GCS connection and the node lookup are made ahead of any notice, in a thread, so a
notice costs one DrainNode call. With ``--provider k8s`` there is nothing to poll: SIGTERM is the
notice and the deadline is SIGTERM + ``--grace-s`` (the pod's terminationGracePeriodSeconds).

Exit status: 0 after a drain with ``--exit-after-drain`` or on SIGINT, 2 on bad input (an
unknown provider, a missing address or node), one line naming the option.
"""
from __future__ import annotations

import argparse
import http.client
import logging
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from roll_spotlight.spot.notices import (PROVIDERS, BadAnswer, HttpAnswer, HttpRequest, Notice, ProviderConfig,
                                         make_provider, sigterm_notice)

log = logging.getLogger("roll_spotlight.cluster.notice_agent")

MAX_BODY = 65536  # metadata answers are a few hundred bytes; never read more than this
# no proxies: metadata servers are link-local and must never be asked through an HTTP proxy
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(request: HttpRequest) -> HttpAnswer:
    """Perform ``request``; any HTTP status is an answer. Raises OSError (unreachable, refused,
    timed out) or ``http.client.HTTPException`` (a broken answer)."""
    data = b"" if request.method == "PUT" else None
    req = urllib.request.Request(request.url, data=data, headers=dict(request.headers), method=request.method)
    try:
        with _OPENER.open(req, timeout=request.timeout_s) as resp:
            return HttpAnswer(resp.status, resp.read(MAX_BODY), dict(resp.headers.items()))
    except urllib.error.HTTPError as err:
        with err:
            return HttpAnswer(err.code, err.read(MAX_BODY), dict((err.headers or {}).items()))


@dataclass
class WatchStats:
    polls: int = 0
    unreachable: int = 0
    bad_answers: int = 0


class NoticeWatcher:
    """Polls one HTTP provider until it reports a notice (see the module docstring)."""

    def __init__(self, provider, *, retry_s: float = 1.0, fetch: Callable[[HttpRequest], HttpAnswer] = fetch,
                 clock: Callable[[], float] = time.time, stop: threading.Event | None = None) -> None:
        self.provider, self.retry_s, self._fetch, self.clock = provider, retry_s, fetch, clock
        self.stop = stop or threading.Event()
        self.stats = WatchStats()

    def watch(self) -> Notice | None:
        """The first notice, or None once ``stop`` is set."""
        while not self.stop.is_set():
            request = self.provider.next_request()
            notice, pause = self._poll(request)
            if notice is not None:
                return notice
            self.stop.wait(pause)
        return None

    def _poll(self, request: HttpRequest) -> tuple[Notice | None, float]:
        self.stats.polls += 1
        try:
            answer = self._fetch(request)
        except (OSError, http.client.HTTPException) as err:
            self.stats.unreachable += 1
            log.warning("%s metadata endpoint %s unreachable or slow (%s); retrying in %.1f s, not draining",
                        self.provider.name, request.url, err, self.retry_s)
            return None, self.retry_s
        try:
            return self.provider.read(request, answer, self.clock()), self.provider.pause_s(request)
        except BadAnswer as err:
            self.stats.bad_answers += 1
            log.warning("%s: bad answer from %s (%s); not draining, polling again", self.provider.name, request.url, err)
            return None, max(self.provider.pause_s(request), self.retry_s)


class NodeLink:
    """This agent's node in the Ray cluster: found in a background thread (retrying while the GCS
    is unreachable or the node not yet registered), then drained once."""

    def __init__(self, drainer, *, retry_s: float = 1.0, stop: threading.Event | None = None) -> None:
        self.drainer, self.retry_s = drainer, retry_s
        self.stop = stop or threading.Event()
        self.node_id: str | None = None
        self._found = threading.Event()
        self._thread = threading.Thread(target=self._find, name="notice-agent-node", daemon=True)
        self._thread.start()

    def _find(self) -> None:
        from roll_spotlight.cluster.node_drain import rpc_errors

        errors = rpc_errors()
        while not self.stop.is_set():
            try:
                self.node_id = self.drainer.find()
            except errors as err:
                log.warning("GCS at %s unreachable (%s); retrying", self.drainer.address, err)
            if self.node_id is not None:
                log.info("watching Ray node %s (%s)", self.node_id, self.drainer.selector)
                self._found.set()
                return
            log.info("Ray node %s not registered yet; retrying in %.1f s", self.drainer.selector, self.retry_s)
            self.stop.wait(self.retry_s)

    def drain(self, notice: Notice, clock: Callable[[], float] = time.time) -> bool:
        """Drain the node with the notice's deadline, retrying until accepted, the deadline has
        passed, or ``stop``; True once the GCS accepted it."""
        from roll_spotlight.cluster.node_drain import rpc_errors

        errors = rpc_errors()
        message = f"spot preemption ({notice.provider}: {notice.detail})"
        while not self.stop.is_set():
            if self._found.wait(timeout=self.retry_s):
                try:
                    accepted, why = self.drainer.drain(self.node_id, notice.deadline_s, message)
                except errors as err:
                    accepted, why = False, str(err)
                if accepted:
                    log.info("drained Ray node %s: deadline in %.1f s (%s)", self.node_id,
                             notice.deadline_s - clock(), notice.detail)
                    return True
                log.warning("drain of Ray node %s not accepted (%s); retrying", self.node_id, why)
            if clock() > notice.deadline_s:
                log.error("the notice's deadline passed before Ray node %s could be drained", self.drainer.selector)
                return False
            self.stop.wait(self.retry_s)
        return False


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spotlight notice-agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", required=True, help=f"one of {', '.join(PROVIDERS)}")
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="the Ray cluster's GCS address host:port (default: $RAY_ADDRESS)")
    p.add_argument("--node-id", default=None, help="this node's Ray node id (hex)")
    p.add_argument("--node-name", default=None, help="this node's Ray node name (ray start --node-name)")
    p.add_argument("--node-ip", default=None,
                   help="the address this node's raylet advertises (default: this host's address towards the GCS)")
    p.add_argument("--endpoint", default=None, help="metadata server base URL (default: the provider's)")
    d = ProviderConfig()
    p.add_argument("--poll-s", type=float, default=d.poll_s, help="seconds between polls that found no notice")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="an answer slower than this is retried")
    p.add_argument("--retry-s", type=float, default=1.0, help="seconds between retries of an unreachable endpoint or GCS")
    p.add_argument("--notice-s", type=float, default=d.notice_s, help="gcp: seconds from preempted=TRUE to the stop")
    p.add_argument("--grace-s", type=float, default=d.grace_s, help="k8s: the pod's terminationGracePeriodSeconds")
    p.add_argument("--vm-name", default=None, help="azure: this VM's name in Resources (default: from the metadata)")
    p.add_argument("--exit-after-drain", action="store_true", help="exit once the drain is accepted")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def local_ip_towards(address: str) -> str:
    """This host's address on the route to ``address`` (host:port); a UDP connect sends nothing."""
    host = address.rsplit(":", 1)[0].strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))
        return sock.getsockname()[0]


def _selector(args):
    from roll_spotlight.cluster.node_drain import NodeSelector

    if not args.address:
        raise ValueError("--address (or $RAY_ADDRESS) must name the Ray cluster's GCS host:port")
    if not (args.node_id or args.node_name or args.node_ip):
        args.node_ip = local_ip_towards(args.address)
    return NodeSelector(node_id=args.node_id, node_name=args.node_name, node_ip=args.node_ip)


def serve(args, *, drainer=None, stop: threading.Event | None = None) -> int:
    """The agent (``drainer`` replaces the Ray one: tests)."""
    from roll_spotlight.cluster.node_drain import RayNodeDrainer

    if args.provider not in PROVIDERS:
        raise ValueError(f"--provider {args.provider!r} is not one of {list(PROVIDERS)}")
    config = ProviderConfig(endpoint=args.endpoint, poll_s=args.poll_s, timeout_s=args.timeout_s,
                            notice_s=args.notice_s, grace_s=args.grace_s, vm_name=args.vm_name)
    provider = make_provider(args.provider, config) if args.provider != "k8s" else None
    drainer = drainer or RayNodeDrainer(args.address, _selector(args))
    stop = stop or threading.Event()
    sigterm = SigtermNotice(args.grace_s)
    _on_signals(stop, sigterm if args.provider == "k8s" else None)
    link = NodeLink(drainer, retry_s=args.retry_s, stop=stop)
    notice = sigterm.wait(stop) if provider is None else NoticeWatcher(provider, retry_s=args.retry_s, stop=stop).watch()
    if notice is None:
        return 0  # stopped before any notice
    log.warning("preemption notice: %s, deadline in %.1f s", notice.detail, notice.deadline_s - time.time())
    drained = link.drain(notice)
    if drained and not args.exit_after_drain:
        stop.wait()
    return 0 if drained else 1


class SigtermNotice:
    """k8s: the time SIGTERM arrived is the notice; SIGKILL follows ``grace_s`` later."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.received_at: float | None = None
        self._event = threading.Event()

    def __call__(self, *_signal) -> None:
        if self.received_at is None:
            self.received_at = time.time()
        self._event.set()

    def wait(self, stop: threading.Event) -> Notice | None:
        while not stop.is_set():
            if self._event.wait(timeout=0.2):
                return sigterm_notice(self.received_at, self.grace_s)
        return None


def _on_signals(stop: threading.Event, sigterm: SigtermNotice | None) -> None:
    """SIGINT stops the agent; so does SIGTERM, except under k8s, where it is the notice."""
    if threading.current_thread() is not threading.main_thread():
        return  # tests drive the agent from a thread and stop it through ``stop``
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, sigterm if sigterm is not None else (lambda *_: stop.set()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s notice-agent: %(message)s")
    try:
        return serve(args)
    except ValueError as err:
        print(f"spotlight notice-agent: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
