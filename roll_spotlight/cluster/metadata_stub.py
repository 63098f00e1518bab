"""A loopback metadata server that answers as one cloud provider documents, for many nodes at once.

The local cluster harness gives every spot node its own prefix (``http://127.0.0.1:PORT/<node>``)
and tells the node's notice agent to use it as its metadata endpoint; a trace's NOTICE flips that
node's answer (``set_notice``). Tests and the bridge benchmark also make a node misbehave
(``set_mode``): "slow" (answers after ``delay_s``), "malformed" (200 with a body the provider
never sends), "error" (500). What is answered, per provider (``roll_spotlight.spot.notices``):

- aws: ``PUT /latest/api/token`` (needs the TTL header) -> a token; ``GET
  /latest/meta-data/spot/instance-action`` (needs that token, else 401) -> 404, or after a notice
  ``{"action": "terminate", "time": "<UTC to the second>"}``.
- gcp: ``GET /computeMetadata/v1/instance/preempted`` (needs ``Metadata-Flavor: Google``, else 403)
  -> ``FALSE``/``TRUE`` with ``Metadata-Flavor: Google`` and an ETag; with
  ``wait_for_change=true&last_etag=E`` it holds the answer until the value differs from E or
  ``timeout_sec`` passes.
- azure: ``GET /metadata/instance/compute/name`` -> the node's name; ``GET
  /metadata/scheduledevents?api-version=...`` (needs ``Metadata: true``, else 400) -> a document
  whose Events hold, after a notice, a ``Preempt`` of this VM with ``NotBefore`` in RFC 1123.

Binds 127.0.0.1 only (``port`` 0: any free port); serves until ``close``.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import zlib
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MODES = ("ok", "slow", "malformed", "error")
_MALFORMED = {"aws": b'{"action": "terminate", "time": ', "gcp": b"MAYBE", "azure": b'{"Events": "soon"}'}


@dataclass
class _NodeState:
    notice_s: float | None = None  # epoch seconds of the reclaim, once noticed
    mode: str = "ok"
    delay_s: float = 0.0
    requests: int = 0
    incarnation: int = 1


class MetadataStub:
    """One provider's metadata answers for many nodes (see the module docstring)."""

    def __init__(self, provider: str, port: int = 0) -> None:
        if provider not in _MALFORMED:
            raise ValueError(f"no metadata endpoint for provider {provider!r}; known: {sorted(_MALFORMED)}")
        self.provider = provider
        self._nodes: dict[str, _NodeState] = {}
        self._changed = threading.Condition()
        self._closed = False
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metadata-stub", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, node: str) -> str:
        """The node's metadata endpoint (its agent's ``--endpoint``)."""
        self._state(node)
        return f"http://127.0.0.1:{self.port}/{node}"

    def set_notice(self, node: str, deadline_s: float) -> None:
        """From now on the node's answers say it is reclaimed at ``deadline_s`` (epoch seconds)."""
        with self._changed:
            state = self._state(node)
            state.notice_s, state.incarnation = deadline_s, state.incarnation + 1
            self._changed.notify_all()

    def set_mode(self, node: str, mode: str, delay_s: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        with self._changed:
            state = self._state(node)
            state.mode, state.delay_s = mode, delay_s

    def requests(self, node: str) -> int:
        with self._changed:
            return self._state(node).requests

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _state(self, node: str) -> _NodeState:
        if not node or "/" in node:
            raise ValueError(f"node name {node!r} must be one non-empty path segment")
        return self._nodes.setdefault(node, _NodeState())

    # -- answers (called from the server's threads) -------------------------------------------

    def answer(self, method: str, node: str, path: str, query: dict, headers) -> tuple[int, dict, bytes]:
        with self._changed:
            state = self._state(node)
            state.requests += 1
            mode, delay = state.mode, state.delay_s
        if mode == "slow":
            time.sleep(delay)
        if mode == "error":
            return 500, {}, b"internal error"
        status, extra, body = getattr(self, f"_{self.provider}")(method, node, path, query, headers)
        if mode == "malformed" and status == 200 and not path.endswith(("/api/token", "/compute/name")):
            body = _MALFORMED[self.provider]
        return status, extra, body

    def _aws(self, method, node, path, query, headers):
        if path == "/latest/api/token" and method == "PUT":
            if not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, {}, b"missing X-aws-ec2-metadata-token-ttl-seconds"
            return 200, {}, f"token-{node}".encode()
        if path != "/latest/meta-data/spot/instance-action" or method != "GET":
            return 404, {}, b""
        if headers.get("X-aws-ec2-metadata-token") != f"token-{node}":
            return 401, {}, b""
        with self._changed:
            notice = self._nodes[node].notice_s
        if notice is None:
            return 404, {}, b""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(notice))
        return 200, {"Content-Type": "text/plain"}, json.dumps({"action": "terminate", "time": stamp}).encode()

    def _gcp(self, method, node, path, query, headers):
        if headers.get("Metadata-Flavor") != "Google":
            return 403, {}, b"missing Metadata-Flavor: Google"
        if path != "/computeMetadata/v1/instance/preempted":
            return 404, {}, b""
        wait = query.get("wait_for_change", [""])[0] == "true"
        last = query.get("last_etag", [None])[0]
        timeout = float(query.get("timeout_sec", ["60"])[0])
        with self._changed:
            if wait:
                end = time.monotonic() + timeout
                while self._etag(node) == last and time.monotonic() < end and not self._closed:
                    self._changed.wait(timeout=max(0.0, end - time.monotonic()))
            value = b"TRUE" if self._nodes[node].notice_s is not None else b"FALSE"
            etag = self._etag(node)
        return 200, {"Metadata-Flavor": "Google", "ETag": etag}, value

    def _etag(self, node: str) -> str:
        value = "TRUE" if self._nodes[node].notice_s is not None else "FALSE"
        return hashlib.sha1(f"{node}:{value}".encode()).hexdigest()[:16]

    def _azure(self, method, node, path, query, headers):
        if headers.get("Metadata") != "true":
            return 400, {}, b'{"error": "Bad request. Required metadata header not specified"}'
        if not query.get("api-version"):
            return 400, {}, b'{"error": "Bad request. api-version was not specified in the request"}'
        if path == "/metadata/instance/compute/name":
            return 200, {"Content-Type": "text/plain"}, node.encode()
        if path != "/metadata/scheduledevents":
            return 404, {}, b""
        with self._changed:
            state = self._nodes[node]
            notice, incarnation = state.notice_s, state.incarnation
        events = [] if notice is None else [{
            "EventId": f"{incarnation:08d}-0000-0000-0000-{zlib.crc32(node.encode()):012d}",
            "EventStatus": "Scheduled", "EventType": "Preempt", "ResourceType": "VirtualMachine",
            "Resources": [node], "NotBefore": formatdate(notice, usegmt=True),
            "Description": "Virtual machine is being preempted.", "EventSource": "Platform",
            "DurationInSeconds": -1}]
        body = {"DocumentIncarnation": incarnation, "Events": events}
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _handler_for(stub: MetadataStub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            node, _, rest = parts.path.lstrip("/").partition("/")
            if self.headers.get("Content-Length"):
                self.rfile.read(int(self.headers["Content-Length"]))
            try:
                status, extra, body = stub.answer(self.command, node, "/" + rest, parse_qs(parts.query), self.headers)
            except ValueError:
                status, extra, body = 404, {}, b""
            try:
                self.send_response(status)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (timed out, or its node was killed)

        do_GET = do_PUT = _serve

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
            pass  # one line per poll would drown the harness's own log

    return Handler
