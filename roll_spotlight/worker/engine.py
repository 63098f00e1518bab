"""The rollout engine: leased requests of one shape denoised together, one forward per step.

A batch holds up to ``max_batch`` requests of one `Request.batch_shape`, each in a slot of
`flow_grpo.RolloutSlots` with its own step, seed and noise window (a request resumed at step k
shares a forward with fresh ones). At each step boundary the caller gets a `StepReport` and answers
with leases for the free slots, or None: then every row in flight is committed as its own
`InFlightState`, resumable in any batch on any worker (docs/design.md, sections 2 and 5b).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from roll_spotlight.checks import require_int
from roll_spotlight.dispatch.requests import InFlightState, Lease, Request, check_one_shape
from roll_spotlight.flow_grpo import RolloutHistory, RolloutSlots, RolloutState, SdeWindow, Trajectory, denoise, \
    noise_plan, sigma_schedule
from roll_spotlight.training.sampling import to_uint8_images
from roll_spotlight.worker.outputs import Committed, Finished, RolloutOutput, StepReport  # torch-free

BATCHED_ATOL = 1e-4
"""How far a batched row's latents and log-probs may be from the same request alone (a batched GEMM
sums in another order; docs/design.md 5b): what the tests and the trace harnesses check."""

Boundary = Callable[[StepReport], "Sequence[Lease] | None"]
"""The worker loop at a step boundary: leases for free slots (of the batch's shape), or None: stop."""


def by_shape(leases: Sequence[Lease]) -> list[list[Lease]]:
    """``leases`` in groups of one shape, each in the order given, groups in order of first lease."""
    groups: dict[tuple, list[Lease]] = {}
    for lease in leases:
        groups.setdefault(lease.request.batch_shape, []).append(lease)
    return list(groups.values())


def _copy(tensor: torch.Tensor) -> np.ndarray:
    """A host copy (a slot's buffer is refilled after its output left)."""
    return tensor.detach().to("cpu", copy=True).numpy()


def pack_state(state: RolloutState, request: Request) -> InFlightState:
    """The committed form of one partly done rollout (numpy, with its history for training)."""
    latent = {"latents": _copy(state.latents), "step": state.step}
    if state.history is not None:
        latent |= {"history_latents": _copy(state.history.latents),
                   "history_log_probs": _copy(state.history.log_probs),
                   "history_first_step": state.history.first_step}
    return InFlightState(request.request_id, state.step, latent, request.seed, request.weight_version)


def unpack_state(state: InFlightState) -> RolloutState:
    data = state.latent
    history = None
    if "history_latents" in data:
        history = RolloutHistory(torch.from_numpy(np.array(data["history_latents"])),
                                 torch.from_numpy(np.array(data["history_log_probs"])),
                                 int(data["history_first_step"]))
    return RolloutState(int(data["step"]), torch.from_numpy(np.array(data["latents"])), (state.seed,), history)


class RolloutEngine:
    """Denoises leases on one policy, up to ``max_batch`` at a time. Batches run in eval mode,
    whatever mode the trainer left a shared policy in (the mode moves the prompt encoder's last
    bits); prompts are encoded one at a time and cached per weight version."""

    def __init__(self, policy, *, max_batch: int = 1, commit_every: int = 0):
        require_int("sampling.max_batch", max_batch)  # the config's rule, for engines built in Python
        self.policy = policy.eval()
        self.max_batch, self.commit_every = max_batch, commit_every
        self._sigmas: dict[int, torch.Tensor] = {}
        self._cond_cache: dict[str, object] = {}

    def sigmas(self, num_steps: int) -> torch.Tensor:
        if num_steps not in self._sigmas:
            self._sigmas[num_steps] = sigma_schedule(num_steps, self.policy.image_seq_len)
        return self._sigmas[num_steps]

    def cond(self, prompt: str):
        if prompt not in self._cond_cache:
            with torch.no_grad():
                self._cond_cache[prompt] = self.policy.encode_prompts([prompt])
        return self._cond_cache[prompt]

    def invalidate(self) -> None:
        """Call after loading new weights: cached prompt encodings belong to the old ones."""
        self._cond_cache.clear()

    def denoise_batch(self, leases: Sequence[Lease], at_boundary: Boundary,
                      on_checkpoint: Callable[[InFlightState], None] | None = None, *,
                      decode: bool = True) -> list[tuple[Lease, Committed]]:
        """Denoise ``leases`` (one shape, at most ``max_batch``) and what ``at_boundary`` adds, until
        no row is left or it answers None; returns the rows then in flight, each committed.
        ``decode=False``: finished rows carry no output (an SP follower: its leader reports)."""
        if not 0 < len(leases) <= self.max_batch:
            raise ValueError(f"a batch takes 1 to sampling.max_batch={self.max_batch} leases, got {len(leases)}")
        shape = check_one_shape(leases)
        self.policy.eval()
        _, _, num_steps, noise_level, kind = shape
        slots = RolloutSlots(self.max_batch, self.sigmas(num_steps), self.policy.latent_shape,
                             noise_level=noise_level, kind=kind, device=self.policy.device)
        batch = _Batch(self, slots, shape)
        for lease in leases:
            batch.admit(lease)
        committed: list[tuple[Lease, Committed]] = []

        def between_steps(_: RolloutSlots) -> bool:
            refills = at_boundary(batch.report(decode))
            if refills is None:
                committed.extend(batch.commit_all())
                return False
            if on_checkpoint is not None and self.commit_every:
                batch.checkpoint(on_checkpoint, self.commit_every)
            for lease in refills:
                batch.admit(lease)
            return True

        denoise(slots, batch.velocity, between_steps)
        return committed


class _Batch:
    """The requests in a `RolloutSlots`: which lease holds which slot, and their conditioning."""

    def __init__(self, engine: RolloutEngine, slots: RolloutSlots, shape: tuple) -> None:
        self.engine, self.slots, self.shape = engine, slots, shape
        self.rows: dict[int, tuple[Lease, int]] = {}  # slot -> (lease, the step it started at)
        self._cond: tuple[tuple, object] | None = None

    def admit(self, lease: Lease) -> None:
        check_one_shape([lease], self.shape)
        free = self.slots.free
        assert free, "the worker loop offered more leases than the batch has free slots"
        state = unpack_state(lease.resume) if lease.resume is not None else None
        s = lease.request.schedule  # "ode": no step gets noise
        self.slots.admit(free[0], lease.request.seed, noise_plan(s.kind, SdeWindow(*s.window), s.num_steps), state)
        self.rows[free[0]] = (lease, state.step if state is not None else 0)

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
        return self.engine.policy.velocity(x, sigma, self._conditioning(slots))

    def _conditioning(self, slots: Sequence[int]):
        """The active rows' prompts as one batch, rebuilt only when the rows change."""
        key = tuple((s, self.rows[s][0].lease_id) for s in slots)
        if self._cond is None or self._cond[0] != key:
            from roll_spotlight.models.policy import Conditioning

            parts = [self.engine.cond(self.rows[s][0].request.prompt) for s in slots]
            self._cond = (key, parts[0] if len(parts) == 1 else Conditioning.cat(parts))
        return self._cond[1]

    def report(self, decode: bool) -> StepReport:
        """Take the finished rows out (their outputs, decoded together) and say where the others stand."""
        done = [s for s in self.rows if self.slots.finished(s)]
        images = to_uint8_images(self.engine.policy, self.slots.latents[done]) if decode and done else None
        finished = []
        for i, slot in enumerate(done):
            lease, start = self.rows.pop(slot)
            finished.append((lease, Finished(self._output(slot, lease.request, start, images[i]) if decode else None,
                                             self.slots.num_steps - start)))
            self.slots.evict(slot)
        running = {lease.request.request_id: self.slots.step[slot] for slot, (lease, _) in self.rows.items()}
        return StepReport(finished, running, len(self.slots.free))

    def checkpoint(self, on_checkpoint: Callable[[InFlightState], None], every: int) -> None:
        """Hand the queue the state of every row at a multiple of ``every`` steps (it goes on)."""
        for slot, (lease, _) in self.rows.items():
            if self.slots.step[slot] % every == 0:
                on_checkpoint(pack_state(self.slots.state(slot), lease.request))

    def _output(self, slot: int, request: Request, start: int, image: np.ndarray) -> RolloutOutput:
        s = self.slots
        return RolloutOutput(request.request_id, request.seed, _copy(s.history[slot]), _copy(s.log_probs[slot]),
                             _copy(s.noised[slot]), image, request.weight_version, start)

    def commit_all(self) -> list[tuple[Lease, Committed]]:
        """Every row in flight as its own in-flight state, at the step boundary just reached."""
        out = []
        for slot, (lease, start) in sorted(self.rows.items()):
            out.append((lease, Committed(pack_state(self.slots.state(slot), lease.request),
                                         self.slots.step[slot] - start)))
            self.slots.evict(slot)
        self.rows.clear()
        return out


def stack_outputs(outputs: list[RolloutOutput], sigmas: torch.Tensor, noise_level: float, kind: str) -> Trajectory:
    """Batch per-request outputs (already in request-id order) into one Trajectory for training."""
    from roll_spotlight.flow_grpo import StepKind

    latents = torch.from_numpy(np.stack([o.latents for o in outputs]))
    return Trajectory(seeds=tuple(o.seed for o in outputs), sigmas=sigmas, latents=latents,
                      log_probs=torch.from_numpy(np.stack([o.log_probs for o in outputs])),
                      noised=torch.from_numpy(outputs[0].noised.copy()), final=latents[:, -1],
                      next_step=latents.shape[1] - 1, kind=StepKind(kind), noise_level=noise_level, first_step=0)
