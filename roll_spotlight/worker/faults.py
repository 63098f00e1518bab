"""Deterministic failure injection for a worker (as torchft's ``fail_at``).

Tests and the regroup benchmark need a preemption to land at an exact point: mid-rollout after
step k, or mid-sum after m micro-batches. A `Hold` observes the worker loop's progress
(``WorkerLoop.on_progress``) and parks the worker there until a stop, notice or leave wakes it
(``Signals.wake``); ``held`` says it is parked, so the test can then send the notice or kill the
process. Production workers run without one.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class FaultPlan:
    """Where to park: at the step boundary where a batch's most advanced running row reaches
    step ``hold_at_step`` of its trajectory, or after the ``hold_at_micro_batch``-th micro-batch
    of the worker's life (round, in an SP group). None: never."""

    hold_at_step: int | None = None
    hold_at_micro_batch: int | None = None


class Hold:
    """``plan``'s holds as a progress observer; ``wake`` (the loop's `Signals.wake`) releases one."""

    def __init__(self, plan: FaultPlan, wake: threading.Event) -> None:
        self.plan, self.wake = plan, wake
        self.held = threading.Event()

    def __call__(self, kind: str, reached: int) -> None:
        due = self.plan.hold_at_step if kind == "step" else self.plan.hold_at_micro_batch
        if reached == due:
            self.held.set()
            self.wake.wait()
