"""Seeded, resumable Flow-GRPO rollouts and the training-time recomputation of their log-probs.

A rollout is a pure function of (velocity_fn, seeds, sigmas, noise_level, kind, window): x_0 is
initial_noise(seed) and the noise of step k is step_noise(seed, k), per sample. Hence:

    rollout(seeds, ...)  ==  rollout(seeds, ..., state=rollout(seeds, ..., stop_after=k).state())

bit for bit, also when the resumed batch is composed differently (RolloutState.select / concat),
provided velocity_fn is batch-invariant (each sample's velocity does not depend on its batch mates;
true for per-sample model calls, not guaranteed for batched CPU GEMMs) and the state's latents were
kept in float32. A preempted worker commits `trajectory.state()` and another resumes it.

Lifecycle of one sample (one denoising step per arrow):

    x_0 --step 0--> x_1 --step 1--> ... --step T-1--> x_T      (done when next_step == T)
          ^ a RolloutState(step=k, latents=x_k) can be cut at any arrow and resumed anywhere.

Trajectory buffers use NaN for what this trajectory never saw (steps not run yet; steps before a
resume whose state carried no history); ODE steps have log_prob 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .noise import initial_noise
from .step import StepKind, StepResult, sde_step
from .window import SdeWindow

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""velocity_fn(latents (B, *latent_shape) float32, sigma (B,) float32) -> velocity (B, *latent_shape)."""


@dataclass(frozen=True)
class RolloutHistory:
    """Latents x_0..x_step (B, step+1, ...), log-probs of steps 0..step-1 (B, step); NaN before first_step."""

    latents: torch.Tensor
    log_probs: torch.Tensor
    first_step: int = 0


@dataclass(frozen=True)
class RolloutState:
    """Where a rollout stands: x_step for each seed, and optionally the history needed for training."""

    step: int
    latents: torch.Tensor
    seeds: tuple[int, ...]
    history: RolloutHistory | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        batch = len(self.seeds)
        if self.step < 0 or self.latents.shape[0] != batch:
            raise ValueError(
                f"RolloutState(step={self.step}) with latents {tuple(self.latents.shape)} for {batch} seeds"
            )
        if self.history is not None:
            _check_history(self.history, batch, self.step, tuple(self.latents.shape[1:]))

    def select(self, indices: Sequence[int] | torch.Tensor) -> RolloutState:
        """The state of a subset of the samples (e.g. to resume them in another batch)."""
        idx = [int(i) for i in indices]  # accepts lists, numpy arrays and 1-D tensors
        history = None
        if self.history is not None:
            h = self.history
            history = RolloutHistory(h.latents[idx], h.log_probs[idx], h.first_step)
        return RolloutState(self.step, self.latents[idx], [self.seeds[i] for i in idx], history)

    @staticmethod
    def concat(states: Sequence[RolloutState]) -> RolloutState:
        """Merge states at the same step into one batch (histories: all or none)."""
        if not states or len({s.step for s in states}) != 1:
            steps = [s.step for s in states]
            raise ValueError(f"concat needs a non-empty list of states at one step, got steps {steps}")
        if len({s.history is None for s in states}) != 1:
            raise ValueError("concat needs all states with history or all without")
        seeds = [seed for s in states for seed in s.seeds]
        latents = torch.cat([s.latents for s in states])
        history = None
        if states[0].history is not None:
            history = RolloutHistory(
                torch.cat([s.history.latents for s in states]),
                torch.cat([s.history.log_probs for s in states]),
                max(s.history.first_step for s in states),
            )
        return RolloutState(states[0].step, latents, seeds, history)


def _check_history(history: RolloutHistory, batch: int, step: int, latent_shape: tuple[int, ...]) -> None:
    want_latents, want_log_probs = (batch, step + 1, *latent_shape), (batch, step)
    if tuple(history.latents.shape) != want_latents or tuple(history.log_probs.shape) != want_log_probs:
        raise ValueError(
            f"history latents {tuple(history.latents.shape)} / log_probs {tuple(history.log_probs.shape)}; "
            f"expected {want_latents} / {want_log_probs}"
        )


@dataclass(frozen=True)
class Trajectory:
    """A (possibly partial) rollout of B samples over T = len(sigmas) - 1 steps.

    latents (B, T+1, ...) x_0..x_T or None (keep_latents=False); log_probs (B, T); noised (T,) bool;
    final (B, ...) is x_{next_step}: the end result once `done`, the resume point before that.
    """

    seeds: tuple[int, ...]
    sigmas: torch.Tensor
    latents: torch.Tensor | None
    log_probs: torch.Tensor
    noised: torch.Tensor
    final: torch.Tensor
    next_step: int
    kind: StepKind
    noise_level: float
    first_step: int

    @property
    def num_steps(self) -> int:
        return self.sigmas.shape[0] - 1

    @property
    def done(self) -> bool:
        return self.next_step == self.num_steps

    def state(self, with_history: bool = True) -> RolloutState:
        """The resume point; with_history carries x_0..x_k and log-probs when latents were kept."""
        history = None
        if with_history and self.latents is not None:
            history = RolloutHistory(
                self.latents[:, : self.next_step + 1], self.log_probs[:, : self.next_step], self.first_step
            )
        return RolloutState(self.next_step, self.final, self.seeds, history)

    def select(self, indices: Sequence[int] | torch.Tensor) -> Trajectory:
        """The trajectory of a subset of the samples (e.g. a training micro-batch)."""
        idx = [int(i) for i in indices]  # accepts lists, numpy arrays and 1-D tensors
        return Trajectory(
            seeds=tuple(self.seeds[i] for i in idx),
            sigmas=self.sigmas,
            latents=None if self.latents is None else self.latents[idx],
            log_probs=self.log_probs[idx],
            noised=self.noised,
            final=self.final[idx],
            next_step=self.next_step,
            kind=self.kind,
            noise_level=self.noise_level,
            first_step=self.first_step,
        )


def _as_schedule(sigmas: torch.Tensor | Sequence[float], device) -> torch.Tensor:
    schedule = torch.as_tensor(sigmas, dtype=torch.float32).to(device)
    cpu = schedule.cpu()
    if cpu.dim() != 1 or cpu.numel() < 2 or not bool((cpu[1:] < cpu[:-1]).all()) or cpu[-1] < 0 or cpu[0] > 1:
        raise ValueError(f"sigmas={cpu.tolist()} must be 1-D, of length >= 2, strictly decreasing, in [0, 1]")
    return schedule


def _noise_plan(kind: StepKind, window: SdeWindow | None, num_steps: int) -> torch.Tensor:
    if kind is StepKind.ODE:
        return torch.zeros(num_steps, dtype=torch.bool)
    if window is None:
        return torch.ones(num_steps, dtype=torch.bool)
    return window.mask(num_steps)


def _start_state(seeds, latent_shape, state: RolloutState | None, num_steps: int, device) -> RolloutState:
    seeds = tuple(int(s) for s in seeds)
    if state is None:
        return RolloutState(0, initial_noise(seeds, latent_shape, device=device), seeds)
    if state.seeds != seeds:
        raise ValueError(f"state.seeds={state.seeds} differ from seeds={seeds}")
    if tuple(state.latents.shape[1:]) != tuple(latent_shape) or state.step > num_steps:
        raise ValueError(
            f"state at step {state.step} with latents {tuple(state.latents.shape)} does not fit "
            f"latent_shape={tuple(latent_shape)} and {num_steps} steps"
        )
    return state


@dataclass
class _Buffers:
    """Mutable recording area of one rollout call; frozen into a Trajectory at the end."""

    latents: torch.Tensor | None
    log_probs: torch.Tensor
    first_step: int

    @classmethod
    def open(cls, start: RolloutState, num_steps: int, keep_latents: bool, device) -> _Buffers:
        batch, shape = start.latents.shape[0], tuple(start.latents.shape[1:])
        log_probs = torch.full((batch, num_steps), float("nan"), device=device)
        latents = None
        if keep_latents:
            latents = torch.full((batch, num_steps + 1, *shape), float("nan"), device=device)
        first_step = start.step
        if start.history is not None:
            log_probs[:, : start.step] = start.history.log_probs.to(device)
            first_step = start.history.first_step
            if latents is not None:
                latents[:, : start.step + 1] = start.history.latents.to(device)
        if latents is not None:
            latents[:, start.step] = start.latents.to(device)
        return cls(latents, log_probs, first_step)

    def record(self, step: int, result: StepResult) -> None:
        self.log_probs[:, step] = result.log_prob
        if self.latents is not None:
            self.latents[:, step + 1] = result.prev_sample


def _velocity(velocity_fn: VelocityFn, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return velocity_fn(x, sigma.expand(x.shape[0]).contiguous())


@torch.no_grad()
def rollout(
    velocity_fn: VelocityFn,
    seeds: Sequence[int],
    sigmas: torch.Tensor | Sequence[float],
    latent_shape: tuple[int, ...],
    *,
    noise_level: float,
    kind: str | StepKind = "sde",
    window: SdeWindow | None = None,
    state: RolloutState | None = None,
    stop_after: int | None = None,
    keep_latents: bool = True,
    device: torch.device | str | None = None,
) -> Trajectory:
    """Denoise from x_0 = initial_noise(seeds) (or from `state`) for at most `stop_after` steps.

    Steps outside `window` (all steps when window is None) use kind "ode". `device` defaults to the
    state's device, else the device of `sigmas`.
    """
    step_kind = StepKind.parse(kind)
    if device is None:
        device = state.latents.device if state is not None else getattr(sigmas, "device", "cpu")
    schedule = _as_schedule(sigmas, device)
    num_steps = schedule.shape[0] - 1
    noised = _noise_plan(step_kind, window, num_steps)
    if bool(noised.any()) and not noise_level > 0:
        raise ValueError(f"noise_level={noise_level} must be > 0 for kind={step_kind.value!r}")
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after={stop_after} must be >= 0")
    start = _start_state(seeds, latent_shape, state, num_steps, device)
    stop = num_steps if stop_after is None else min(num_steps, start.step + stop_after)
    buffers = _Buffers.open(start, num_steps, keep_latents, device)
    x = start.latents.to(device=device, dtype=torch.float32)
    plan = noised.tolist()
    for k in range(start.step, stop):
        result = sde_step(
            _velocity(velocity_fn, x, schedule[k]), x, schedule[k], schedule[k + 1],
            noise_level=noise_level, kind=step_kind if plan[k] else StepKind.ODE,
            generator_seeds=start.seeds, step_index=k,
        )
        x = result.prev_sample
        buffers.record(k, result)
    return Trajectory(
        seeds=start.seeds, sigmas=schedule, latents=buffers.latents, log_probs=buffers.log_probs,
        noised=noised, final=x, next_step=stop, kind=step_kind,
        noise_level=float(noise_level), first_step=buffers.first_step,
    )


def _check_recompute(trajectory: Trajectory, step: int, noise_level: float, kind: StepKind) -> None:
    if trajectory.latents is None:
        raise ValueError("the trajectory kept no latents (keep_latents=False); cannot recompute log-probs")
    if not trajectory.first_step <= step < trajectory.next_step:
        seen = f"[{trajectory.first_step}, {trajectory.next_step})"
        raise ValueError(f"step={step} is outside the steps this trajectory saw, {seen}")
    if not bool(trajectory.noised[step]):
        raise ValueError(f"step={step} was an ODE step; it has no log-prob to train on")
    if kind is not trajectory.kind or float(noise_level) != trajectory.noise_level:
        raise ValueError(
            f"kind={kind.value!r}, noise_level={noise_level} differ from the rollout's "
            f"kind={trajectory.kind.value!r}, noise_level={trajectory.noise_level}"
        )


def recompute_log_probs(
    velocity_fn: VelocityFn,
    trajectory: Trajectory,
    step: int,
    *,
    noise_level: float,
    kind: str | StepKind = "sde",
) -> StepResult:
    """Re-evaluate step `step` of a recorded trajectory under the current weights, with gradients.

    With unchanged weights (and a batch-invariant velocity_fn) log_prob equals the rollout's
    trajectory.log_probs[:, step] bit for bit, so the first PPO ratio is exactly 1.
    """
    step_kind = StepKind.parse(kind)
    _check_recompute(trajectory, step, noise_level, step_kind)
    x = trajectory.latents[:, step].contiguous()
    sigma = trajectory.sigmas[step]
    with torch.enable_grad():
        return sde_step(
            _velocity(velocity_fn, x, sigma), x, sigma, trajectory.sigmas[step + 1],
            noise_level=noise_level, kind=step_kind, prev_sample=trajectory.latents[:, step + 1].contiguous(),
        )
