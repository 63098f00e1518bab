"""Data types of the request queue: what a request is, what a worker holds, what comes back.

Everything here is a plain frozen dataclass or enum (no ray, no torch), so the queue state can be
pickled into a checkpoint and shipped between Ray actors as is. Latents and outputs are opaque
objects: the queue stores and returns them but never looks inside (the runtime puts numpy arrays or
Ray ObjectRefs there).
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

STEP_KINDS = frozenset({"sde", "cps", "cps_gaussian", "ode"})


class RequestKind(enum.Enum):
    """ROLLOUT and TRAIN requests are on the critical path of an iteration (the trainer waits for
    them); EXPLORE requests are not. A TRAIN request is one micro-batch of an update (see
    :class:`MicroBatch`). Hashed by identity (members are singletons; Enum's own __hash__ is
    Python code on the queue's hot path)."""

    __hash__ = object.__hash__

    ROLLOUT = "rollout"
    TRAIN = "train"
    EXPLORE = "explore"


# Default pull order across kinds: rollouts, then training work (both on the critical path), then
# exploration. A worker may be given another order (``RequestQueue.set_order``).
KIND_ORDER: tuple[RequestKind, ...] = (RequestKind.ROLLOUT, RequestKind.TRAIN, RequestKind.EXPLORE)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of an iteration's update: the loss gradient of batch ``rows`` (indices
    into the iteration's whole batch, in sample order) at trained denoising step ``step``.
    ``index`` is its position in the update's fixed micro-batch order; the gradient of the update
    is the sum over every index of the iteration, each counted once."""

    index: int
    rows: tuple[int, ...]
    step: int

    def __post_init__(self) -> None:
        if self.index < 0 or self.step < 0 or not self.rows or min(self.rows) < 0:
            raise ValueError(f"MicroBatch needs index >= 0, step >= 0 and non-empty rows >= 0, got "
                             f"index={self.index}, step={self.step}, rows={self.rows}")


@dataclass(frozen=True)
class Schedule:
    """How a request is denoised: ``num_steps`` steps; steps ``[window_start, window_end)`` (the
    SDE window; ``window_end=None`` means all steps) are ``kind`` steps with noise level
    ``noise_level``, the others plain ODE steps.

    Hashable on purpose: together with weights, prompt and seed it fully determines a trajectory.
    """

    num_steps: int
    noise_level: float
    kind: str = "sde"
    window_start: int = 0
    window_end: int | None = None

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"Schedule.num_steps must be >= 1, got {self.num_steps}")
        if not (math.isfinite(self.noise_level) and self.noise_level >= 0):
            raise ValueError(f"Schedule.noise_level must be finite and >= 0, got {self.noise_level}")
        if self.kind not in STEP_KINDS:
            raise ValueError(f"Schedule.kind must be one of {sorted(STEP_KINDS)}, got {self.kind!r}")
        _, end = self.window
        if not 0 <= self.window_start <= end <= self.num_steps:
            raise ValueError(
                f"Schedule window must satisfy 0 <= window_start <= window_end <= num_steps, got "
                f"window_start={self.window_start}, window_end={self.window_end}, "
                f"num_steps={self.num_steps}"
            )

    @property
    def window(self) -> tuple[int, int]:
        """The SDE window as ``(start, end)`` steps, ``window_end=None`` resolved to ``num_steps``."""
        return self.window_start, self.num_steps if self.window_end is None else self.window_end


def plan_micro_batches(rows: Sequence[int], steps: Sequence[int], size: int) -> list[MicroBatch]:
    """An update's micro-batches: chunks of ``size`` of ``rows``, each at every one of ``steps``,
    chunk-major and step-minor (the order a trainer accumulates in; indices follow it)."""
    rows = [int(r) for r in rows]
    chunks = [tuple(rows[i:i + size]) for i in range(0, len(rows), size)]
    return [MicroBatch(c * len(steps) + j, chunk, int(k)) for c, chunk in enumerate(chunks)
            for j, k in enumerate(steps)]


@dataclass(frozen=True)
class RequestSpec:
    """A request as the submitter describes it; the queue adds the id (see :class:`Request`)."""

    prompt_id: int
    prompt: str
    seed: int
    schedule: Schedule
    weight_version: int
    kind: RequestKind
    iteration: int
    priority: int = 0
    micro_batch: MicroBatch | None = None  # TRAIN requests only

    def __post_init__(self) -> None:
        for key in ("prompt_id", "weight_version", "iteration"):
            if getattr(self, key) < 0:
                raise ValueError(f"RequestSpec.{key} must be >= 0, got {getattr(self, key)}")
        if not isinstance(self.kind, RequestKind):
            raise ValueError(f"RequestSpec.kind must be a RequestKind, got {self.kind!r}")
        if (self.kind is RequestKind.TRAIN) != (self.micro_batch is not None):
            raise ValueError(f"RequestSpec: a TRAIN request carries a micro_batch and no other kind does "
                             f"(kind={self.kind.value}, micro_batch={self.micro_batch})")

    @classmethod
    def train(cls, micro_batch: MicroBatch, schedule: Schedule, weight_version: int, iteration: int) -> RequestSpec:
        """The TRAIN request of one micro-batch of ``iteration``'s update from ``weight_version``;
        ``schedule`` is the one its trajectories were sampled with (prompt and seed are unused)."""
        return cls(prompt_id=0, prompt="", seed=0, schedule=schedule, weight_version=weight_version,
                   kind=RequestKind.TRAIN, iteration=iteration, micro_batch=micro_batch)


@dataclass(frozen=True, kw_only=True)
class Request(RequestSpec):
    """One rollout of (prompt, seed, schedule), or one training micro-batch, under one weight
    version: a `RequestSpec` with the ``request_id`` the queue assigned, unique and increasing in
    submission order."""

    request_id: int

    @classmethod
    def from_spec(cls, request_id: int, spec: RequestSpec) -> Request:
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(RequestSpec)}
        return cls(request_id=request_id, **values)

    @property
    def batch_shape(self) -> tuple:
        """What requests must share to run in one batch (`BATCH_SHAPE_FIELDS`): kind, weight
        version, steps, noise level and step kind ("ode" is "sde" with an empty window); a TRAIN
        request's steps stand for nothing (a gradient sum covers one update)."""
        s = self.schedule
        return self.kind, self.weight_version, s.num_steps, s.noise_level, "sde" if s.kind == "ode" else s.kind


BATCH_SHAPE_FIELDS = ("kind", "weight_version", "schedule.num_steps", "schedule.noise_level", "schedule.kind")


def check_one_shape(leases: Sequence[Lease], shape: tuple | None = None) -> tuple:
    """The batch shape ``leases`` share (``shape``: the batch's); ValueError naming the first field
    of a lease that differs."""
    shape = shape or leases[0].request.batch_shape
    for lease in leases:
        for name, want, got in zip(BATCH_SHAPE_FIELDS, shape, lease.request.batch_shape):
            if want != got:
                raise ValueError(f"leases of different shapes offered to one batch: request "
                                 f"{lease.request.request_id} has {name}={got!r}, the batch {want!r}")
    return shape


@dataclass(frozen=True)
class InFlightState:
    """A partly done rollout committed back to the queue: the latent *after* ``step_index``
    denoising steps. Seeds determine trajectories (docs/design.md section 4), so any worker holding
    the same weight version resumes it bit-identically from here."""

    request_id: int
    step_index: int
    latent: object = field(compare=False, repr=False)
    seed: int
    weight_version: int


@dataclass(frozen=True)
class Lease:
    """A worker's right to run ``request`` until ``deadline`` (queue clock). ``lease_id`` is
    unique across the queue's life; only a completion carrying the current ``lease_id`` counts.
    ``resume`` is the last committed state to continue from, or None to start at step 0."""

    lease_id: int
    request: Request
    worker: str
    deadline: float
    resume: InFlightState | None
    attempt: int

    def result(self, output: object) -> RequestResult:
        return RequestResult(self.request.request_id, self.lease_id, output)


@dataclass(frozen=True)
class RequestResult:
    """What a worker reports for a finished lease; ``output`` is opaque to the queue."""

    request_id: int
    lease_id: int
    output: object = field(compare=False, repr=False)


@dataclass(frozen=True)
class Completion:
    """An accepted result: exactly one per DONE request."""

    request: Request
    output: object = field(compare=False, repr=False)
    worker: str
    lease_id: int
    completed_at: float


@dataclass(frozen=True)
class FailedRequest:
    """A request given up after ``attempts`` failed leases (see ``QueueConfig.max_attempts``)."""

    request: Request
    attempts: int
    last_error: str


class RequestSource(Protocol):
    """Lazy request generation: asked by ``pull`` when nothing at all is pending, so a planner
    can decide what to explore at the last moment, as workers become free."""

    def next_requests(self, worker: str, n: int) -> list[RequestSpec]: ...
