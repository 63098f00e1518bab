"""Cloud preemption notices, read from each provider's own signal (pure: no HTTP, no Ray).

A node's notice agent (`roll_spotlight.cluster.notice_agent`) asks a provider for its next HTTP
request, performs it, and hands the answer back; the provider says whether the answer is a notice
(with the node's reclaim time), no notice yet, or a bad answer (``BadAnswer``: logged, never a
drain). What each provider documents, and so what is read here:

- **aws**: IMDSv2. ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` gives a
  session token; ``GET /latest/meta-data/spot/instance-action`` with ``X-aws-ec2-metadata-token``
  answers 404 until EC2 decides to interrupt, then ``{"action": "stop"|"terminate"|"hibernate",
  "time": "<UTC, ISO 8601>"}`` (about 2 minutes ahead; hibernation begins at once). A 401 means
  the token expired: a new one is fetched. AWS recommends checking every 5 s.
- **gcp**: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` answers
  ``TRUE`` or ``FALSE`` (and carries ``Metadata-Flavor: Google`` and an ETag). The first request
  reads the value; the next ones hang with ``wait_for_change=true&last_etag=E`` until it changes.
  TRUE means the ACPI soft-off has begun: the VM stops ``notice_s`` (30 s) later.
- **azure**: Scheduled Events. ``GET /metadata/scheduledevents?api-version=2020-07-01`` with
  ``Metadata: true`` answers ``{"DocumentIncarnation": n, "Events": [...]}``; a spot eviction is an
  event with ``EventType: "Preempt"`` (at least 30 s ahead) whose ``Resources`` name this VM and
  whose ``NotBefore`` (RFC 1123, empty once started) is the reclaim time. Events go to every VM of
  an availability set or scale-set placement group, so only events naming this VM count; its name
  comes from ``GET /metadata/instance/compute/name`` unless given.
- **k8s**: no endpoint: the kubelet sends the pod SIGTERM, and the pod has its
  ``terminationGracePeriodSeconds`` (``grace_s``) before SIGKILL (`sigterm_notice`).

Lifecycle of an agent (the shell loops over it)::

    next_request() --fetch--> read(answer) --None------------> (poll again after pause_s())
                                   |--Notice--> drain the node with the notice's deadline
                                   '--BadAnswer--> log, poll again, never drain
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from roll_spotlight.checks import require_number

PROVIDERS = ("aws", "gcp", "azure", "k8s")
AWS_ACTIONS = frozenset({"stop", "terminate", "hibernate"})
AWS_TOKEN_TTL_S = 21600  # IMDSv2's longest session
AZURE_API_VERSION = "2020-07-01"
AZURE_NAME_API_VERSION = "2021-02-01"
DEFAULT_ENDPOINTS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                     "azure": "http://169.254.169.254"}
GCP_NOTICE_S = 30.0
GCP_WAIT_S = 60  # a hanging GET returns after this many seconds with the value unchanged


class BadAnswer(ValueError):
    """An answer that is neither a notice nor a documented 'no notice' (never drained on)."""


@dataclass(frozen=True)
class Notice:
    """A preemption notice: the node goes at ``deadline_s`` (epoch seconds)."""

    provider: str
    deadline_s: float
    detail: str


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 2.0
    step: str = "notice"  # what the answer is read as: "notice", "token" or "name"


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """A header by case-insensitive name."""
        lowered = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lowered), None)


@dataclass(frozen=True)
class ProviderConfig:
    """``endpoint``: the metadata server's base URL (None: the provider's). ``poll_s``: pause
    between polls that found no notice. ``timeout_s``: an answer slower than this is retried.
    ``notice_s``: gcp's time from TRUE to the stop. ``grace_s``: k8s's grace period. ``vm_name``:
    azure's VM (None: asked from the instance metadata)."""

    endpoint: str | None = None
    poll_s: float = 1.0
    timeout_s: float = 2.0
    notice_s: float = GCP_NOTICE_S
    grace_s: float = 30.0
    vm_name: str | None = None

    def __post_init__(self) -> None:
        for key in ("poll_s", "timeout_s", "notice_s", "grace_s"):
            require_number(f"--{key.replace('_', '-')}", getattr(self, key))


def parse_utc(text: str) -> float:
    """Epoch seconds of an ISO 8601 UTC time (``2017-09-18T08:22:00Z``); BadAnswer otherwise."""
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError, AttributeError):
        raise BadAnswer(f"time {text!r} is not an ISO 8601 UTC time") from None
    if stamp.tzinfo is None:
        raise BadAnswer(f"time {text!r} has no time zone")
    return stamp.timestamp()


def parse_rfc1123(text: str) -> float:
    """Epoch seconds of an RFC 1123 time (``Mon, 19 Sep 2016 18:29:47 GMT``); BadAnswer otherwise."""
    try:
        stamp = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        raise BadAnswer(f"NotBefore {text!r} is not an RFC 1123 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _json(answer: HttpAnswer) -> object:
    try:
        return json.loads(answer.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadAnswer(f"status {answer.status} with a body that is not JSON: {answer.body[:80]!r}") from None


# ---------------------------------------------------------------------------------------------
# Providers


class _Provider:
    """What each provider's client holds: its config and its metadata server's base URL."""

    name: str

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.base = (config.endpoint or DEFAULT_ENDPOINTS[self.name]).rstrip("/")


class AwsImds(_Provider):
    """EC2 IMDSv2 spot ``instance-action`` (see the module docstring)."""

    name = "aws"
    token: str | None = None

    def next_request(self) -> HttpRequest:
        if self.token is None:
            return HttpRequest("PUT", f"{self.base}/latest/api/token",
                               {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
                               self.config.timeout_s, step="token")
        return HttpRequest("GET", f"{self.base}/latest/meta-data/spot/instance-action",
                           {"X-aws-ec2-metadata-token": self.token}, self.config.timeout_s)

    def read(self, request: HttpRequest, answer: HttpAnswer, now: float) -> Notice | None:
        if request.step == "token":
            token = answer.body.decode("utf-8", "replace").strip()
            if answer.status != 200 or not token:
                raise BadAnswer(f"token request answered {answer.status} {answer.body[:80]!r}")
            self.token = token
            return None
        if answer.status == 404:
            return None  # no interruption scheduled
        if answer.status == 401:
            self.token = None  # expired: fetch a new one
            return None
        if answer.status != 200:
            raise BadAnswer(f"instance-action answered {answer.status}")
        body = _json(answer)
        if not isinstance(body, dict) or body.get("action") not in AWS_ACTIONS:
            raise BadAnswer(f"instance-action {body!r} has no action in {sorted(AWS_ACTIONS)}")
        deadline = now if body["action"] == "hibernate" else parse_utc(body.get("time"))
        return Notice(self.name, deadline, f"{body['action']} at {body.get('time')}")

    def pause_s(self, request: HttpRequest) -> float:
        return 0.0 if request.step == "token" else self.config.poll_s


class GcpMetadata(_Provider):
    """GCE metadata ``instance/preempted`` with ``wait_for_change`` (see the module docstring)."""

    name = "gcp"
    FLAVOR = {"Metadata-Flavor": "Google"}
    etag: str | None = None

    def next_request(self) -> HttpRequest:
        url = f"{self.base}/computeMetadata/v1/instance/preempted"
        if self.etag is None:
            return HttpRequest("GET", url, self.FLAVOR, self.config.timeout_s)
        query = f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={GCP_WAIT_S}"
        return HttpRequest("GET", url + query, self.FLAVOR, GCP_WAIT_S + self.config.timeout_s)

    def read(self, request: HttpRequest, answer: HttpAnswer, now: float) -> Notice | None:
        if answer.status != 200:
            self.etag = None  # read the value afresh next time
            raise BadAnswer(f"preempted answered {answer.status}")
        if answer.header("Metadata-Flavor") != "Google":
            self.etag = None
            raise BadAnswer("answer without 'Metadata-Flavor: Google' (not the metadata server)")
        value = answer.body.decode("utf-8", "replace").strip()
        if value not in ("TRUE", "FALSE"):
            self.etag = None
            raise BadAnswer(f"preempted is {value[:40]!r}, not TRUE or FALSE")
        self.etag = answer.header("ETag")
        if value == "FALSE":
            return None
        return Notice(self.name, now + self.config.notice_s, "preempted=TRUE")

    def pause_s(self, request: HttpRequest) -> float:
        # hanging GETs wait on the server; a plain read without an ETag to wait on polls
        return 0.0 if self.etag is not None else self.config.poll_s


class AzureScheduledEvents(_Provider):
    """Azure IMDS Scheduled Events ``Preempt`` (see the module docstring)."""

    name = "azure"
    METADATA = {"Metadata": "true"}

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        self.vm_name = config.vm_name

    def next_request(self) -> HttpRequest:
        if self.vm_name is None:
            url = f"{self.base}/metadata/instance/compute/name?api-version={AZURE_NAME_API_VERSION}&format=text"
            return HttpRequest("GET", url, self.METADATA, self.config.timeout_s, step="name")
        url = f"{self.base}/metadata/scheduledevents?api-version={AZURE_API_VERSION}"
        return HttpRequest("GET", url, self.METADATA, self.config.timeout_s)

    def read(self, request: HttpRequest, answer: HttpAnswer, now: float) -> Notice | None:
        if answer.status != 200:
            raise BadAnswer(f"{request.step} request answered {answer.status}")
        if request.step == "name":
            name = answer.body.decode("utf-8", "replace").strip()
            if not name:
                raise BadAnswer("compute/name answered an empty name")
            self.vm_name = name
            return None
        return self._preempt(_json(answer), now)

    def _preempt(self, document: object, now: float) -> Notice | None:
        events = document.get("Events") if isinstance(document, dict) else None
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            raise BadAnswer(f"scheduled events document without an Events list: {str(document)[:80]}")
        mine = [e for e in events if e.get("EventType") == "Preempt" and self.vm_name in (e.get("Resources") or [])]
        if not mine:
            return None
        deadlines = [parse_rfc1123(e["NotBefore"]) if e.get("NotBefore") else now for e in mine]
        first = min(range(len(mine)), key=deadlines.__getitem__)
        return Notice(self.name, deadlines[first], f"Preempt {mine[first].get('EventId')} "
                                                   f"NotBefore {mine[first].get('NotBefore')!r}")

    def pause_s(self, request: HttpRequest) -> float:
        return 0.0 if request.step == "name" else self.config.poll_s


def sigterm_notice(now: float, grace_s: float) -> Notice:
    """Kubernetes: SIGTERM at ``now``; SIGKILL follows after the pod's grace period."""
    return Notice("k8s", now + grace_s, f"SIGTERM, grace period {grace_s:g} s")


HTTP_PROVIDERS = {"aws": AwsImds, "gcp": GcpMetadata, "azure": AzureScheduledEvents}


def make_provider(name: str, config: ProviderConfig):
    """The HTTP provider called ``name``; ValueError naming ``--provider`` and the known ones
    (k8s has no endpoint: its shell waits for SIGTERM)."""
    if name not in HTTP_PROVIDERS:
        raise ValueError(f"--provider {name!r} is not one of {list(PROVIDERS)}"
                         + (" (k8s waits for SIGTERM, it polls nothing)" if name == "k8s" else ""))
    return HTTP_PROVIDERS[name](config)
