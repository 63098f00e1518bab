"""Tier 1: the cost model is calibrated on a published GPU step time, and the simulator reproduces it."""
import pytest

from roll_spotlight.sim.costmodel import CONSTANTS, CostModel
from benchmarks.sim_reference import (TOLERANCE, VERL_OMNI_LORA, calibrate_train_mfu, reference_model,
                                      simulated_step_s)


def test_the_simulated_vanilla_is_within_15_percent_of_the_published_step():
    row = simulated_step_s()
    assert row["kind"] == "simulated" and row["published_s"] == 420.0 and TOLERANCE == 0.15
    assert row["within_tolerance"] and abs(row["simulated_s"] / 420.0 - 1.0) <= 0.15
    assert "verl-omni@" in row["source"] and "run_qwen_image_ocr_lora.sh" in row["source"]
    phases = row["phases_s"]
    assert sum(phases.values()) == pytest.approx(row["simulated_s"])
    assert phases["reward"] == pytest.approx(60.0)       # 420 s sync - 360 s with the reward on a 5th GPU
    assert phases["rollout"] == pytest.approx(226.4, rel=2e-3)   # serial generation, as verl-omni measured it
    assert phases["train"] > 0


def test_the_table_s_train_mfu_is_the_one_the_published_run_implies():
    assert CONSTANTS["train_mfu"].value == pytest.approx(calibrate_train_mfu(), abs=1e-3)


def test_the_calibration_moves_the_simulated_step_onto_the_published_one():
    """A model off by 2x in train MFU is put back on the published step time by its own calibration."""
    slow = CostModel().with_overrides({"train_mfu": 0.1})
    assert simulated_step_s(cost=reference_model(base=slow))["simulated_s"] > 1.3 * 420.0
    fixed = reference_model(base=slow.with_overrides({"train_mfu": calibrate_train_mfu(base=slow)}))
    assert simulated_step_s(cost=fixed)["simulated_s"] == pytest.approx(420.0, rel=1e-3)


def test_the_reference_model_is_the_script_s_shape():
    model = reference_model()
    w = VERL_OMNI_LORA.workload
    assert (w.resolution, w.num_steps, w.cfg_forwards, w.trained_steps) == (512, 10, 2, 2)
    assert (w.prompts_per_iteration, w.group_size, w.micro_batch_images) == (32, 16, 16)
    assert model.gpu == "h800" and VERL_OMNI_LORA.gpus == 4
    assert model.images_per_iteration() == 512
    assert model.train_flops_multiplier == CostModel().train_flops_multiplier + 1   # the old-log-prob forward
    assert model.reward_workers == 1 and model.reward_s() * 512 == pytest.approx(60.0)
