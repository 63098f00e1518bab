"""Execute one leased request: a seeded rollout at batch size 1, resumable at any step.

Each request is rolled out alone (batch size 1). On CPU, matmul results differ in the last bits
with the batch size, so batching requests that happen to be pulled together would make outputs
depend on scheduling; at batch 1 a trajectory is a pure function of (weights, prompt, seed,
schedule) on every worker, which is what makes resume-after-preemption bit-identical and two runs
of the same config bit-identical. For the tiny model batch 1 costs little (a B=2 forward takes
about 2.5x a B=1 forward on these cores).

    lease --> [resume state?] --> step, step, ... --(stop requested)--> Committed(InFlightState)
                                              \\--(all steps done)----> Finished(RolloutOutput)
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from roll_spotlight.dispatch.requests import InFlightState, Lease, Request
from roll_spotlight.flow_grpo import RolloutHistory, RolloutState, SdeWindow, Trajectory, rollout, sigma_schedule
from roll_spotlight.worker.outputs import Committed, Finished, RolloutOutput  # torch-free


def window_of(request: Request) -> SdeWindow:
    return SdeWindow(*request.schedule.window)


def pack_state(traj: Trajectory, request: Request) -> InFlightState:
    """The committed form of a partly done rollout (numpy, with its history for training)."""
    state = traj.state(with_history=True)
    latent = {"latents": state.latents.numpy(), "step": state.step}
    if state.history is not None:
        latent |= {"history_latents": state.history.latents.numpy(),
                   "history_log_probs": state.history.log_probs.numpy(),
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


class RolloutExecutor:
    """Runs leases on one policy. `should_stop` is polled between denoising steps.

    Every lease runs in eval mode, whatever mode the trainer left a shared policy in: under
    `no_grad` torch's `TransformerEncoderLayer` takes a fused fast path in eval mode only, and its
    output differs from the train-mode path in the last bits (measured: 2.4e-7 on the tiny prompt
    encoder). Without this an in-process run rolled out in train mode after its first update but
    in eval mode after a resume, so resumed training metrics drifted by ~1e-5 relative.
    """

    def __init__(self, policy, *, commit_every: int = 0):
        self.policy = policy.eval()
        self.commit_every = commit_every
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

    def run(self, lease: Lease, should_stop: Callable[[], bool] = lambda: False,
            on_checkpoint: Callable[[InFlightState], None] | None = None, *,
            decode: bool = True) -> Committed | Finished:
        """Run `lease` to the end, or until `should_stop()` says so after a step. ``decode=False``:
        a finished rollout's output is None (an SP follower: its leader returns the result)."""
        request = lease.request
        self.policy.eval()  # see `RolloutExecutor`: the mode changes the prompt encoder's numerics
        state = unpack_state(lease.resume) if lease.resume is not None else None
        start = state.step if state is not None else 0
        traj = None
        while traj is None or not traj.done:
            traj = self._advance(request, state if traj is None else traj.state(), 1)
            steps_run = traj.next_step - start
            if not traj.done and should_stop():
                return Committed(pack_state(traj, request), steps_run)
            if on_checkpoint and self.commit_every and not traj.done and traj.next_step % self.commit_every == 0:
                on_checkpoint(pack_state(traj, request))
        return Finished(self._output(request, traj, start) if decode else None, traj.next_step - start)

    def _advance(self, request: Request, state, n: int) -> Trajectory:
        cond = self.cond(request.prompt)
        s = request.schedule
        return rollout(lambda x, sig: self.policy.velocity(x, sig, cond), [request.seed], self.sigmas(s.num_steps),
                       self.policy.latent_shape, noise_level=s.noise_level, kind=s.kind if s.kind != "ode" else "sde",
                       window=window_of(request) if s.kind != "ode" else SdeWindow(0, 0), state=state, stop_after=n)

    def _output(self, request: Request, traj: Trajectory, start: int) -> RolloutOutput:
        with torch.no_grad():
            image = self.policy.decode(traj.final).clamp(0, 1)
        image = (image[0].permute(1, 2, 0).float().numpy() * 255.0).round().astype(np.uint8)
        return RolloutOutput(request.request_id, request.seed, traj.latents[0].numpy(), traj.log_probs[0].numpy(),
                             traj.noised.numpy(), image, request.weight_version, start)


def stack_outputs(outputs: list[RolloutOutput], sigmas: torch.Tensor, noise_level: float, kind: str) -> Trajectory:
    """Batch per-request outputs (already in request-id order) into one Trajectory for training."""
    from roll_spotlight.flow_grpo import StepKind

    latents = torch.from_numpy(np.stack([o.latents for o in outputs]))
    return Trajectory(seeds=tuple(o.seed for o in outputs), sigmas=sigmas, latents=latents,
                      log_probs=torch.from_numpy(np.stack([o.log_probs for o in outputs])),
                      noised=torch.from_numpy(outputs[0].noised.copy()), final=latents[:, -1],
                      next_step=latents.shape[1] - 1, kind=StepKind(kind), noise_level=noise_level, first_step=0)
