"""The Qwen-Image recipes start where flow_grpo's users start: its released Qwen-Image config.

`FLOW_GRPO` holds the values themselves, read from yifan123/flow_grpo `config/grpo.py`,
`pickscore_qwenimage()` (commits 31c71b9 and 54809b5 agree), over the defaults of its
`config/base.py`, and the LoRA of its Qwen-Image training script. Every Qwen-Image recipe, standalone
and ROLL, must equal them key by key, except the keys `DIFFERS` lists for a recipe, whose YAML line
must carry a comment saying why.

Not a key, so not pinned here: flow_grpo takes two optimiser steps per epoch (gradient accumulation
over half the samples each); our trainer takes one per iteration over all of them.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from roll_spotlight.config.run import RunConfig
from roll_spotlight.config.strict import load_config, load_yaml
from roll_spotlight.roll.sections import recipe_key, validate_recipe

ROOT = Path(__file__).resolve().parents[1]
STANDALONE = sorted((ROOT / "configs").glob("qwen_image_*.yaml"))
ROLL = sorted((ROOT / "configs" / "roll").glob("qwen_image_*.yaml"))

# yifan123/flow_grpo config/grpo.py pickscore_qwenimage (and config/base.py where it sets nothing)
FLOW_GRPO = {
    "seed": 42,
    "resolution": 512,
    "eval_freq": 30,
    "save_freq": 30,
    "prompts_per_epoch": 32,             # gpu_number 32 x sample.train_batch_size 4 x num_batches_per_epoch 4 / 16
    "mixed_precision": "bf16",
    "activation_checkpointing": True,
    "lora": (64, 128),                   # scripts/train_qwenimage.py: LoraConfig(r=64, lora_alpha=128)
    "sample.num_steps": 10,
    "sample.eval_num_steps": 50,
    "sample.guidance_scale": 4.0,        # also the evaluation's true_cfg_scale
    "sample.noise_level": 1.2,
    "sample.sde_window_size": 2,
    "sample.sde_window_range": (0, 5),   # (0, num_steps // 2): windows lie inside steps 0..4
    "sample.num_image_per_prompt": 16,
    "sample.global_std": True,
    "train.batch_size": 4,
    "train.learning_rate": 3e-4,         # base.py
    "train.adam_weight_decay": 1e-4,     # base.py
    "train.clip_range": 1e-4,            # base.py
    "train.adv_clip_max": 5.0,           # base.py
    "train.max_grad_norm": 1.0,          # base.py
    "train.num_inner_epochs": 1,
    "train.beta": 0.0,                   # no KL term: no reference model
    "train.ema": False,
}
# The test sets flow_grpo evaluates in full (the sizes its configs' test_batch_size comments give)
TEST_SET = {"ocr": 1018, "pickscore": 2048, "geneval": 2212}
# recipe stem prefix -> {flow_grpo key: (our value, our key whose YAML line says why)}
DIFFERS = {
    "qwen_image_geneval_1280": {"resolution": (1280, "model.image_size"),
                                "train.batch_size": (1, "train.micro_batch_size")},
}


def as_flow_grpo(cfg: RunConfig) -> dict:
    """Our run config in flow_grpo's keys and units."""
    s, t, m = cfg.sampling, cfg.train, cfg.model
    lo, hi = s.window_range  # ours bounds the window's first step; flow_grpo's range holds the window
    return {
        "seed": cfg.seed, "resolution": m.image_size, "eval_freq": cfg.eval_steps, "save_freq": cfg.save_steps,
        "prompts_per_epoch": cfg.rollout_batch_size, "mixed_precision": {"bfloat16": "bf16"}.get(m.dtype, m.dtype),
        "activation_checkpointing": m.gradient_checkpointing, "lora": (t.lora.rank, t.lora.alpha),
        "sample.num_steps": s.num_steps, "sample.eval_num_steps": s.eval_num_steps,
        "sample.guidance_scale": s.guidance_scale, "sample.noise_level": s.noise_level,
        "sample.sde_window_size": s.sde_window, "sample.sde_window_range": (lo, hi + s.sde_window),
        "sample.num_image_per_prompt": t.group_size, "sample.global_std": t.std_mode == "global",
        "train.batch_size": t.micro_batch_size, "train.learning_rate": t.learning_rate,
        "train.adam_weight_decay": t.weight_decay, "train.clip_range": t.clip_range,
        "train.adv_clip_max": t.adv_clip, "train.max_grad_norm": t.max_grad_norm,
        "train.num_inner_epochs": t.inner_epochs, "train.beta": t.kl_beta, "train.ema": t.ema_decay > 0,
    }


def _load(path: Path) -> RunConfig:
    if path.parent.name == "roll":
        return validate_recipe(load_yaml(path), source=str(path))[1]
    return load_config(RunConfig, path)


def _differs(path: Path) -> dict:
    return next((d for prefix, d in DIFFERS.items() if path.stem.startswith(prefix)), {})


@pytest.mark.parametrize("path", STANDALONE + ROLL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_equals_flow_grpo_key_by_key(path):
    cfg = _load(path)
    assert cfg.sampling.kind == "sde" and cfg.model.preset == "qwen_image"
    expected = FLOW_GRPO | {key: value for key, (value, _) in _differs(path).items()}
    ours = as_flow_grpo(cfg)
    assert {k: ours[k] for k in expected if ours[k] != expected[k]} == {}
    task = next(name for name in TEST_SET if name in path.stem)
    assert cfg.task.val_prompts == TEST_SET[task]


@pytest.mark.parametrize("path", STANDALONE + ROLL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_value_that_differs_from_flow_grpo_says_why_on_its_line(path):
    lines = path.read_text().splitlines()
    for flow_key, (value, key) in _differs(path).items():
        name = recipe_key(key) if path.parent.name == "roll" else key
        section, leaf = name.rsplit(".", 1)
        start = lines.index(f"{section}:")
        line = next(x for x in lines[start + 1:] if x.strip().startswith(f"{leaf}:"))
        assert f"{leaf}: {value}" in line and "#" in line and "flow_grpo" in line, (flow_key, line)


def test_window_range_means_what_flow_grpo_samples():
    """flow_grpo starts a window at random.randint(a, b - size); ours at an integer in
    [lo, hi]: the recipes' [0, 3] with 2 steps gives exactly flow_grpo's windows of (0, 5)."""
    from roll_spotlight.config.run import SamplingConfig
    from roll_spotlight.training.sampling import choose_window

    cfg = SamplingConfig(num_steps=10, noise_level=1.2, sde_window=2, window_range=(0, 3))
    ours = {choose_window(cfg, seed=42, iteration=i) for i in range(400)}
    a, b, size = 0, 5, 2
    assert ours == {(start, start + size) for start in range(a, b - size + 1)}


def test_cost_model_uses_the_same_flow_grpo_values():
    from roll_spotlight.sim.costmodel import CONSTANTS, SOURCE_FLOW_GRPO

    assert "pickscore_qwenimage" in SOURCE_FLOW_GRPO
    value = {name: CONSTANTS[name].value for name in CONSTANTS}
    assert value["sampling_steps"] == FLOW_GRPO["sample.num_steps"]
    assert value["group_size"] == FLOW_GRPO["sample.num_image_per_prompt"]
    assert value["prompts_per_iteration"] == FLOW_GRPO["prompts_per_epoch"]
    assert value["trained_steps"] == FLOW_GRPO["sample.sde_window_size"]
    assert value["noise_level"] == FLOW_GRPO["sample.noise_level"]
    assert value["cfg_forwards"] == (2 if FLOW_GRPO["sample.guidance_scale"] > 1 else 1)
