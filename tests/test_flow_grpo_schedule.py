"""sigma_schedule / calculate_shift against diffusers' Qwen-Image scheduler setup."""

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import calculate_shift, sigma_schedule

QWEN_SCHEDULER = dict(
    use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192,
    shift=1.0, shift_terminal=0.02, time_shift_type="exponential",
)


def _diffusers_sigmas(num_steps: int, image_seq_len: int) -> torch.Tensor:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift as diffusers_shift

    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER)
    mu = diffusers_shift(image_seq_len, 256, 8192, 0.5, 0.9)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return scheduler.sigmas


@pytest.mark.parametrize("num_steps,image_seq_len", [(2, 256), (10, 1024), (28, 4096), (50, 6400), (16, 9000)])
def test_schedule_equals_diffusers_qwen_image(num_steps, image_seq_len):
    ours = sigma_schedule(num_steps, image_seq_len)
    theirs = _diffusers_sigmas(num_steps, image_seq_len)
    assert ours.dtype == torch.float32 and ours.shape == (num_steps + 1,)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert ours[0].item() == 1.0 and ours[-1].item() == 0.0
    assert ours[-2].item() == pytest.approx(0.02, abs=1e-7)


def test_calculate_shift_equals_diffusers_with_qwen_constants():
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift as diffusers_shift

    for seq_len in (256, 1024, 6400, 8192):
        assert calculate_shift(seq_len) == pytest.approx(diffusers_shift(seq_len, 256, 8192, 0.5, 0.9), abs=1e-12)
    assert calculate_shift(256) == pytest.approx(0.5) and calculate_shift(8192) == pytest.approx(0.9)


def test_static_shift_without_terminal_stretch():
    sigmas = sigma_schedule(4, 1024, use_dynamic_shifting=False, shift=3.0, shift_terminal=None)
    t = torch.tensor([1.0, 0.75, 0.5, 0.25], dtype=torch.float64)
    expected = torch.cat([3 * t / (1 + 2 * t), torch.zeros(1, dtype=torch.float64)]).float()
    torch.testing.assert_close(sigmas, expected, atol=1e-7, rtol=0)


def test_invalid_schedule_arguments_raise():
    with pytest.raises(ValueError, match="num_steps=1"):
        sigma_schedule(1, 1024)
    with pytest.raises(ValueError, match="time_shift_type='cubic'"):
        sigma_schedule(4, 1024, time_shift_type="cubic")
    with pytest.raises(ValueError, match="max_seq_len=256"):
        calculate_shift(300, base_seq_len=256, max_seq_len=256)
