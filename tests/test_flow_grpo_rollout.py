"""rollout / recompute_log_probs: seeds, resume, batch composition, exact first PPO ratio."""

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import (
    RolloutSlots,
    RolloutState,
    SdeWindow,
    StepKind,
    denoise,
    initial_noise,
    noise_plan,
    recompute_log_probs,
    rollout,
    sde_step,
    sigma_schedule,
    step_noise,
)

LATENT = (4, 4, 4)
SEEDS = [101, 102, 103, 104]
NUM_STEPS = 6
A = 0.7


class TinyVelocity(torch.nn.Module):
    """A Linear over the flattened latent plus a sigma term.

    per_sample=True calls the Linear one sample at a time: CPU GEMMs are not batch-invariant (a
    batch of 1 takes a GEMV path whose rounding differs), and bit-identity across batch
    compositions needs a batch-invariant velocity.
    """

    def __init__(self, per_sample: bool = True):
        super().__init__()
        torch.manual_seed(0)
        dim = LATENT[0] * LATENT[1] * LATENT[2]
        self.linear = torch.nn.Linear(dim, dim)
        self.sigma_scale = torch.nn.Parameter(torch.linspace(-1, 1, dim))
        self.per_sample = per_sample

    def forward(self, latents: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        flat = latents.flatten(1)
        if self.per_sample:
            out = torch.cat([self.linear(flat[i : i + 1]) for i in range(flat.shape[0])])
        else:
            out = self.linear(flat)
        return (0.1 * out + sigma[:, None] * self.sigma_scale).view_as(latents)


@pytest.fixture(scope="module")
def model():
    return TinyVelocity()


@pytest.fixture(scope="module")
def sigmas():
    return sigma_schedule(NUM_STEPS, image_seq_len=64)


@pytest.fixture(scope="module")
def full(model, sigmas):
    return rollout(model, SEEDS, sigmas, LATENT, noise_level=A)


def _states(model, sigmas, seeds, k, window=None, **slot_kw):
    """The states of `seeds` stopped after step k (a stop at a step boundary), one per slot."""
    slots = RolloutSlots(len(seeds), sigmas, LATENT, noise_level=A, **slot_kw)
    for i, seed in enumerate(seeds):
        slots.admit(i, seed, noise_plan("sde", window, NUM_STEPS))
    if k:
        denoise(slots, lambda x, sigma, rows: model(x, sigma), lambda s: s.step[0] < k)
    return [slots.state(i) for i in range(len(seeds))]


def _resume(model, sigmas, states, window=None):
    """Resume `states` (one seed each) together in one batch, to the end."""
    slots = RolloutSlots(len(states), sigmas, LATENT, noise_level=A)
    for i, state in enumerate(states):
        slots.admit(i, state.seeds[0], noise_plan("sde", window, NUM_STEPS), state)
    denoise(slots, lambda x, sigma, rows: model(x, sigma))
    return slots.trajectory(range(len(states)))


def _assert_same(a, b):
    assert torch.equal(a.final, b.final)
    assert torch.equal(a.latents, b.latents)
    assert torch.equal(a.log_probs, b.log_probs)


def test_full_rollout_shapes_and_contents(full, sigmas):
    assert full.done and full.next_step == NUM_STEPS and full.first_step == 0
    assert full.latents.shape == (4, NUM_STEPS + 1, *LATENT) and full.log_probs.shape == (4, NUM_STEPS)
    assert torch.equal(full.latents[:, 0], initial_noise(SEEDS, LATENT))
    assert torch.equal(full.latents[:, -1], full.final)
    assert bool(full.noised.all()) and bool(torch.isfinite(full.log_probs).all())
    assert full.seeds == tuple(SEEDS) and torch.equal(full.sigmas, sigmas)


def test_rollout_log_probs_equal_the_step_formula(model, full, sigmas):
    k = 2
    x = full.latents[:, k]
    step = sde_step(model(x, sigmas[k].expand(4)), x, sigmas[k], sigmas[k + 1], noise_level=A,
                    noise=step_noise(SEEDS, k, LATENT))
    assert torch.equal(step.prev_sample, full.latents[:, k + 1])
    assert torch.equal(step.log_prob, full.log_probs[:, k])


def test_same_seeds_reproduce_bit_for_bit(model, sigmas, full):
    _assert_same(rollout(model, SEEDS, sigmas, LATENT, noise_level=A), full)
    other = rollout(model, [105, 102, 103, 104], sigmas, LATENT, noise_level=A)
    assert not torch.equal(other.final[0], full.final[0])
    assert torch.equal(other.final[1:], full.final[1:])


@pytest.mark.parametrize("k", [0, 1, 4, NUM_STEPS])
def test_resume_at_step_k_equals_uninterrupted(model, sigmas, full, k):
    states = _states(model, sigmas, SEEDS, k)
    assert [s.step for s in states] == [k] * 4 and states[0].history.log_probs.shape == (1, k)
    resumed = _resume(model, sigmas, states)
    assert resumed.done
    _assert_same(resumed, full)


def test_resume_in_a_different_batch_is_bit_identical(model, sigmas, full):
    part, stranger = _states(model, sigmas, SEEDS, 3), _states(model, sigmas, [7], 3)
    resumed = _resume(model, sigmas, [part[3], part[1], stranger[0]])
    _assert_same(resumed.select([0, 1]), full.select([3, 1]))
    alone = rollout(model, [7], sigmas, LATENT, noise_level=A)
    assert torch.equal(resumed.final[2:], alone.final)


def test_resume_without_history_marks_unseen_steps_nan(model, sigmas, full):
    part = [RolloutState(s.step, s.latents, s.seeds) for s in _states(model, sigmas, SEEDS, 2)]
    resumed = _resume(model, sigmas, part)
    assert resumed.first_step == 2 and torch.equal(resumed.final, full.final)
    assert bool(torch.isnan(resumed.latents[:, :2]).all()) and bool(torch.isnan(resumed.log_probs[:, :2]).all())
    assert torch.equal(resumed.latents[:, 2:], full.latents[:, 2:])
    with pytest.raises(ValueError, match="outside the steps"):
        recompute_log_probs(model, resumed, 1, noise_level=A)


def test_recomputed_log_probs_give_ratio_exactly_one_across_batch_splits(model, full):
    for split in ([0, 2], torch.tensor([3]), np.array([1, 0, 3])):
        part = full.select(split)
        for step in range(NUM_STEPS):
            res = recompute_log_probs(model, part, step, noise_level=A)
            ratio = torch.exp(res.log_prob - part.log_probs[:, step])
            assert torch.equal(ratio, torch.ones_like(ratio)), (split, step)


def test_recompute_with_batched_linear_same_batch_is_exact_and_differentiable(sigmas):
    batched = TinyVelocity(per_sample=False)
    traj = rollout(batched, SEEDS, sigmas, LATENT, noise_level=A, kind="cps")
    res = recompute_log_probs(batched, traj, 1, noise_level=A, kind="cps")
    assert torch.equal(res.log_prob, traj.log_probs[:, 1])
    assert res.log_prob.requires_grad
    res.log_prob.sum().backward()
    assert batched.linear.weight.grad is not None and batched.linear.weight.grad.abs().sum() > 0


def test_window_noises_only_its_steps(model, sigmas, full):
    window = SdeWindow(1, 3)
    traj = rollout(model, SEEDS, sigmas, LATENT, noise_level=A, window=window)
    assert traj.noised.tolist() == [False, True, True, False, False, False]
    assert bool((traj.log_probs[:, ~traj.noised] == 0).all())
    assert bool((traj.log_probs[:, traj.noised] != 0).all())
    x0 = traj.latents[:, 0]
    ode = x0 + model(x0, sigmas[0].expand(4)) * (sigmas[1] - sigmas[0])
    assert torch.equal(traj.latents[:, 1], ode)
    with pytest.raises(ValueError, match="ODE step"):
        recompute_log_probs(model, traj, 0, noise_level=A)


def test_ode_rollout_has_zero_log_probs_and_needs_no_noise_level(model, sigmas):
    traj = rollout(model, SEEDS, sigmas, LATENT, noise_level=0.0, kind="ode")
    assert not bool(traj.noised.any()) and bool((traj.log_probs == 0).all())


def test_keep_latents_false_keeps_final_only(model, sigmas, full):
    light = rollout(model, SEEDS, sigmas, LATENT, noise_level=A, keep_latents=False)
    assert light.latents is None and torch.equal(light.final, full.final)
    assert torch.equal(light.log_probs, full.log_probs)
    assert _states(model, sigmas, SEEDS, 2, keep_latents=False)[0].history is None
    with pytest.raises(ValueError, match="keep_latents"):
        recompute_log_probs(model, light, 0, noise_level=A)


def test_invalid_rollout_arguments_raise(model, sigmas, full):
    with pytest.raises(ValueError, match="'euler'"):
        rollout(model, SEEDS, sigmas, LATENT, noise_level=A, kind="euler")
    with pytest.raises(ValueError, match="noise_level"):
        rollout(model, SEEDS, sigmas, LATENT, noise_level=0.0)
    with pytest.raises(ValueError, match="decreasing"):
        rollout(model, SEEDS, sigmas.flip(0), LATENT, noise_level=A)
    with pytest.raises(ValueError, match="noise_level=0.5"):
        recompute_log_probs(model, full, 0, noise_level=0.5)
    with pytest.raises(ValueError, match="kind='cps'"):
        recompute_log_probs(model, full, 0, noise_level=A, kind=StepKind.CPS)


# ---- step-level batching: RolloutSlots and denoise


def _alone(model, sigmas, seed, window=None):
    return rollout(model, [seed], sigmas, LATENT, noise_level=A, window=window)


def _slots(sigmas, capacity):
    return RolloutSlots(capacity, sigmas, LATENT, noise_level=A)


def test_rows_at_different_steps_share_a_forward_and_equal_their_solo_rollouts(model, sigmas):
    """A resumed row (at step 3, its own window) and fresh rows in one batch; a finished row's slot
    is refilled at the next step boundary: every sample is bit for bit its solo rollout."""
    resumed = _states(model, sigmas, [7], 3, SdeWindow(2, 5))[0]
    slots, plan = _slots(sigmas, 2), noise_plan("sde", None, NUM_STEPS)
    slots.admit(0, 7, noise_plan("sde", SdeWindow(2, 5), NUM_STEPS), resumed)
    slots.admit(1, 101, plan)
    done, queue, calls = {}, [102], []

    def between_steps(s):
        calls.append(list(s.active))
        for slot in [i for i in range(s.capacity) if s.step[i] is not None and s.finished(i)]:
            done[s.seeds[slot]] = s.trajectory([slot])
            s.evict(slot)
            if queue:
                s.admit(slot, queue.pop(), plan)
        return True

    denoise(slots, lambda x, sigma, rows: model(x, sigma), between_steps)
    assert sorted(done) == [7, 101, 102] and len(calls) == 3 + NUM_STEPS  # slot 0 refilled after 3 steps
    _assert_same(done[101], _alone(model, sigmas, 101))
    _assert_same(done[102], _alone(model, sigmas, 102))
    solo7 = _resume(model, sigmas, [resumed], SdeWindow(2, 5))
    _assert_same(done[7], solo7)
    assert done[7].log_probs[0, 5] == 0 and done[7].log_probs[0, 4] != 0  # its own window


def test_a_stop_between_steps_commits_every_row_and_each_resumes_elsewhere(model, sigmas, full):
    slots = _slots(sigmas, 4)
    for i, seed in enumerate(SEEDS):
        slots.admit(i, seed, noise_plan("sde", None, NUM_STEPS))
    denoise(slots, lambda x, sigma, rows: model(x, sigma), lambda s: s.step[0] < 2)
    states = [slots.state(i) for i in range(4)]
    assert [s.step for s in states] == [2] * 4
    _assert_same(_resume(model, sigmas, [states[3], states[0]]), full.select([3, 0]))  # another batch and order


def test_batched_gemm_rows_stay_within_tolerance_of_solo(sigmas):
    """A batched Linear (not batch-invariant on CPU) moves a row's bits, not its trajectory."""
    batched = TinyVelocity(per_sample=False)
    together = rollout(batched, SEEDS, sigmas, LATENT, noise_level=A)
    for i, seed in enumerate(SEEDS):
        alone = rollout(batched, [seed], sigmas, LATENT, noise_level=A)
        torch.testing.assert_close(together.final[i:i + 1], alone.final, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(together.log_probs[i:i + 1], alone.log_probs, rtol=1e-5, atol=1e-5)


def test_slots_refuse_an_occupied_slot_and_a_foreign_state(model, sigmas, full):
    slots = _slots(sigmas, 1)
    slots.admit(0, 1, noise_plan("sde", None, NUM_STEPS))
    with pytest.raises(ValueError, match="occupied"):
        slots.admit(0, 2, noise_plan("sde", None, NUM_STEPS))
    slots.evict(0)
    with pytest.raises(ValueError, match="state.seeds"):
        slots.admit(0, 2, noise_plan("sde", None, NUM_STEPS), _states(model, sigmas, [1], 2)[0])
