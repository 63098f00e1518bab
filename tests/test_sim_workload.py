"""Tier 1: a run's shape into the cost model, and the durations an emulated worker waits."""
import pytest

from roll_spotlight.sim.costmodel import CostModel
from roll_spotlight.sim.workload import Workload, cfg_forwards


def _workload(**changes) -> Workload:
    return Workload(**{**vars(Workload.of(CostModel(), 512)), **changes})


def test_the_default_workload_is_the_cost_model_s_own():
    w = Workload.of(CostModel(), 1280)
    assert (w.resolution, w.num_steps, w.cfg_forwards, w.trained_steps, w.group_size) == (1280, 10, 2, 2, 16)
    assert w.cost_model().values == CostModel().values


def test_durations_follow_the_cost_model_for_the_workload_s_shape():
    d = _workload(num_steps=20, micro_batch_images=2, text_tokens=64).durations("h800")
    cost = d.cost
    assert cost.gpu == "h800" and cost.sampling_steps == 20 == cost.explore_steps and cost.text_tokens == 64
    assert d.denoise_step_s(1) == pytest.approx(cost.step_s(512, 1))
    assert d.denoise_step_s(1, batch=8) == pytest.approx(cost.step_s(512, 1, batch=8))
    assert d.denoise_step_s(serial=True) == pytest.approx(cost.step_s(512, serial=True))
    # a 512^2 image is below the knee: SP 4 barely shortens its step, batching fills the group
    assert d.denoise_step_s(1) / 4 < d.denoise_step_s(4) < d.denoise_step_s(1)
    assert d.denoise_step_s(4, batch=16) / 16 < d.denoise_step_s(4) / 2
    assert d.train_micro_batch_s() == pytest.approx(cost.train_micro_batch_s(512, 2))
    assert d.train_micro_batch_s(6) == pytest.approx(3 * d.train_micro_batch_s())
    assert d.reward_s(8) == pytest.approx(8 * cost.reward_s())
    assert d.weight_load_s() == pytest.approx(40e9 / (cost.storage_gb_s * 1e9))
    assert d.publish_s(1.7e9) == pytest.approx(1.7e9 / (cost.network_gb_s * 1e9))
    assert d.peer_copy_s(40e9) == pytest.approx(cost.weight_copy_nvlink_s())
    assert d.gradient_report_s(1.7e9, over_network=True, degree=2) == pytest.approx(
        d.publish_s(1.7e9) + d.peer_copy_s(1.7e9))
    assert d.optimizer_step_s() == cost.optimizer_step_s


def test_cfg_and_resolution_scale_the_denoising_step():
    guided, plain = _workload().durations(), _workload(cfg_forwards=1).durations()
    assert guided.denoise_step_s(serial=True) == pytest.approx(2 * plain.denoise_step_s())
    assert guided.denoise_step_s() == pytest.approx(plain.denoise_step_s(batch=2))  # both branches, one forward
    assert cfg_forwards(4.0) == 2 and cfg_forwards(1.0) == 1 and cfg_forwards(None) == 1
    big = _workload(resolution=1280).durations()
    # past the knee, attention grows quadratically
    assert big.denoise_step_s(batch=16) > (6400 / 1024) * guided.denoise_step_s(batch=16)


@pytest.mark.parametrize("change, match", [({"num_steps": 0}, "Workload.num_steps must be a number > 0"),
                                           ({"group_size": 2.5}, "Workload.group_size must be an integer"),
                                           ({"cfg_forwards": 3}, "Workload.cfg_forwards must be 1 or 2"),
                                           ({"trained_steps": 11, "num_steps": 10}, "exceeds num_steps"),
                                           ({"resolution": True}, "Workload.resolution")])
def test_a_bad_workload_names_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        _workload(**change)


def test_an_unknown_gpu_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="known GPUs"):
        _workload().durations("tpu")
