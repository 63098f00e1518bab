"""Tests for roll_spotlight.models: the tiny pixel-space DiT and the real Qwen-Image loading path."""

from __future__ import annotations

import pytest
import torch

from roll_spotlight.models import (
    Conditioning,
    ModelConfig,
    TinyShapesDiT,
    WordTokenizer,
    build_policy,
    load_tiny_policy,
    save_policy,
)
from roll_spotlight.models.packing import pack_2x2, unpack_2x2
from tests.qwen_helpers import TEXT_DIM, save_tiny_qwen

VOCAB = ["a", "one", "two", "three", "red", "blue", "green", "circle", "circles", "square", "squares", "and"]
PROMPTS = ["two red circles", "A blue square, and one green circle."]


def make_tiny(seed: int = 0, **overrides) -> TinyShapesDiT:
    torch.manual_seed(seed)
    return TinyShapesDiT(ModelConfig(**overrides), VOCAB)


def images(batch: int = 2, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def noisy_inputs(policy, batch: int = 2, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *policy.latent_shape, generator=gen), torch.rand(batch, generator=gen)


@pytest.fixture(scope="module")
def tiny() -> TinyShapesDiT:
    return make_tiny()


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"preset": "sdxl"}, "model.preset"),
        ({"dtype": "float16"}, "model.dtype"),
        ({"axes_dims_rope": (8, 8, 8)}, "model.axes_dims_rope"),
        ({"image_size": 33}, "model.image_size"),
        ({"preset": "qwen_image", "path": "x", "image_size": 40}, "model.image_size"),
        ({"preset": "qwen_image"}, "model.path"),
        ({"num_layers": 0}, "model.num_layers"),
        ({"max_prompt_tokens": 1}, "model.max_prompt_tokens"),
        ({"joint_attention_dim": 66}, "model.joint_attention_dim"),
        ({"max_sequence_length": 2048}, "model.max_sequence_length"),
        ({"prediction": "epsilon"}, "model.prediction"),
        ({"preset": "qwen_image", "path": "x", "prediction": "sample"}, "model.prediction"),
        ({"patch_size": 3}, "model.patch_size"),
        ({"patch_size": 0}, "model.patch_size"),
        ({"patch_size": 4, "image_size": 34}, "model.image_size"),
        ({"preset": "qwen_image", "path": "x", "patch_size": 4}, "model.patch_size"),
    ],
)
def test_config_validation_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ModelConfig(**overrides)


def test_config_defaults_are_valid_and_tuple_normalised():
    cfg = ModelConfig(axes_dims_rope=[8, 12, 12])
    assert cfg.axes_dims_rope == (8, 12, 12) and cfg.preset == "tiny" and cfg.dtype == "float32"


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_lowercases_splits_punctuation_and_pads():
    tok = WordTokenizer(VOCAB, max_tokens=8)
    ids, mask = tok(["Two RED circles.", "red,blue"])
    assert ids.shape == mask.shape == (2, 8) and ids.dtype == mask.dtype == torch.long
    assert ids[0, :4].tolist() == [1, 2 + VOCAB.index("two"), 2 + VOCAB.index("red"), 2 + VOCAB.index("circles")]
    assert mask.sum(1).tolist() == [4, 3]
    assert (ids[mask == 0] == 0).all()


def test_tokenizer_unknown_word_names_word_and_prompt():
    tok = WordTokenizer(VOCAB, max_tokens=8)
    with pytest.raises(ValueError, match=r"'purple'.*'two purple circles'"):
        tok(["two red circles", "two purple circles"])


def test_tokenizer_rejects_too_long_prompt_and_bad_vocab():
    with pytest.raises(ValueError, match="max_tokens=3"):
        WordTokenizer(VOCAB, max_tokens=3)(["two red circles"])
    with pytest.raises(ValueError, match="vocab"):
        WordTokenizer(["red", "red"], max_tokens=4)
    with pytest.raises(ValueError, match="vocab"):
        WordTokenizer(["red circle"], max_tokens=4)


# ---------------------------------------------------------------- packing and conditioning


def test_packing_matches_qwen_image_pipeline_layout():
    from diffusers import QwenImagePipeline

    grid = torch.randn(2, 4, 8, 6)
    packed = pack_2x2(grid)
    ref = QwenImagePipeline._pack_latents(grid[:, None], 2, 4, 8, 6)
    assert torch.equal(packed, ref)
    # the pipeline unpacks with the VAE scale factor; 8x8 pixels per latent cell gives the 8x6 grid
    ref_unpacked = QwenImagePipeline._unpack_latents(packed, 8 * 8, 6 * 8, 8)[:, :, 0]
    assert torch.equal(unpack_2x2(packed, 8, 6), grid) and torch.equal(ref_unpacked, grid)


def test_conditioning_index_repeat_and_cat():
    cond = Conditioning(torch.arange(12.0).view(2, 3, 2), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    rep = cond.repeat_interleave(3)
    assert rep.embeds.shape == (6, 3, 2) and torch.equal(rep.mask[3], cond.mask[1])
    assert torch.equal(rep.index([0, 5]).embeds, cond.embeds)
    assert cond.index(1).embeds.shape == (1, 3, 2)
    short = Conditioning(torch.ones(1, 1, 2), torch.ones(1, 1, dtype=torch.long))
    both = Conditioning.cat([short, cond])
    assert both.embeds.shape == (3, 3, 2) and both.mask[0].tolist() == [1, 0, 0]
    with pytest.raises(ValueError, match="mask"):
        Conditioning(torch.ones(2, 3, 2), torch.ones(2, 4, dtype=torch.long))


# ---------------------------------------------------------------- tiny policy


def test_tiny_shapes_dtypes_and_size(tiny):
    assert tiny.latent_shape == (256, 12) and tiny.image_seq_len == 256
    n_params = sum(p.numel() for p in tiny.parameters())
    assert 1_000_000 <= n_params <= 3_000_000
    cond = tiny.encode_prompts(PROMPTS)
    assert cond.embeds.shape == (2, 16, 64) and cond.mask.dtype == torch.long
    assert cond.mask.sum(1).tolist() == [4, 8]
    latents, sigma = noisy_inputs(tiny)
    with torch.no_grad():
        v = tiny.velocity(latents, sigma, cond)
    assert v.shape == latents.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    out = tiny.decode(latents * 3)
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.float32
    assert out.min() >= 0.0 and out.max() <= 1.0


def test_tiny_encode_decode_round_trip(tiny):
    img = images()
    latents = tiny.encode_images(img)
    assert latents.shape == (2, 256, 12) and latents.min() >= -1.0 and latents.max() <= 1.0
    assert torch.allclose(tiny.decode(latents), img, atol=1e-6)
    with pytest.raises(ValueError, match="encode_images"):
        tiny.encode_images(images(size=16))


@pytest.mark.parametrize("patch", [2, 4, 8])
def test_a_token_is_one_patch_of_patch_size_pixels(patch):
    """`model.patch_size` p: (32/p)^2 tokens of 3 p^2 channels, each holding exactly one p x p patch."""
    policy = make_tiny(patch_size=patch, num_layers=1)
    n = (32 // patch) ** 2
    assert policy.latent_shape == (n, 3 * patch * patch) and policy.image_seq_len == n
    img = images()
    assert torch.allclose(policy.decode(policy.encode_images(img)), img, atol=1e-6)
    lit = torch.zeros(1, 3, 32, 32)
    lit[0, :, patch:2 * patch, 3 * patch:4 * patch] = 1.0  # the patch at row 1, column 3
    tokens = (policy.encode_images(lit)[0] > 0).any(-1).nonzero().flatten().tolist()
    assert tokens == [32 // patch + 3] and int((policy.encode_images(lit)[0] > 0).sum()) == 3 * patch * patch
    latents, sigma = noisy_inputs(policy)
    with torch.no_grad():
        assert policy.velocity(latents, sigma, policy.encode_prompts(PROMPTS)).shape == (2, n, 3 * patch * patch)


def test_velocity_rejects_mismatched_shapes(tiny):
    cond = tiny.encode_prompts(PROMPTS)
    latents, sigma = noisy_inputs(tiny)
    with pytest.raises(ValueError, match="velocity expects"):
        tiny.velocity(latents[:, :100], sigma, cond)
    with pytest.raises(ValueError, match="velocity expects"):
        tiny.velocity(latents, sigma, cond.repeat_interleave(2))


def test_prediction_defaults_by_preset():
    assert ModelConfig().prediction == "sample"
    assert ModelConfig(preset="qwen_image", path="x").prediction == "velocity"


def test_sample_prediction_returns_the_velocity_of_the_predicted_x0():
    """x_0-prediction: the same network output read as x_0_hat gives v = (x_sigma - x_0_hat) / sigma,
    so one Euler step from sigma to 0 lands exactly on x_0_hat."""
    by_sample, by_velocity = make_tiny(prediction="sample"), make_tiny(prediction="velocity")
    cond = by_sample.encode_prompts(PROMPTS)
    latents, sigma = noisy_inputs(by_sample)
    sigma = sigma.clamp(min=0.05)
    with torch.no_grad():
        x0_hat = by_velocity.velocity(latents, sigma, cond)  # same weights: the raw network output
        v = by_sample.velocity(latents, sigma, cond)
    torch.testing.assert_close(v, (latents - x0_hat) / sigma.view(-1, 1, 1), rtol=0, atol=0)
    torch.testing.assert_close(latents - sigma.view(-1, 1, 1) * v, x0_hat, rtol=1e-5, atol=1e-5)


def test_prompt_encoder_conditions_identically_with_and_without_grad():
    """Rollouts encode under no_grad in eval mode, training re-encodes with grad: bit-identical."""
    policy = make_tiny(prompt_encoder_layers=2)
    policy.eval()
    with torch.no_grad():
        rollout = policy.encode_prompts(PROMPTS).embeds
    policy.train()
    assert torch.equal(rollout, policy.encode_prompts(PROMPTS).embeds.detach())


def test_gradient_reaches_transformer_and_prompt_encoder():
    policy = make_tiny()
    cond = policy.encode_prompts(PROMPTS)
    latents, sigma = noisy_inputs(policy)
    policy.velocity(latents, sigma, cond).pow(2).mean().backward()
    trainable = dict(policy.named_parameters())
    assert set(dict((id(p), p) for p in policy.trainable_parameters())) == {id(p) for p in trainable.values()}
    for name in ("transformer.img_in.weight", "transformer.txt_in.weight", "prompt_encoder.positions.weight",
                 "prompt_encoder.encoder.layers.0.self_attn.in_proj_weight"):
        grad = trainable[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    word_grad = policy.prompt_encoder.words.weight.grad
    used = 2 + VOCAB.index("red")
    unused = 2 + VOCAB.index("squares")
    assert word_grad[used].abs().sum() > 0 and word_grad[unused].abs().sum() == 0


def test_gradient_checkpointing_gives_same_gradients():
    plain, ckpt = make_tiny(), make_tiny(gradient_checkpointing=True)
    assert ckpt.transformer.gradient_checkpointing and not plain.transformer.gradient_checkpointing
    latents, sigma = noisy_inputs(plain)
    for policy in (plain, ckpt):
        policy.velocity(latents, sigma, policy.encode_prompts(PROMPTS)).pow(2).mean().backward()
    g_plain = plain.transformer.transformer_blocks[0].attn.to_q.weight.grad
    g_ckpt = ckpt.transformer.transformer_blocks[0].attn.to_q.weight.grad
    assert g_plain.abs().sum() > 0 and torch.allclose(g_plain, g_ckpt, atol=1e-6)


def test_bf16_forward_tracks_fp32(tiny):
    policy = make_tiny(dtype="bfloat16")
    policy.load_state_dict(tiny.state_dict())
    assert policy.dtype == torch.bfloat16 and policy.prompt_encoder.words.weight.dtype == torch.bfloat16
    latents, sigma = noisy_inputs(tiny)
    with torch.no_grad():
        v16 = policy.velocity(latents, sigma, policy.encode_prompts(PROMPTS))
        v32 = tiny.velocity(latents, sigma, tiny.encode_prompts(PROMPTS))
    assert v16.dtype == torch.float32 and torch.isfinite(v16).all()
    rel = (v16 - v32).norm() / v32.norm()
    assert rel < 0.05, float(rel)


def test_save_load_round_trip(tmp_path):
    policy = make_tiny(seed=3, num_layers=1, max_prompt_tokens=10)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = tmp_path / "tiny.pt"
    save_policy(policy, path, {"step": 7, "note": "base"})
    torch.manual_seed(123)  # a fresh init would differ; the loaded weights must not
    loaded, extra = load_tiny_policy(path)
    assert extra == {"step": 7, "note": "base"}
    assert loaded.cfg == policy.cfg and loaded.tokenizer.vocab == tuple(VOCAB)
    latents, sigma = noisy_inputs(policy)
    with torch.no_grad():
        expected = policy.velocity(latents, sigma, policy.encode_prompts(PROMPTS))
        got = loaded.velocity(latents, sigma, loaded.encode_prompts(PROMPTS))
    assert torch.equal(expected, got)
    torch.load(path, weights_only=True)  # the file holds only plain values and tensors
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_tiny_policy(tmp_path / "missing.pt")


def test_build_policy_dispatch(tmp_path):
    assert isinstance(build_policy(ModelConfig(num_layers=1), VOCAB), TinyShapesDiT)
    with pytest.raises(ValueError, match="vocab"):
        build_policy(ModelConfig())
    cfg = ModelConfig()
    cfg.preset = "unknown"  # bypasses __post_init__ on purpose
    with pytest.raises(ValueError, match="model.preset"):
        build_policy(cfg, VOCAB)


@pytest.mark.gpu
def test_tiny_on_cuda_bf16_tracks_cpu_fp32(tiny):
    policy = make_tiny(dtype="bfloat16", device="cuda")
    policy.load_state_dict(tiny.state_dict())
    latents, sigma = noisy_inputs(tiny)
    with torch.no_grad():
        v_gpu = policy.velocity(latents.cuda(), sigma.cuda(), policy.encode_prompts(PROMPTS))
        v_cpu = tiny.velocity(latents, sigma, tiny.encode_prompts(PROMPTS))
    assert v_gpu.device.type == "cuda" and v_gpu.dtype == torch.float32
    assert (v_gpu.cpu() - v_cpu).norm() / v_cpu.norm() < 0.05


# ---------------------------------------------------------------- real Qwen-Image path (tiny random components)

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return save_tiny_qwen(tmp_path_factory.mktemp("qwen_tiny"))


@pytest.fixture(scope="module")
def qwen_policy(qwen_dir):
    from roll_spotlight.models import QwenImagePolicy

    return QwenImagePolicy.from_pretrained(qwen_dir, image_size=32)


def test_qwen_round_trip_from_saved_directory(qwen_policy):
    policy = qwen_policy
    assert policy.vae_scale_factor == 4 and policy.latent_shape == (16, 16) and policy.image_seq_len == 16
    cond = policy.encode_prompts(["a cat", "a dog on the moon"])
    assert cond.embeds.shape[0] == 2 and cond.embeds.shape[2] == TEXT_DIM
    # byte-level tokenizer: one token per byte, so the two prompts differ by 12 valid tokens
    assert cond.mask.dtype == torch.long and cond.mask[1].all()
    assert int(cond.mask[1].sum() - cond.mask[0].sum()) == len("a dog on the moon") - len("a cat")
    assert (cond.embeds[0][cond.mask[0] == 0] == 0).all()
    latents, sigma = noisy_inputs(policy)
    with torch.no_grad():
        v = policy.velocity(latents, sigma, cond)
    assert v.shape == (2, 16, 16) and v.dtype == torch.float32 and torch.isfinite(v).all()
    out = policy.decode(latents)
    assert out.shape == (2, 3, 32, 32) and out.min() >= 0 and out.max() <= 1
    assert policy.encode_images(images()).shape == (2, 16, 16)


def test_qwen_decode_matches_pipeline_output(qwen_policy):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    policy = qwen_policy
    pipe = QwenImagePipeline(FlowMatchEulerDiscreteScheduler(), policy.vae, policy.text_encoder,
                             policy._pipe.tokenizer, policy.transformer)
    kwargs = dict(prompt="a red square", height=32, width=32, num_inference_steps=2, true_cfg_scale=1.0)
    latents = pipe(**kwargs, output_type="latent", generator=torch.Generator().manual_seed(0)).images
    pixels = pipe(**kwargs, output_type="pt", generator=torch.Generator().manual_seed(0)).images
    assert torch.allclose(policy.decode(latents), pixels, atol=1e-5)


def test_qwen_encode_images_normalises_vae_latents(qwen_policy):
    policy = qwen_policy
    img = images()
    raw = policy.vae.encode((img * 2 - 1)[:, :, None]).latent_dist.mode()[:, :, 0]
    got = unpack_2x2(policy.encode_images(img), *policy.latent_grid)
    mean = torch.tensor([0.1, -0.2, 0.3, 0.0]).view(1, 4, 1, 1)
    std = torch.tensor([2.0, 0.5, 1.5, 1.0]).view(1, 4, 1, 1)
    assert torch.allclose(got, (raw - mean) / std, atol=1e-5)


def test_qwen_only_transformer_trains_and_frozen_parts_stay_eval(qwen_policy):
    policy = qwen_policy.train()
    assert policy.transformer.training and not policy.vae.training and not policy.text_encoder.training
    trainable = {id(p) for p in policy.trainable_parameters()}
    assert trainable == {id(p) for p in policy.transformer.parameters()}
    latents, sigma = noisy_inputs(policy, batch=1)
    cond = policy.encode_prompts(["a cat"])
    policy.velocity(latents, sigma, cond).pow(2).mean().backward()
    assert policy.transformer.img_in.weight.grad.abs().sum() > 0
    policy.transformer.zero_grad(set_to_none=True)


def test_qwen_bf16_and_checkpointing_from_config(qwen_dir):
    cfg = ModelConfig(preset="qwen_image", path=str(qwen_dir), dtype="bfloat16", image_size=32,
                      gradient_checkpointing=True, max_sequence_length=32)
    policy = build_policy(cfg)
    assert policy.transformer.dtype == torch.bfloat16 and policy.text_encoder.dtype == torch.bfloat16
    assert policy.transformer.gradient_checkpointing
    latents, sigma = noisy_inputs(policy, batch=1)
    v = policy.velocity(latents, sigma, policy.encode_prompts(["a cat"]))
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    v.float().pow(2).mean().backward()
    assert policy.transformer.img_in.weight.grad is not None


def test_qwen_missing_directory_or_subfolder(tmp_path, qwen_dir):
    from roll_spotlight.models import QwenImagePolicy

    missing = tmp_path / "no_such_pipeline"
    with pytest.raises(FileNotFoundError, match="no_such_pipeline"):
        build_policy(ModelConfig(preset="qwen_image", path=str(missing)))
    partial = tmp_path / "partial"
    (partial / "transformer").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="vae"):
        QwenImagePolicy.from_pretrained(partial)



# ---------------------------------------------------------------- weight versions and policy sources


def test_qwen_weight_version_carries_the_transformer_only_and_round_trips(qwen_dir, qwen_policy):
    from roll_spotlight.models import QwenImagePolicy

    state = qwen_policy.published_state()
    transformer = qwen_policy.transformer.state_dict()
    assert set(state) == {f"transformer.{k}" for k in transformer} and len(state) < len(qwen_policy.state_dict())
    other = QwenImagePolicy.from_pretrained(qwen_dir, image_size=32)
    moved = {k: v + 0.5 for k, v in state.items()}
    other.load_published_state(moved)
    assert all(torch.equal(other.transformer.state_dict()[k[len("transformer."):]], v) for k, v in moved.items())
    vae = qwen_policy.vae.state_dict()
    assert all(torch.equal(other.vae.state_dict()[k], v) for k, v in vae.items())  # frozen parts untouched
    with pytest.raises(KeyError, match="missing keys"):
        other.load_published_state(dict(list(state.items())[1:]))
    with pytest.raises(KeyError, match="unknown keys"):
        other.load_published_state(state | {"vae.extra": torch.zeros(1)})


def test_tiny_weight_version_is_the_whole_state(tiny):
    state = tiny.published_state()
    assert set(state) == set(tiny.state_dict())
    copy = make_tiny(seed=3)
    copy.load_published_state(state)
    assert all(torch.equal(copy.state_dict()[k], v) for k, v in state.items())


def test_policy_source_and_load_policy(qwen_dir, tmp_path):
    from roll_spotlight.config.strict import to_dict
    from roll_spotlight.models import QwenImagePolicy
    from roll_spotlight.worker.policy_source import load_policy, policy_source, worker_gpus

    cfg = ModelConfig(preset="qwen_image", path=str(qwen_dir), image_size=32)
    source = policy_source(cfg, None)
    assert source == to_dict(cfg) and worker_gpus(source) == 0.0
    assert worker_gpus(source | {"device": "cuda"}) == 1.0 and worker_gpus("base.pt") == 0.0
    policy = load_policy(source)
    assert isinstance(policy, QwenImagePolicy) and policy.latent_shape == (16, 16)
    with pytest.raises(ValueError, match="model.path"):
        load_policy(source | {"path": None})
    with pytest.raises(ValueError, match="base checkpoint"):
        load_policy({"preset": "tiny"})
    with pytest.raises(ValueError, match="base checkpoint path"):
        policy_source(ModelConfig(), None)
    tiny = make_tiny(seed=4)
    save_policy(tiny, tmp_path / "base.pt")
    assert policy_source(ModelConfig(), str(tmp_path / "base.pt")) == str(tmp_path / "base.pt")
    loaded = load_policy(str(tmp_path / "base.pt"))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in tiny.state_dict().items())


def test_real_model_run_starts_from_its_directory_and_is_never_pretrained(qwen_dir):
    from roll_spotlight.config.strict import ConfigError, load_config
    from roll_spotlight.models import QwenImagePolicy
    from roll_spotlight.config.run import RunConfig
    from roll_spotlight.startup import starting_policy
    from roll_spotlight.training.pretrain import load_or_pretrain

    cfg = load_config(RunConfig, "configs/tiny_shapes.yaml",
                      ["model.preset=qwen_image", f"model.path={qwen_dir}", "model.image_size=32"])
    policy, source = starting_policy(cfg, progress=False)
    assert isinstance(policy, QwenImagePolicy) and source["preset"] == "qwen_image" and source["path"] == str(qwen_dir)
    with pytest.raises(ConfigError, match="model.preset='qwen_image'"):
        load_or_pretrain(cfg, progress=False)
