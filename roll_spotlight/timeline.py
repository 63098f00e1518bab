"""A worker's timed phases, as a run's timeline records them: {"worker", "phase", "start", "end"}."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Timeline:
    """The timed phases of one worker. ``clock`` is wall time, so the events of several processes
    merge into one timeline; a backend whose events stay in one process may pass a monotonic one."""

    def __init__(self, worker: str, clock: Callable[[], float] = time.time) -> None:
        self.worker, self.clock = worker, clock
        self.events: list[dict] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the body as phase ``name`` (a body that raises records nothing)."""
        start = self.clock()
        yield
        self.add(name, start)

    def add(self, name: str, start: float) -> None:
        """Record phase ``name`` from ``start`` until now."""
        self.events.append({"worker": self.worker, "phase": name, "start": start, "end": self.clock()})
