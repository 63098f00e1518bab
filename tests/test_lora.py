"""LoRA on the DiT policy: config validation, adapters-only training and weight versions, the KL
reference as the same module with adapters disabled, and diffusers-loadable checkpoints."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from roll_spotlight.flow_grpo import sigma_schedule
from roll_spotlight.models import LoraConfig, ModelConfig, TinyShapesDiT
from roll_spotlight.models.lora import (
    QWEN_IMAGE_TARGET_MODULES,
    adapter_parameter_count,
    is_lora_key,
    weight_version_bytes,
)
from roll_spotlight.training.grpo import FlowGRPOTrainer, GRPOConfig, ScoredBatch
from roll_spotlight.training.sampling import RolloutSpec, generate

VOCAB = ["a", "one", "two", "red", "blue", "green", "circle", "circles", "square", "and"]
PROMPTS = ["two red circles", "a blue square"]


def tiny(seed: int = 0, **overrides) -> TinyShapesDiT:
    torch.manual_seed(seed)
    return TinyShapesDiT(ModelConfig(**({"num_layers": 1, "image_size": 16} | overrides)), VOCAB)


def with_lora(policy: TinyShapesDiT, cfg: LoraConfig | None = None, perturb: float = 0.0) -> TinyShapesDiT:
    policy.enable_lora(cfg or LoraConfig.for_preset("tiny"))
    if perturb:
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.copy_(perturb * torch.randn(p.shape, generator=gen))
    return policy


def inputs(policy, batch: int = 2, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *policy.latent_shape, generator=gen), torch.rand(batch, generator=gen) * 0.9 + 0.05


def velocity(policy, prompts=PROMPTS):
    latents, sigma = inputs(policy, len(prompts))
    with torch.no_grad():
        return policy.velocity(latents, sigma, policy.encode_prompts(prompts))


# ---------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, key", [
    ({"rank": 0}, "train.lora.rank"),
    ({"rank": -4}, "train.lora.rank"),
    ({"rank": 2.5}, "train.lora.rank"),
    ({"alpha": 0}, "train.lora.alpha"),
    ({"dropout": 1.0}, "train.lora.dropout"),
    ({"init": "pissa"}, "train.lora.init"),
    ({"target_modules": []}, "train.lora.target_modules"),
])
def test_lora_config_validation_names_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        LoraConfig(**kwargs)


def test_qwen_image_defaults_are_flow_grpos_and_targets_exist():
    """flow_grpo's Qwen-Image recipe: r=64, alpha=128, gaussian init, attention and MLPs of both streams."""
    cfg = LoraConfig.for_preset("qwen_image")
    assert (cfg.rank, cfg.alpha, cfg.init, cfg.dropout) == (64, 128.0, "gaussian", 0.0)
    assert cfg.target_modules == QWEN_IMAGE_TARGET_MODULES and len(set(cfg.target_modules)) == 12
    policy = tiny()
    # every default target matches in every block of the same transformer class
    assert adapter_parameter_count(policy.transformer, cfg) > 0
    assert LoraConfig(target_modules="attn.to_q").target_modules == ("attn.to_q",)


@pytest.mark.parametrize("target, why", [("attn.to_qq", "matches no module"), ("attn", "non-Linear")])
def test_unknown_or_non_linear_target_names_the_key_and_what_fits(target, why):
    policy = tiny()
    with pytest.raises(ValueError, match=rf"train\.lora\.target_modules.*{why}.*attn\.to_q.*img_mlp\.net\.2"):
        policy.enable_lora(LoraConfig(rank=4, alpha=4, target_modules=(target,)))
    assert policy.lora is None and all(p.requires_grad for p in policy.parameters())


# ---------------------------------------------------------------- training only the adapters


def frozen(policy: TinyShapesDiT) -> TinyShapesDiT:
    """The base as a KL reference sees it: nothing requires grad (torch's encoder layers take another
    kernel then, ~1e-7 away, so the comparisons below freeze both sides)."""
    return policy.requires_grad_(False)


def test_only_adapters_train_and_start_as_the_base():
    base = tiny()
    before = velocity(frozen(base))
    policy = with_lora(base)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(is_lora_key(n) for n in trainable)
    assert not any(p.requires_grad for p in policy.prompt_encoder.parameters())
    assert torch.equal(velocity(policy), before)  # B = 0 at init: the adapted model is the base
    latents, sigma = inputs(policy)
    policy.velocity(latents, sigma, policy.encode_prompts(PROMPTS)).pow(2).mean().backward()
    grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
    # the last block's text-stream outputs feed nothing, so not every adapter gets a gradient; with
    # B = 0 only the B matrices of the image stream get a nonzero one at first
    assert grads and set(grads) <= set(trainable)
    for layer in ("attn.to_q", "attn.to_v", "img_mlp.net.2"):
        assert grads[f"transformer.transformer_blocks.0.{layer}.lora_B.default.weight"].abs().sum() > 0
    with pytest.raises(ValueError, match="already has LoRA"):
        policy.enable_lora(LoraConfig.for_preset("tiny"))


def test_adapters_disabled_is_the_base_and_restores_flags():
    base_velocity = velocity(frozen(tiny()))
    policy = with_lora(tiny(), perturb=0.2)
    adapted = velocity(policy)
    assert (adapted - base_velocity).abs().max() > 1e-3
    flags = {n: p.requires_grad for n, p in policy.named_parameters()}
    with policy.adapters_disabled() as reference:
        assert reference is policy and torch.equal(velocity(policy), base_velocity)
    assert torch.equal(velocity(policy), adapted)
    assert flags == {n: p.requires_grad for n, p in policy.named_parameters()}
    with pytest.raises(ValueError, match="no LoRA adapters"):
        with tiny().adapters_disabled():
            pass


def test_bf16_policy_keeps_float32_adapters():
    """Adapters of a bf16 model stay float32 (trainable master weights; what `weight_version_bytes` assumes)."""
    policy = with_lora(tiny(dtype="bfloat16"), perturb=0.1)
    assert {p.dtype for p in policy.trainable_parameters()} == {torch.float32}
    assert policy.transformer.img_in.weight.dtype == torch.bfloat16
    v = velocity(policy)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()


# ---------------------------------------------------------------- weight versions


def test_weight_version_is_the_adapters_and_loads_into_a_lora_worker():
    trainer_side = with_lora(tiny(), perturb=0.2)
    state = trainer_side.published_state()
    assert state and all(k.startswith("transformer.") and is_lora_key(k) for k in state)
    lora_numel = sum(v.numel() for v in state.values())
    assert lora_numel == sum(p.numel() for p in trainer_side.trainable_parameters())
    assert lora_numel < sum(v.numel() for v in tiny().published_state().values()) / 10
    worker = with_lora(tiny())  # same frozen base, fresh adapters
    worker.load_published_state(state)
    assert torch.equal(velocity(worker), velocity(trainer_side))
    with pytest.raises(KeyError, match="enable_lora"):
        tiny().load_published_state(state)
    with pytest.raises(KeyError, match="missing keys"):
        worker.load_published_state(dict(list(state.items())[1:]))


def test_weight_version_bytes_match_the_built_policies():
    """The config-only count equals what a built policy publishes, without and with LoRA."""
    policy = tiny()
    config = dict(policy.transformer.config)
    full = sum(v.numel() * v.element_size() for v in policy.transformer.state_dict().values())
    assert weight_version_bytes(config, None, dtype="float32") == full
    lora = LoraConfig.for_preset("tiny")
    published = with_lora(policy, lora).published_state()
    assert weight_version_bytes(config, lora) == sum(v.numel() * v.element_size() for v in published.values())
    assert weight_version_bytes(config, None, dtype="bfloat16") == full // 2


# ---------------------------------------------------------------- the KL reference without a copy


def _batch(policy, steps: int = 3):
    spec = RolloutSpec(num_steps=steps, noise_level=0.7, kind="sde", window=None)
    prompts = [p for p in PROMPTS for _ in range(2)]
    traj = generate(policy, prompts, [1, 2, 3, 4], spec)
    return ScoredBatch(traj, prompts, np.repeat([0, 1], 2), np.array([0.0, 1.0, 0.5, 2.0]), 0.7, "sde")


def test_trainer_kl_reference_is_the_policy_with_adapters_disabled():
    policy = with_lora(tiny(), perturb=0.2)
    batch = _batch(policy)
    with torch.no_grad():  # move the adapters after the rollout, so the KL term is not zero
        for p in policy.trainable_parameters():
            p.add_(0.05)
    cfg = GRPOConfig(group_size=2, kl_beta=5.0, micro_batch_size=4, clip_range=0.2)
    trainer = FlowGRPOTrainer(policy, cfg)
    assert trainer.reference is None  # no second copy of the transformer
    by_context = trainer.gradient(batch)
    copied = FlowGRPOTrainer(policy, cfg)
    copied.reference = frozen(tiny()).eval()  # the old path: a separate module holding the base weights
    by_copy = copied.gradient(batch)
    no_kl = FlowGRPOTrainer(policy, GRPOConfig(group_size=2, micro_batch_size=4, clip_range=0.2)).gradient(batch)
    assert by_context.keys() == by_copy.keys() and all(is_lora_key(n) for n in by_context)
    for name in by_context:
        torch.testing.assert_close(by_context[name], by_copy[name], rtol=0, atol=0)
    assert max((by_context[n] - no_kl[n]).abs().max() for n in no_kl) > 1e-4  # the KL term counts


# ---------------------------------------------------------------- diffusers checkpoints


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from roll_spotlight.models import make_tiny_qwen

    return make_tiny_qwen(tmp_path_factory.mktemp("qwen_lora"))


def _qwen_lora_policy(qwen_dir, perturb: float):
    from roll_spotlight.models import QwenImagePolicy

    policy = QwenImagePolicy.from_pretrained(qwen_dir, image_size=32)
    return with_lora(policy, LoraConfig(rank=4, alpha=8.0), perturb=perturb)


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_saved_adapter_loads_into_a_diffusers_pipeline_and_samples_the_same(qwen_dir, tmp_path, guidance):
    from diffusers import QwenImagePipeline

    policy = _qwen_lora_policy(qwen_dir, perturb=0.3)
    policy.set_guidance(guidance, " ")
    prompts, steps = ["a cat", "a dog on the moon"], 4
    ours = generate(policy, prompts, [5, 6], RolloutSpec(steps, 0.7, "ode", None))
    with policy.adapters_disabled():
        base = generate(policy, prompts, [5, 6], RolloutSpec(steps, 0.7, "ode", None))
    assert (ours.final - base.final).abs().max() > 1e-2  # the adapters matter

    pipe = QwenImagePipeline.from_pretrained(qwen_dir)
    pipe.load_lora_weights(str(policy.save_lora(tmp_path / "lora")))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=prompts, negative_prompt=" ", true_cfg_scale=guidance, height=32, width=32,
               num_inference_steps=steps, latents=ours.latents[:, 0].clone(), output_type="latent").images
    torch.testing.assert_close(pipe.scheduler.sigmas, sigma_schedule(steps, policy.image_seq_len), rtol=0, atol=1e-6)
    assert (out - ours.final).abs().max() < 1e-5


def test_saved_adapter_round_trips_into_a_policy(qwen_dir, tmp_path):
    policy = _qwen_lora_policy(qwen_dir, perturb=0.3)
    other = _qwen_lora_policy(qwen_dir, perturb=0.0)
    other.load_lora(policy.save_lora(tmp_path / "lora"))
    expected, got = policy.published_state(), other.published_state()
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    with pytest.raises(ValueError, match="enable_lora"):
        copy.deepcopy(tiny()).load_lora(tmp_path / "lora")
