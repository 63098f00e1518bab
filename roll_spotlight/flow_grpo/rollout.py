"""Seeded, resumable Flow-GRPO rollouts in step-level batches, and the training recompute of
their log-probs.

`RolloutSlots` holds one sample per slot, each with its own step, seed and noise plan; `denoise`
advances every active slot with one velocity call per step and calls a hook at each step boundary
(a worker's engine takes finished samples out and refills their slots there); `rollout` is the
plain case. x_0 is initial_noise(seed) and step k's noise step_noise(seed, k), per sample, so a
state cut at any step (`RolloutState`) resumes anywhere to the same trajectory: bit for bit when
the velocity is batch-invariant, else up to the batched GEMM's rounding (docs/design.md, 5b).
NaN marks what a trajectory never saw (steps not run, steps before a resume without history);
ODE steps have log_prob 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .noise import initial_noise, step_noise, to_device
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
        b, h, shape = len(self.seeds), self.history, tuple(self.latents.shape[1:])
        if self.step < 0 or self.latents.shape[0] != b or h is not None and (
                tuple(h.latents.shape) != (b, self.step + 1, *shape) or tuple(h.log_probs.shape) != (b, self.step)):
            history = "" if h is None else f", history {tuple(h.latents.shape)} / {tuple(h.log_probs.shape)}"
            raise ValueError(f"RolloutState at step {self.step} for {b} seeds: latents {tuple(self.latents.shape)}"
                             f"{history}")


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

    def select(self, indices: Sequence[int] | torch.Tensor) -> Trajectory:
        """The trajectory of a subset of the samples (e.g. a training micro-batch)."""
        idx = [int(i) for i in indices]  # accepts lists, numpy arrays and 1-D tensors
        return Trajectory(tuple(self.seeds[i] for i in idx), self.sigmas,
                          None if self.latents is None else self.latents[idx], self.log_probs[idx], self.noised,
                          self.final[idx], self.next_step, self.kind, self.noise_level, self.first_step)


def _as_schedule(sigmas: torch.Tensor | Sequence[float], device) -> torch.Tensor:
    """The schedule on `device`, checked once (one host copy per batch, not per step)."""
    schedule = torch.as_tensor(sigmas, dtype=torch.float32).to(device)
    cpu = schedule.cpu()
    if cpu.dim() != 1 or cpu.numel() < 2 or not bool((cpu[1:] < cpu[:-1]).all()) or cpu[-1] < 0 or cpu[0] > 1:
        raise ValueError(f"sigmas={cpu.tolist()} must be 1-D, of length >= 2, strictly decreasing, in [0, 1]")
    return schedule


def noise_plan(kind: str | StepKind, window: SdeWindow | None, num_steps: int) -> torch.Tensor:
    """(num_steps,) bool: the steps that get noise (none for "ode"; all when window is None)."""
    if StepKind.parse(kind) is StepKind.ODE:
        return torch.zeros(num_steps, dtype=torch.bool)
    if window is None:
        return torch.ones(num_steps, dtype=torch.bool)
    return window.mask(num_steps)


SlotVelocityFn = Callable[[torch.Tensor, torch.Tensor, Sequence[int]], torch.Tensor]
"""velocity_fn(latents (A, ...), sigma (A,), slots): the velocity of the A active slots, in that order."""


class RolloutSlots:
    """Up to `capacity` samples of one schedule, noise level and kind, one per slot (step-level
    batching, as vLLM-Omni's diffusion step execution). Buffers (latents, history, log-probs) are
    allocated once and written by index; the schedule is checked once; a step moves nothing to the
    host. `admit` loads a slot (fresh, or a RolloutState at step k), `trajectory` / `state` read
    it, `evict` frees it for a refill at a step boundary while the other slots go on."""

    def __init__(self, capacity: int, sigmas, latent_shape: tuple[int, ...], *, noise_level: float,
                 kind: str | StepKind = "sde", keep_latents: bool = True, device=None) -> None:
        self.kind = StepKind.parse(kind)
        device = torch.device(device or getattr(sigmas, "device", "cpu"))
        self.sigmas = _as_schedule(sigmas, device)
        self.num_steps, self.noise_level = self.sigmas.shape[0] - 1, float(noise_level)
        self.latent_shape, self.capacity, self.device = tuple(latent_shape), capacity, device
        nan = float("nan")
        self.latents = torch.zeros((capacity, *latent_shape), device=device)
        self.history = (torch.full((capacity, self.num_steps + 1, *latent_shape), nan, device=device)
                        if keep_latents else None)
        self.log_probs = torch.full((capacity, self.num_steps), nan, device=device)
        self.noised = torch.zeros((capacity, self.num_steps), dtype=torch.bool)  # on the host: who draws
        self._noised = self.noised.to(device)  # the same on the device: the step's per-row flags
        self._plan: list[list[bool]] = [[]] * capacity  # and as lists, read per row and step
        self.step: list[int | None] = [None] * capacity  # None: a free slot
        self.first_step, self.seeds = [0] * capacity, [0] * capacity
        self._steps = torch.zeros(capacity, dtype=torch.long, device=device)
        self._index: tuple[tuple[int, ...], torch.Tensor] | None = None

    @property
    def free(self) -> list[int]:
        return [i for i, k in enumerate(self.step) if k is None]

    @property
    def active(self) -> list[int]:
        """The occupied slots with steps left to run."""
        return [i for i, k in enumerate(self.step) if k is not None and k < self.num_steps]

    def finished(self, slot: int) -> bool:
        return self.step[slot] == self.num_steps

    def admit(self, slot: int, seed: int, noised: torch.Tensor, state: RolloutState | None = None) -> None:
        """Load one sample into a free slot: x_0 of `seed`, or `state` (one row, at its step)."""
        if self.step[slot] is not None:
            raise ValueError(f"slot {slot} is occupied")
        if state is None:
            state = RolloutState(0, initial_noise([seed], self.latent_shape, device=self.device), (seed,))
        elif state.seeds != (seed,) or tuple(state.latents.shape[1:]) != self.latent_shape or state.step > self.num_steps:
            raise ValueError(f"state.seeds={state.seeds} at step {state.step} with latents {tuple(state.latents.shape)} "
                             f"does not fit seed {seed}, latent_shape={self.latent_shape} and {self.num_steps} steps")
        k, history = state.step, state.history
        self.latents[slot] = state.latents[0].to(self.device, torch.float32)
        self.log_probs[slot] = float("nan")
        self.first_step[slot] = k if history is None else history.first_step
        if history is not None:
            self.log_probs[slot, :k] = history.log_probs[0].to(self.device)
        if self.history is not None:
            self.history[slot] = float("nan")
            if history is not None:
                self.history[slot, : k + 1] = history.latents[0].to(self.device)
            self.history[slot, k] = self.latents[slot]
        self.noised[slot] = torch.as_tensor(noised, dtype=torch.bool)
        self._plan[slot] = self.noised[slot].tolist()
        self._noised[slot] = to_device(self.noised[slot], self.device)
        self.seeds[slot], self.step[slot], self._steps[slot] = int(seed), k, k

    def evict(self, slot: int) -> None:
        self.step[slot] = None

    def advance(self, velocity_fn: SlotVelocityFn) -> None:
        """One denoising step of every active slot: one velocity call, one batched step."""
        rows = self.active
        index = self._rows(rows)
        everyone = len(rows) == self.capacity
        x = self.latents if everyone else self.latents.index_select(0, index)
        steps = self._steps if everyone else self._steps.index_select(0, index)
        sigma, sigma_next = self.sigmas[steps], self.sigmas[steps + 1]
        draws = [self.step[r] if self._plan[r][self.step[r]] else None for r in rows]
        noised = None if None not in draws else self._noised[index, steps]
        kind = self.kind if any(k is not None for k in draws) else StepKind.ODE
        noise = None if kind is StepKind.ODE else step_noise([self.seeds[r] for r in rows], draws,
                                                             self.latent_shape, device=self.device)
        result = sde_step(velocity_fn(x, sigma, rows), x, sigma, sigma_next, noise_level=self.noise_level,
                          kind=kind, noise=noise, noised=noised)
        self._record(index, steps, result, everyone)
        for r in rows:
            self.step[r] += 1

    def _record(self, index: torch.Tensor, steps: torch.Tensor, result: StepResult, everyone: bool) -> None:
        self.log_probs[index, steps] = result.log_prob
        if self.history is not None:
            self.history[index, steps + 1] = result.prev_sample
        if everyone:
            self.latents, self._steps = result.prev_sample, self._steps + 1
        else:
            self.latents.index_copy_(0, index, result.prev_sample)
            self._steps.index_add_(0, index, torch.ones_like(index))

    def _rows(self, rows: list[int]) -> torch.Tensor:
        """The device index of `rows`, rebuilt only when the active set changes."""
        key = tuple(rows)
        if self._index is None or self._index[0] != key:
            self._index = (key, to_device(torch.tensor(rows, dtype=torch.long), self.device))
        return self._index[1]

    def trajectory(self, slots: Sequence[int]) -> Trajectory:
        """The samples of `slots` (at one step and one noise plan) as a Trajectory of copies."""
        steps = {self.step[s] for s in slots}
        assert len(steps) == 1 and None not in steps, f"slots {list(slots)} stand at steps {steps}"
        idx = list(slots)
        if idx == list(range(self.capacity)):  # every slot: the buffers themselves, no copy
            idx = slice(None)
        return Trajectory(
            seeds=tuple(self.seeds[s] for s in slots), sigmas=self.sigmas,
            latents=None if self.history is None else self.history[idx], log_probs=self.log_probs[idx],
            noised=self.noised[slots[0]].clone(), final=self.latents[idx], next_step=steps.pop(),
            kind=self.kind, noise_level=self.noise_level, first_step=max(self.first_step[s] for s in slots),
        )

    def state(self, slot: int) -> RolloutState:
        """Where the sample in `slot` stands (with its history, if kept): what a commit hands on."""
        k, row = self.step[slot], [slot]
        history = None if self.history is None else RolloutHistory(
            self.history[row, : k + 1], self.log_probs[row, :k], self.first_step[slot])
        return RolloutState(k, self.latents[row], (self.seeds[slot],), history)


@torch.no_grad()
def denoise(slots: RolloutSlots, velocity_fn: SlotVelocityFn,
            between_steps: Callable[[RolloutSlots], bool] | None = None) -> None:
    """Step the active slots, one velocity call per step, until none is active or `between_steps`
    returns False. `between_steps(slots)` runs at every step boundary: the scheduler's hook to take
    finished samples out, refill their slots and decide whether to go on; the flow math is entered
    once per batch, not once per step."""
    while slots.active:
        slots.advance(velocity_fn)
        if between_steps is not None and not between_steps(slots):
            return


@torch.no_grad()
def rollout(velocity_fn: VelocityFn, seeds: Sequence[int], sigmas: torch.Tensor | Sequence[float],
            latent_shape: tuple[int, ...], *, noise_level: float, kind: str | StepKind = "sde",
            window: SdeWindow | None = None, keep_latents: bool = True,
            device: torch.device | str | None = None) -> Trajectory:
    """Denoise x_0 = initial_noise(seeds) to the end, every sample in a slot of one `RolloutSlots`
    (`denoise` with no scheduler). Steps outside `window` (all steps when window is None) use kind
    "ode". `device` defaults to the device of `sigmas`."""
    step_kind = StepKind.parse(kind)
    slots = RolloutSlots(len(seeds), sigmas, latent_shape, noise_level=noise_level, kind=step_kind,
                         keep_latents=keep_latents, device=device)
    plan = noise_plan(step_kind, window, slots.num_steps)
    if bool(plan.any()) and not noise_level > 0:
        raise ValueError(f"noise_level={noise_level} must be > 0 for kind={step_kind.value!r}")
    for i, seed in enumerate(seeds):
        slots.admit(i, int(seed), plan)
    denoise(slots, lambda x, sigma, rows: velocity_fn(x, sigma))
    return slots.trajectory(range(len(seeds)))


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


def recompute_log_probs(velocity_fn: VelocityFn, trajectory: Trajectory, step: int, *, noise_level: float,
                        kind: str | StepKind = "sde") -> StepResult:
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
            velocity_fn(x, sigma.expand(x.shape[0]).contiguous()), x, sigma, trajectory.sigmas[step + 1],
            noise_level=noise_level, kind=step_kind, prev_sample=trajectory.latents[:, step + 1].contiguous(),
        )
