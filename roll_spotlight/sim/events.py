"""A small deterministic discrete-event engine.

Events are kept in a heap ordered by ``(time, priority, sequence)``. The sequence number is the
order in which events were scheduled, so two events at the same time and priority always run in
scheduling order: a simulation is a pure function of its inputs and seed, never of hash order or
wall-clock time. Cancelled events stay in the heap and are skipped when popped (lazy deletion),
which keeps ``cancel`` O(1).

Invariant: simulated time never goes backwards; scheduling an event in the past is a bug (assert).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable

# Lower runs first among events at the same instant. Market events (a GPU appears or disappears)
# go before work completions at the same instant, so a completion on a node that is reclaimed at
# that very second is treated as lost rather than racing the reclamation.
PRIORITY_MARKET = 0
PRIORITY_DEFAULT = 5


@dataclass(order=True)
class _Entry:
    time: float
    priority: int
    seq: int
    callback: Callable[..., Any] = field(compare=False)
    args: tuple = field(compare=False, default=())
    cancelled: bool = field(compare=False, default=False)


class EventHandle:
    """Returned by ``schedule``; lets the caller cancel the event before it runs."""

    __slots__ = ("_entry",)

    def __init__(self, entry: _Entry) -> None:
        self._entry = entry

    @property
    def time(self) -> float:
        return self._entry.time

    @property
    def pending(self) -> bool:
        return not self._entry.cancelled

    def cancel(self) -> None:
        self._entry.cancelled = True


class EventLoop:
    """Heap of timed callbacks. ``run_until`` pops them in order and advances ``now``."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now = float(start_s)
        self._heap: list[_Entry] = []
        self._seq = 0
        self.events_run = 0

    def schedule(self, time_s: float, callback: Callable[..., Any], *args: Any,
                 priority: int = PRIORITY_DEFAULT) -> EventHandle:
        """Run ``callback(*args)`` at absolute simulated time ``time_s``."""
        assert time_s >= self.now - 1e-9, f"event at {time_s} scheduled in the past (now {self.now})"
        entry = _Entry(max(time_s, self.now), priority, self._seq, callback, args)
        self._seq += 1
        heapq.heappush(self._heap, entry)
        return EventHandle(entry)

    def after(self, delay_s: float, callback: Callable[..., Any], *args: Any,
              priority: int = PRIORITY_DEFAULT) -> EventHandle:
        """Run ``callback(*args)`` ``delay_s`` seconds from now."""
        assert delay_s >= 0, f"negative delay {delay_s}"
        return self.schedule(self.now + delay_s, callback, *args, priority=priority)

    def step(self) -> bool:
        """Run the next live event; return False when none is left."""
        while self._heap:
            entry = heapq.heappop(self._heap)
            if entry.cancelled:
                continue
            self.now = entry.time
            entry.cancelled = True  # a handle to a finished event reports not pending
            self.events_run += 1
            entry.callback(*entry.args)
            return True
        return False

    def run_until(self, until: float | None = None, stop: Callable[[], bool] | None = None) -> None:
        """Run events until the heap is empty, the next event is after ``until``, or ``stop()``."""
        while self._heap:
            if stop is not None and stop():
                return
            nxt = self._peek_time()
            if nxt is None or (until is not None and nxt > until):
                break
            self.step()
        if until is not None and (stop is None or not stop()):
            self.now = max(self.now, until)

    def _peek_time(self) -> float | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].time if self._heap else None

    def pending(self) -> int:
        """Number of live events still queued."""
        return sum(1 for e in self._heap if not e.cancelled)
