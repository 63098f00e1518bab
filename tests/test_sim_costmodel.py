"""Tier 1: the cost model's constants carry sources, and derived times follow the formulas."""
import pytest

from roll_spotlight.sim.costmodel import CONSTANTS, PUBLISHED_CALIBRATION, CostModel, forward_time_s
from roll_spotlight.sim.gpus import GPUS


def test_every_constant_names_a_source():
    for name, constant in CONSTANTS.items():
        assert constant.source.strip(), name
        assert constant.unit.strip(), name
        assert constant.value > 0, name
    assumptions = [n for n, c in CONSTANTS.items() if c.source.startswith("assumption")]
    assert "sp_overhead_per_rank" in assumptions and "params_b" not in assumptions
    # fitted or calibrated on published runs, cited by repository and commit
    assert CONSTANTS["train_mfu"].source.startswith("calibrated") and "verl-omni@" in CONSTANTS["train_mfu"].source
    for name in ("rollout_mfu", "rollout_floor_s"):
        assert CONSTANTS[name].source.startswith("fitted") and "verl-omni@" in CONSTANTS[name].source, name
    assert "sglang" in CONSTANTS["batch_knee_p"].source


def test_tokens_and_flops_follow_the_published_architecture():
    cost = CostModel()
    assert cost.image_tokens(512) == 1024
    assert cost.image_tokens(1280) == 6400
    tokens = 1024 + cost.text_tokens
    per_token = 60 * 12 * 3072 ** 2        # one stream's QKV + out + MLP in each of the 60 blocks
    expected = 2 * per_token * (tokens + 1) + 4 * 60 * tokens ** 2 * 3072   # + the modulation, once per image
    assert cost.forward_flops(512) == pytest.approx(expected)
    # a token passes one of the two streams, so about a third of 2 x 20B parameters x tokens
    assert 0.3 < cost.forward_flops(512) / (2 * 20e9 * tokens) < 0.4
    # attention grows quadratically: the 1280 forward costs more than its token ratio
    token_ratio = (6400 + cost.text_tokens) / (1024 + cost.text_tokens)
    assert cost.forward_flops(1280) / cost.forward_flops(512) > token_ratio


def test_sp_degree_divides_time_with_an_efficiency_below_one():
    cost = CostModel()
    one, four = cost.step_s(1280, 1), cost.step_s(1280, 4)
    assert one / 4 < four < one / 2      # 1280^2 on one GPU is past the knee: SP divides the work
    assert cost.step_s(1280, 4, cross_node=True) > four
    assert cost.rollout_s(512) == pytest.approx(cost.sampling_steps * cost.step_s(512, 1))
    assert cost.rollout_s(512, batch=4, serial=False) == pytest.approx(cost.sampling_steps * cost.step_s(512, batch=4))
    # the step is one forward of batch x CFG rows; serial: CFG forwards of one row each
    def forward_s(rows):
        return forward_time_s(rows * cost.forward_flops(512), cost.rollout_floor_s, 989e12 * cost.rollout_mfu,
                              cost.batch_knee_p)

    assert cost.step_s(512, batch=3) == pytest.approx(forward_s(6))
    assert cost.step_s(512, serial=True) == pytest.approx(2 * forward_s(1))
    with pytest.raises(AssertionError):
        cost.step_s(512, batch=2, serial=True)


def test_train_time_is_three_forwards_per_trained_step():
    cost = CostModel()
    per_image = cost.trained_steps * cost.cfg_forwards * 3.0 * cost.forward_flops(512)
    expected = 512 * per_image / (8 * 989e12 * cost.train_mfu)
    assert cost.train_s(512, 512, 8) == pytest.approx(expected)
    assert cost.train_s(512, 512, 16) == pytest.approx(expected / 2)


def test_cold_restart_is_process_start_nccl_and_a_40gb_load():
    cost = CostModel()
    assert cost.model_bytes() == pytest.approx(40e9)
    assert cost.cold_restart_s() == pytest.approx(cost.process_start_s + cost.nccl_init_s + 40e9 / 1e9)
    assert cost.warm_regroup_s < 1.0 < cost.cold_restart_s()
    assert cost.warm_join_s(peer_on_node=True) < cost.warm_join_s(peer_on_node=False) < cost.cold_join_s()
    assert cost.notice_s("aws") == 120.0 and cost.notice_s("gcp") == 30.0
    with pytest.raises(ValueError, match="unknown provider"):
        cost.notice_s("ibm")


def test_overrides_and_calibration_record_their_source():
    cost = CostModel.from_dict({"group_size": 8, "reward": "geneval"})
    assert cost.group_size == 8 and isinstance(cost.group_size, int)
    assert cost.sources["group_size"] == "override"
    assert cost.reward_s() == cost.reward_s_geneval
    measured = cost.calibrate({"warm_regroup_s": 0.04, "cold_restart_s": 95.0}, note="bench 1")
    assert measured.warm_regroup_s == 0.04
    assert measured.cold_restart_s() == pytest.approx(95.0)
    assert measured.sources["warm_regroup_s"] == "measured: bench 1"
    assert CostModel().warm_regroup_s == 0.5  # the default is untouched
    small = cost.calibrate({"cold_restart_s": 3.0})
    assert small.cold_restart_s() == pytest.approx(3.0, rel=1e-3)


@pytest.mark.parametrize("bad, match", [({"no_such_key": 1}, "unknown cost-model key"),
                                        ({"group_size": "8"}, "expected a number"),
                                        ({"train_mfu": 0}, "must be > 0"),
                                        ({"reward": "clip"}, "reward must be")])
def test_bad_overrides_name_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        CostModel.from_dict(bad)


def test_table_lists_every_constant():
    rows = CostModel().table()
    assert [r["name"] for r in rows] == list(CONSTANTS)
    assert all(r["source"] for r in rows)


# ---- calibration from a benchmarks/gpu_check.py JSON ----------------------------------------------
def _gpu_check_json(tmp_path, times: dict, tiny: bool = False, text_tokens: int = 128):
    """A file in gpu_check's schema with chosen medians: {resolution: (guided_step_s, micro_step_s)}."""
    import json

    data = {"schema": "roll_spotlight.gpu_check/1", "kind": "measured", "device": {"name": "NVIDIA H200"},
            "config": {"tiny": tiny, "text_tokens": text_tokens},
            "resolutions": {str(r): {"guided_step": {"median_s": g, "peak_gib": 50.0},
                                     "train_micro_step": {"median_s": t, "peak_gib": 60.0}}
                            for r, (g, t) in times.items()}}
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(data))
    return path


def test_calibration_reproduces_the_measured_step_times(tmp_path):
    from roll_spotlight.sim.costmodel import load_calibration

    path = _gpu_check_json(tmp_path, {512: (0.35, 1.4), 1280: (1.9, 7.5)})
    assert CostModel().calibration == PUBLISHED_CALIBRATION
    for resolution, (guided, micro) in ((512, (0.35, 1.4)), (1280, (1.9, 7.5))):
        cost = CostModel().with_calibration(path, resolution)
        assert cost.calibration == str(path)
        assert cost.sources["rollout_mfu"].startswith(f"measured: {path}")
        assert cost.step_s(resolution, serial=True) == pytest.approx(guided)   # gpu_check's guided step is serial
        assert cost.train_s(1, resolution, 1) == pytest.approx(cost.trained_steps * micro)
        assert load_calibration(path, resolution) == {"rollout_mfu": cost.rollout_mfu, "train_mfu": cost.train_mfu,
                                                      "rollout_floor_s": cost.rollout_floor_s}
        assert cost.batch_knee_p == CONSTANTS["batch_knee_p"].value           # the curve's shape is kept
        assert cost.sources["warm_regroup_s"] == CONSTANTS["warm_regroup_s"].source  # only the GPU times move
    # an unmeasured resolution takes the closest measured one; none asked: the largest
    assert load_calibration(path, 1024) == load_calibration(path, 1280) == load_calibration(path)


def test_a_batch_sweep_gives_the_floor_and_the_saturated_mfu(tmp_path):
    import json


    truth = {"rollout_floor_s": 0.05, "rollout_mfu": 0.5}
    model = CostModel().with_overrides(truth)
    flops, rate = model.forward_flops(512), 989e12 * 0.5
    path = _gpu_check_json(tmp_path, {512: (model.step_s(512, serial=True), 1.4)})
    data = json.loads(path.read_text())
    data["resolutions"]["512"]["batch_sweep"] = {
        str(b): {"median_s": float(forward_time_s(2 * b * flops, 0.05, rate, model.batch_knee_p)), "oom": False}
        for b in (1, 2, 4, 8)} | {"16": {"oom": True}}
    path.write_text(json.dumps(data))
    cost = CostModel().with_calibration(path, 512)
    assert cost.rollout_floor_s == pytest.approx(0.05, rel=1e-6) and cost.rollout_mfu == pytest.approx(0.5, rel=1e-6)
    assert cost.step_s(512, batch=8) == pytest.approx(model.step_s(512, batch=8), rel=1e-6)
    assert "batch sweep" in cost.sources["rollout_mfu"] and "no batch sweep" not in cost.sources["rollout_mfu"]
    # a sweep that admits no floor (its batch faster per row than one row's floor allows) is not used
    data["resolutions"]["512"]["batch_sweep"] = {"8": {"median_s": 1e-4, "oom": False}}
    path.write_text(json.dumps(data))
    stretched = CostModel().with_calibration(path, 512)
    assert stretched.step_s(512, serial=True) == pytest.approx(model.step_s(512, serial=True))
    assert "no batch sweep" in stretched.sources["rollout_mfu"]


def test_calibration_uses_the_measurement_s_text_tokens(tmp_path):
    from roll_spotlight.sim.costmodel import load_calibration

    short = load_calibration(_gpu_check_json(tmp_path, {512: (0.35, 1.4)}, text_tokens=32))
    default = load_calibration(_gpu_check_json(tmp_path, {512: (0.35, 1.4)}))
    assert short["rollout_mfu"] < default["rollout_mfu"]  # fewer FLOPs in the same time


@pytest.mark.parametrize("change, match", [({"tiny": True}, "written with --tiny"),
                                           ({"schema": "other"}, "schema must be"),
                                           ({"times": {512: (1e-4, 1.0)}}, "not the cost model's transformer"),
                                           ({"times": {}}, "no resolutions measured")])
def test_bad_calibration_files_are_refused(tmp_path, change, match):
    import json

    path = _gpu_check_json(tmp_path, change.get("times", {512: (0.35, 1.4)}), tiny=change.get("tiny", False))
    if "schema" in change:
        data = json.loads(path.read_text())
        data["schema"] = change["schema"]
        path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        CostModel().with_calibration(path, 512)


def test_a_tiny_file_loads_when_allowed(tmp_path):
    path = _gpu_check_json(tmp_path, {32: (0.03, 0.1)}, tiny=True)
    cost = CostModel().with_calibration(path, 512, allow_tiny=True)
    assert "tiny model" in cost.sources["train_mfu"] and cost.calibration == str(path)


def test_spot_training_constants_follow_the_memory_plan_and_flow_grpo():
    cost = CostModel()
    assert cost.adapter_bytes() == pytest.approx(1.70e9)           # memory plan: 424,673,280 fp32 parameters
    assert 424_673_280 * 4 == pytest.approx(cost.adapter_bytes(), rel=0.01)
    assert cost.train_micro_batch_images == 4 and cost.train_micro_batches(512) == 128 * 2
    # a weight version is the adapters: 1.70 GB over 12.5 GB/s, not the 40 GB transformer
    assert cost.publish_s() == pytest.approx(1.70 / 12.5) and cost.publish_s() < cost.weight_copy_network_s() / 20
    assert cost.gradient_report_s(True) == pytest.approx(1.70 / 12.5)
    assert cost.gradient_report_s(False) == pytest.approx(1.70 / cost.nvlink_copy_gb_s)
    assert cost.gradient_report_s(True, 4) == pytest.approx(1.70 / 12.5 + 1.70 / cost.nvlink_copy_gb_s)
    for name in ("train_lease_micro_batches", "optimizer_step_s"):
        assert CONSTANTS[name].source.startswith("assumption"), name
    assert "memory_plan" in CONSTANTS["lora_adapter_gb"].source


@pytest.mark.parametrize("resolution", [512, 1280])
def test_micro_batches_add_up_to_the_update_on_one_gpu(resolution):
    cost = CostModel()
    images = cost.images_per_iteration()
    total = cost.train_micro_batches(images) * cost.train_micro_batch_s(resolution)
    assert total == pytest.approx(cost.train_s(images, resolution, 1))


# ---- GPU types ------------------------------------------------------------------------------------
def test_every_gpu_names_its_datasheet():
    assert {"h100", "h800", "h200", "a100"} <= set(GPUS)
    for name, spec in GPUS.items():
        assert "datasheet" in spec.source, name
        assert spec.peak_bf16_tflops > 0 and spec.memory_gib > 0 and spec.nvlink_gb_s > 0, name
    assert GPUS["h200"].memory_gib > GPUS["h100"].memory_gib
    assert GPUS["h800"].nvlink_gb_s < GPUS["h100"].nvlink_gb_s


def test_a_gpu_swaps_its_peak_and_link_and_keeps_the_calibrated_mfus():
    h100 = CostModel()
    assert h100.gpu == "h100" and h100.gpu_peak_tflops == GPUS["h100"].peak_bf16_tflops
    a100, h800 = h100.with_gpu("A100"), h100.with_gpu("h800")
    assert a100.gpu == "a100" and a100.rollout_mfu == h100.rollout_mfu and a100.train_mfu == h100.train_mfu
    assert a100.step_s(1280) / h100.step_s(1280) == pytest.approx(989.0 / 312.0, rel=0.01)   # past the knee
    assert a100.rollout_floor_s == h100.rollout_floor_s   # below it, the floor is the same (assumption)
    assert a100.train_micro_batch_s(512) / h100.train_micro_batch_s(512) == pytest.approx(989.0 / 312.0)
    assert h800.step_s(512) == pytest.approx(h100.step_s(512))            # same compute
    assert h800.nvlink_s(1e9) / h100.nvlink_s(1e9) == pytest.approx(900.0 / 400.0)
    assert h800.with_gpu("h100").nvlink_copy_gb_s == pytest.approx(h100.nvlink_copy_gb_s)
    assert "H800" in h800.sources["gpu_peak_tflops"] and "H800" in h800.sources["nvlink_copy_gb_s"]


@pytest.mark.parametrize("bad", ["h900", "", "v100"])
def test_an_unknown_gpu_lists_the_known_ones(bad):
    with pytest.raises(ValueError, match=r"unknown GPU .*known GPUs: \['a100', 'h100', 'h200', 'h800'\]"):
        CostModel().with_gpu(bad)
    with pytest.raises(ValueError, match="unknown GPU"):
        CostModel(gpu=bad)


def test_transfers_take_their_bytes_over_their_link():
    cost = CostModel()
    assert cost.network_s(12.5e9) == pytest.approx(1.0)
    assert cost.nvlink_s(cost.nvlink_copy_gb_s * 1e9) == pytest.approx(1.0)
    assert cost.storage_s(cost.model_bytes()) == pytest.approx(cost.weight_load_storage_s())
    assert cost.gradient_report_s(True, 1, nbytes=1e9) == pytest.approx(cost.network_s(1e9))
    assert cost.gradient_report_s(True, 4, nbytes=1e9) == pytest.approx(cost.network_s(1e9) + cost.nvlink_s(1e9))
    assert cost.train_micro_batch_s(512, 8) == pytest.approx(2 * cost.train_micro_batch_s(512, 4))


def test_the_rollout_batch_is_the_recipes():
    from pathlib import Path

    from roll_spotlight.config.strict import load_yaml

    configs = Path(__file__).resolve().parents[1] / "configs"
    recipes = sorted(configs.glob("qwen_image_*.yaml")) + sorted((configs / "roll").glob("qwen_image_*.yaml"))
    assert len(recipes) == 9
    cost = CostModel()
    for path in recipes:
        data = load_yaml(path)
        resolution = data["model"]["image_size"]
        assert data["sampling"]["max_batch"] == cost.max_batch(resolution), path
