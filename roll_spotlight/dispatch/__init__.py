"""Dispatch: the pull-based, preemption-aware request queue (docs/design.md section 4).

The pure core (``queue``, ``requests``) is exported here and imports neither ray nor torch. The Ray
shell lives in ``roll_spotlight.dispatch.queue_actor`` (``QueueActor``, ``QueueClient``); import it from
there, or through this package's lazy attributes, which load ray only on first use.
"""
from __future__ import annotations

from roll_spotlight.lazy import lazy_exports
from roll_spotlight.dispatch.queue import (
    TRANSITIONS,
    ManualClock,
    QueueConfig,
    QueueSnapshot,
    QueueStats,
    RequestQueue,
    RequestRecord,
    RequestState,
)
from roll_spotlight.dispatch.requests import (
    KIND_ORDER,
    Completion,
    FailedRequest,
    InFlightState,
    Lease,
    MicroBatch,
    Request,
    RequestKind,
    RequestResult,
    RequestSource,
    RequestSpec,
    Schedule,
)

_LAZY = {
    "QueueActor": "roll_spotlight.dispatch.queue_actor",
    "QueueClient": "roll_spotlight.dispatch.queue_actor",
    "QueueServer": "roll_spotlight.dispatch.queue_actor",
    "create_queue_actor": "roll_spotlight.dispatch.queue_actor",
}

__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "KIND_ORDER", "TRANSITIONS", "Completion", "FailedRequest", "InFlightState", "Lease",
    "ManualClock", "MicroBatch", "QueueConfig", "QueueSnapshot", "QueueStats", "Request", "RequestKind",
    "RequestQueue", "RequestRecord", "RequestResult", "RequestSource", "RequestSpec",
    "RequestState", "Schedule", *_LAZY,
]
