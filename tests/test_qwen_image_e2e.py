"""Two Flow-GRPO iterations of each shipped Qwen-Image recipe on a tiny random Qwen-Image directory.

The recipes run as users run them (`spotlight train --config configs/qwen_image_*.yaml`), LoRA and
true CFG on as the preset ships them, with every local directory replaced by a tiny random model of
the same classes: the Qwen-Image pipeline (`spotlight make-tiny-qwen`), a CLIP for PickScore and
GenEval's colours, a Mask2Former for GenEval's detector. The OCR reward is rapidocr's, offline.
"""
from __future__ import annotations

import json

import pytest

from roll_spotlight.cli import main
from tests.reward_model_helpers import save_tiny_clip, save_tiny_mask2former
from tests.runtime_helpers import REPO

pytestmark = pytest.mark.slow

SMALL = ["model.device=cpu", "model.dtype=float32", "model.image_size=32", "model.gradient_checkpointing=false",
         "model.gpu_memory_gb=null", "model.max_sequence_length=32", "max_steps=2", "eval_steps=0",
         "save_steps=2", "rollout_batch_size=2", "train.group_size=2", "train.micro_batch_size=4",
         "task.val_prompts=2", "sampling.num_steps=4", "sampling.eval_num_steps=4", "sampling.sde_window=2",
         "sampling.window_range=[0,2]", "spot.enabled=false", "exploration.mode=off", "reward.world_size=1",
         "train.lora.rank=4", "train.lora.alpha=8"]
GENEVAL = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
           {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}], "prompt": "a photo of a red dog"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_models")
    assert main(["make-tiny-qwen", str(root / "qwen")]) == 0
    return {"qwen": root / "qwen", "clip": save_tiny_clip(root / "clip"),
            "detector": save_tiny_mask2former(root / "m2f")}


def _prompts(tmp_path, recipe: str):
    if recipe == "geneval_1280":
        for split in ("train", "test"):
            (tmp_path / f"{split}_metadata.jsonl").write_text("".join(json.dumps(m) + "\n" for m in GENEVAL))
        return []
    lines = ['a shop sign that reads "Open Late"', 'a poster with the words "Hello World"']
    for split in ("train", "test"):
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return []


@pytest.mark.parametrize("recipe, env, extra", [
    ("ocr_512", "OCR_PROMPTS_DIR", []),
    ("geneval_1280", "GENEVAL_PROMPTS_DIR", ["reward.kwargs.device=cpu"]),
    ("pickscore_512", "PICKSCORE_PROMPTS_DIR", ["reward.kwargs.device=cpu"]),
])
def test_recipe_trains_two_iterations_with_lora_and_cfg(models, tmp_path, monkeypatch, capsys, recipe, env, extra):
    monkeypatch.setenv("QWEN_IMAGE_DIR", str(models["qwen"]))
    monkeypatch.setenv(env, str(tmp_path))
    monkeypatch.setenv("GENEVAL_DETECTOR_DIR", str(models["detector"]))
    monkeypatch.setenv("CLIP_DIR", str(models["clip"]))
    monkeypatch.setenv("PICKSCORE_DIR", str(models["clip"]))
    monkeypatch.setenv("PICKSCORE_PROCESSOR_DIR", str(models["clip"]))
    _prompts(tmp_path, recipe)
    run_dir = tmp_path / "run"
    overrides = [x for o in [*SMALL, *extra] for x in ("-o", o)]
    config = str(REPO / "configs" / f"qwen_image_{recipe}.yaml")
    assert main(["train", "--config", config, "--check", *overrides]) == 0
    assert "memory plan" in capsys.readouterr().out
    assert main(["train", "--config", config, "--run-dir", str(run_dir), "--no-progress", "--threads", "1",
                 *overrides]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["weight_version"] == r["step"] for r in rows[1:])
    assert all(abs(r["ratio_mean"] - 1.0) < 1e-3 for r in rows[1:] if "ratio_mean" in r)
    ckpt = run_dir / "checkpoints" / "iter-000002"
    assert (ckpt / "lora" / "pytorch_lora_weights.safetensors").is_file(), "adapters in diffusers' format"


def test_a_memory_plan_that_does_not_fit_fails_at_start_up_naming_the_key(models, tmp_path, capsys):
    cfg = str(REPO / "configs" / "tiny_shapes.yaml")
    args = ["train", "--config", cfg, "--run-dir", str(tmp_path / "run"), "-o", "model.preset=qwen_image",
            "-o", f"model.path={models['qwen']}", "-o", "model.gpu_memory_gb=0.5", "-o", "model.image_size=32"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "model.gpu_memory_gb=0.5" in err and not (tmp_path / "run").exists()


def test_a_lora_target_that_does_not_exist_is_named(models, tmp_path, capsys):
    cfg = str(REPO / "configs" / "tiny_shapes.yaml")
    args = ["train", "--config", cfg, "--run-dir", str(tmp_path / "run"), "-o", "model.preset=qwen_image",
            "-o", f"model.path={models['qwen']}", "-o", "model.image_size=32", "-o", "train.lora.target_modules=[attn.nope]"]
    assert main(args) == 2
    assert "train.lora.target_modules" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.roll
def test_ocr_recipe_trains_two_iterations_under_roll(models, tmp_path, monkeypatch):
    """The ROLL twin of the OCR recipe on CPU-only ROLL clusters, LoRA and CFG on."""
    from roll_spotlight.roll import SpotlightPipeline
    from roll_spotlight.roll.spotlight_config import compose_mapping, from_mapping

    monkeypatch.chdir(tmp_path)  # ROLL writes ./output/logs relative to the working directory
    monkeypatch.setenv("QWEN_IMAGE_DIR", str(models["qwen"]))
    monkeypatch.setenv("OCR_PROMPTS_DIR", str(tmp_path))
    _prompts(tmp_path, "ocr_512")
    roles = [f"~{role}.device_mapping" for role in ("actor_train", "actor_infer")]  # CPU-only clusters
    overrides = [*roles, "++actor_train.world_size=1", "++actor_infer.world_size=1", "reward.world_size=1", "num_nodes=1", "num_gpus_per_node=0", f"output_dir={tmp_path}/out",
                 "spot.enabled=false", "exploration.mode=off", "dispatch.mode=static",
                 *[f"++{o}" if not o.startswith(("max_steps", "eval_steps", "save_steps", "rollout_batch_size"))
                   else o for o in SMALL if not o.startswith(("spot.", "exploration.", "reward."))]]
    cfg = from_mapping(compose_mapping(str(REPO / "configs" / "roll"), "qwen_image_ocr_512", overrides))
    run = cfg.to_run_config()
    assert run.train.lora is not None and run.sampling.guidance_scale == 4.0
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        pipeline = SpotlightPipeline(cfg)
        pipeline.run()
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in (pipeline.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
