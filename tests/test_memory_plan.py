"""The memory plan: exact parameter counts (closed formula = meta-device model), LoRA sizes as peft
makes them, how each row responds to the settings, and the fit check's error message."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from roll_spotlight.models.memory_plan import (
    FLOW_GRPO_LORA_TARGETS,
    QWEN_IMAGE_TRANSFORMER_CONFIG,
    ROLES,
    ROWS,
    check_memory_plan,
    count_parameters,
    count_parameters_meta,
    fit_errors,
    format_memory_plan,
    largest_batch,
    lora_parameters,
    memory_plan,
    transformer_config_from_dir,
)

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_transformer():
    from tests.qwen_helpers import tiny_qwen_components

    return tiny_qwen_components()["transformer"]


@pytest.fixture(scope="module")
def tiny_config(tiny_transformer) -> dict:
    return dict(tiny_transformer.config)


def test_embedded_config_is_diffusers_default():
    params = inspect.signature(diffusers.QwenImageTransformer2DModel.__init__).parameters
    defaults = {k: p.default for k, p in params.items() if k != "self"}
    assert set(defaults) == set(QWEN_IMAGE_TRANSFORMER_CONFIG)
    for key, value in QWEN_IMAGE_TRANSFORMER_CONFIG.items():
        assert (list(defaults[key]) if isinstance(value, list) else defaults[key]) == value, key


@pytest.mark.parametrize("name", ["tiny", "full", "full_additional_t_cond", "tiny_out_none"])
def test_closed_formula_equals_meta_device_count(name, tiny_config):
    config = {"tiny": tiny_config, "full": None,
              "full_additional_t_cond": {"use_additional_t_cond": True},
              "tiny_out_none": {**tiny_config, "out_channels": None, "num_layers": 3}}[name]
    assert count_parameters(config) == count_parameters_meta(config)


def test_tiny_count_equals_the_instantiated_model(tiny_transformer, tiny_config):
    assert count_parameters(tiny_config) == sum(p.numel() for p in tiny_transformer.parameters())


def test_lora_count_equals_peft(tiny_config):
    peft = pytest.importorskip("peft")
    model = diffusers.QwenImageTransformer2DModel(**{k: v for k, v in tiny_config.items() if not k.startswith("_")})
    model.add_adapter(peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(FLOW_GRPO_LORA_TARGETS)))
    added = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert lora_parameters(tiny_config, 4, FLOW_GRPO_LORA_TARGETS) == added
    subset = ("to_q", "img_mlp.net.2")
    model = diffusers.QwenImageTransformer2DModel(**{k: v for k, v in tiny_config.items() if not k.startswith("_")})
    model.add_adapter(peft.LoraConfig(r=2, target_modules=list(subset)))
    assert lora_parameters(tiny_config, 2, subset) == sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("rank, targets, match", [(0, FLOW_GRPO_LORA_TARGETS, "train.lora.rank"),
                                                  (8, ("attn.to_qkv",), "train.lora.target_modules"),
                                                  (8, (), "train.lora.target_modules")])
def test_bad_lora_settings_name_the_key(rank, targets, match):
    with pytest.raises(ValueError, match=match):
        lora_parameters(None, rank, targets)


def test_trainer_rows_follow_bytes_per_parameter():
    lora = memory_plan(None)
    n = lora.trainable_params
    assert lora.bytes["trainer"]["trainable parameters"] == 4 * n      # fp32 adapters
    assert lora.bytes["trainer"]["optimizer states"] == 8 * n          # AdamW m, v; no master copy
    assert lora.bytes["trainer"]["base weights"] == 2 * lora.transformer_params
    full = memory_plan(None, lora_rank=None)
    rows = full.bytes["trainer"]
    per_param = (rows["trainable parameters"] + rows["gradients"] + rows["optimizer states"]) / full.transformer_params
    assert per_param == 16 and rows["base weights"] == 0
    bf16_lora = memory_plan(None, lora_dtype="bfloat16")
    assert bf16_lora.bytes["trainer"]["optimizer states"] == 12 * n    # m, v and an fp32 master
    sharded = memory_plan(None, lora_rank=None, fsdp_shards=8)
    assert sharded.bytes["trainer"]["optimizer states"] == rows["optimizer states"] / 8


def test_activations_respond_to_resolution_cfg_checkpointing_and_sp():
    small, large = memory_plan(None, height=512, width=512), memory_plan(None, height=1280, width=1280)
    assert (small.image_tokens, large.image_tokens) == (1024, 6400)
    assert large.bytes["trainer"]["activations"] > small.bytes["trainer"]["activations"]
    assert small.bytes["trainer"]["CFG negative branch"] == small.bytes["trainer"]["activations"]
    assert memory_plan(None, cfg=False).bytes["trainer"]["CFG negative branch"] == 0
    no_ckpt = memory_plan(None, gradient_checkpointing=False)
    assert no_ckpt.bytes["trainer"]["activations"] > 10 * small.bytes["trainer"]["activations"]
    batched = memory_plan(None, cfg_batched=True, vae_base_dim=1)  # VAE term small: transformer working set shows
    assert batched.bytes["rollout"]["CFG negative branch"] == batched.bytes["rollout"]["activations"]
    decoded = memory_plan(None, cfg_batched=True)   # at 512 the VAE decode is the peak: the negative rows fit under it
    assert decoded.bytes["rollout"]["CFG negative branch"] == 0
    sp = memory_plan(None, height=1280, width=1280, sp_degree=4, vae_base_dim=1)
    one = memory_plan(None, height=1280, width=1280, vae_base_dim=1)
    assert sp.bytes["rollout"]["activations"] < one.bytes["rollout"]["activations"] / 2
    assert memory_plan(None, micro_batch=2).bytes["trainer"]["activations"] == 2 * small.bytes["trainer"]["activations"]
    on_gpu = memory_plan(None, text_encoder_on_gpu=True)
    assert on_gpu.bytes["rollout"]["base weights"] - small.bytes["rollout"]["base weights"] == 2 * 8_292_166_656


def test_fit_check_names_the_key_and_what_would_fit():
    full = memory_plan(None, height=1280, width=1280, lora_rank=None, gpu_memory_gb=80)
    assert full.fits("trainer") is False and full.fits("rollout") is True
    with pytest.raises(ValueError, match=r"trainer needs .* > model\.gpu_memory_gb=80; would fit with LoRA"):
        check_memory_plan(full)
    tight = memory_plan(None, height=1280, width=1280, rollout_batch=32, gpu_memory_gb=80)
    (message,) = [e for e in fit_errors(tight) if "rollout" in e]
    most = largest_batch(tight)
    assert "model.gpu_memory_gb=80" in message and f"would fit with sampling.max_batch={most} (" in message
    both = memory_plan(None, height=1280, width=1280, rollout_batch=32, explore_batch=32, gpu_memory_gb=80)
    assert len(fit_errors(both)) == 1    # the explorer planned as the rollout worker: one error, one line
    tiny_gpu = memory_plan(None, gpu_memory_gb=1)
    assert all("nothing tried fits" in e or "nothing to try" in e for e in fit_errors(tiny_gpu))
    ok = memory_plan(None, height=1280, width=1280, gpu_memory_gb=141)
    assert check_memory_plan(ok) is ok and all(ok.fits(r) for r in ROLES)


@pytest.mark.parametrize("resolution, sp_degree", [(512, 1), (1280, 4), (1280, 1)])
def test_the_largest_batch_is_the_last_that_fits(resolution, sp_degree):
    plan = memory_plan(None, height=resolution, width=resolution, sp_degree=sp_degree, cfg_batched=True,
                       gpu_memory_gb=80)
    most = largest_batch(plan)
    assert most >= 1
    at = {b: memory_plan(None, height=resolution, width=resolution, sp_degree=sp_degree, cfg_batched=True,
                         rollout_batch=b).total_gib("rollout") for b in (1, 2, most, most + 1)}
    assert at[most] <= 80 < at[most + 1] and at[1] < at[2]      # activations grow with the batch
    assert largest_batch(plan, gpu_memory_gb=141) > most
    assert largest_batch(plan, gpu_memory_gb=30) == 0           # the 38 GiB of weights alone do not fit


def test_the_recipes_batches_fit_80_gb():
    """configs/qwen_image_* set sampling.max_batch 16 at 512 (SP 1) and 4 at 1280 (SP 4 or 1)."""
    for resolution, sp_degree, batch in ((512, 1, 16), (1280, 4, 4), (1280, 1, 4)):
        plan = memory_plan(None, height=resolution, width=resolution, sp_degree=sp_degree, cfg_batched=True,
                           rollout_batch=batch, explore_batch=batch, micro_batch=4, gpu_memory_gb=80)
        assert plan.fits("rollout") and plan.fits("explorer") and largest_batch(plan) >= batch


def test_format_is_a_markdown_table_with_every_row_and_role():
    text = format_memory_plan(memory_plan(None, gpu_memory_gb=80))
    lines = text.splitlines()
    assert lines[2] == "| item | trainer | rollout | explorer |"
    for row in ROWS:
        assert any(line.startswith(f"| {row} |") for line in lines), row
    assert lines[-1].startswith("| fits 80 GiB | yes")


def test_config_from_a_pipeline_directory(tmp_path, tiny_config):
    import json

    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(tiny_config))
    assert transformer_config_from_dir(tmp_path)["num_layers"] == tiny_config["num_layers"]
    with pytest.raises(FileNotFoundError):
        transformer_config_from_dir(tmp_path / "missing")


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="model.gpu_memory_gb"):
        memory_plan(None, gpu_memory_gb=0)
    with pytest.raises(ValueError, match="model.image_size"):
        memory_plan(None, height=500, width=500)
    with pytest.raises(ValueError, match="model.image_size must be a multiple of 4"):
        memory_plan(None, height=30, width=30, vae_scale_factor=2)
    with pytest.raises(ValueError, match="sp_degree=5 must divide num_attention_heads=24"):
        memory_plan(None, sp_degree=5)


def test_module_imports_no_torch():
    code = ("import sys, roll_spotlight.models.memory_plan as m; m.count_parameters(); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_command_line_prints_tables_and_fit_errors(tmp_path, tiny_config, capsys):
    import json

    from roll_spotlight.models.memory_plan import main

    (tmp_path / "config.json").write_text(json.dumps(tiny_config))
    assert main(["--config", str(tmp_path), "--resolution", "64", "--gpu-memory-gb", "1", "--text-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "Memory plan: 64x64, 16 image + 8 text tokens" in out
    assert "model.gpu_memory_gb=1" in out  # the 2 GiB runtime overhead alone does not fit 1 GiB
    assert "largest rollout batch (sampling.max_batch) that fits 1 GiB at SP 1: 0" in out
    assert main(["--resolution", "512", "--rollout-batch", "16"]) == 0
    out = capsys.readouterr().out
    assert "rollout batch 16, CFG on (batched)" in out and "largest rollout batch (sampling.max_batch) that fits 80 GiB at SP 1: 99" in out


def test_pixel_space_tiny_dit_has_no_vae():
    tiny = {"patch_size": 2, "in_channels": 12, "out_channels": 3, "num_layers": 2, "attention_head_dim": 32,
            "num_attention_heads": 4, "joint_attention_dim": 64, "axes_dims_rope": [8, 12, 12]}
    plan = memory_plan(tiny, height=32, width=32, vae_scale_factor=1, vae_params=0, text_tokens=16, lora_rank=None)
    assert plan.image_tokens == 16 * 16
    assert plan.bytes["rollout"]["base weights"] == 2 * count_parameters(tiny)
    working = (16 * 16 + 16) * 10 * 128 * 2  # tokens x INFER_ELEMS_PER_TOKEN x d x bf16: no VAE decode term
    assert plan.bytes["rollout"]["activations"] == working
