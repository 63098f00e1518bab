"""True classifier-free guidance in the policy's velocity (Qwen-Image's `true_cfg_scale`), the
negative prompt in the conditioning, and the prompt-embedding cache of the real model."""

from __future__ import annotations

import pytest
import torch

from roll_spotlight.flow_grpo import recompute_log_probs, sigma_schedule
from roll_spotlight.models import Conditioning, ModelConfig, TinyShapesDiT
from roll_spotlight.models.guidance import check_guidance, true_cfg
from roll_spotlight.training.sampling import RolloutSpec, generate

VOCAB = ["a", "one", "two", "red", "blue", "circle", "circles", "square"]
PROMPTS = ["two red circles", "a blue square"]


def tiny(seed: int = 0) -> TinyShapesDiT:
    torch.manual_seed(seed)
    return TinyShapesDiT(ModelConfig(num_layers=1, image_size=16), VOCAB)


def inputs(policy, batch: int = 2, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *policy.latent_shape, generator=gen), torch.rand(batch, generator=gen) * 0.9 + 0.05


# ---------------------------------------------------------------- the formula and its configuration


@pytest.mark.parametrize("scale, negative, key", [
    (0.5, " ", "sampling.guidance_scale"),
    (True, " ", "sampling.guidance_scale"),
    (4.0, None, "sampling.negative_prompt"),
    (4.0, 3, "sampling.negative_prompt"),
])
def test_guidance_validation_names_the_key(scale, negative, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        check_guidance(scale, negative)


def test_true_cfg_extrapolates_and_keeps_the_conditional_norm_per_token():
    gen = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(2, 5, 4, generator=gen), torch.randn(2, 5, 4, generator=gen)
    guided = true_cfg(cond, uncond, 3.0)
    torch.testing.assert_close(guided.norm(dim=-1), cond.norm(dim=-1))
    direction = uncond + 3.0 * (cond - uncond)
    torch.testing.assert_close(guided / guided.norm(dim=-1, keepdim=True),
                               direction / direction.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(true_cfg(cond, uncond, 1.0), cond)


def test_tiny_negative_prompt_must_be_encodable():
    policy = tiny()
    with pytest.raises(ValueError, match=r"sampling\.negative_prompt='purple blur'.*'purple'"):
        policy.set_guidance(4.0, "purple blur")
    assert not policy.guided
    policy.set_guidance(4.0, " ")  # no words: the start token alone
    assert policy.guided and policy.negative_prompt == " "
    policy.set_guidance(1.0, None)
    assert not policy.guided


# ---------------------------------------------------------------- the conditioning carries the negative


def test_conditioning_operations_carry_the_negative():
    neg = Conditioning(torch.arange(4.0).view(2, 1, 2), torch.ones(2, 1, dtype=torch.long))
    cond = Conditioning(torch.arange(12.0).view(2, 3, 2), torch.tensor([[1, 1, 0], [1, 0, 0]]), neg)
    assert torch.equal(cond.index([1]).negative.embeds, neg.embeds[1:])
    rep = cond.repeat_interleave(2)
    assert rep.negative.batch_size == 4 and torch.equal(rep.negative.embeds[2], neg.embeds[1])
    longer = Conditioning(torch.ones(1, 2, 2), torch.ones(1, 2, dtype=torch.long),
                          Conditioning(torch.ones(1, 3, 2), torch.ones(1, 3, dtype=torch.long)))
    both = Conditioning.cat([cond, longer])
    assert both.negative.embeds.shape == (3, 3, 2) and both.negative.mask[0].tolist() == [1, 0, 0]
    assert cond.to("cpu").negative is not None
    with pytest.raises(ValueError, match="negative"):
        Conditioning.cat([cond, Conditioning(torch.ones(1, 1, 2), torch.ones(1, 1, dtype=torch.long))])
    with pytest.raises(ValueError, match="negative"):
        Conditioning(cond.embeds, cond.mask, neg.index(0))


def test_guided_velocity_is_true_cfg_of_two_unguided_ones():
    policy = tiny()
    latents, sigma = inputs(policy)
    with torch.no_grad():
        cond = policy.encode_prompts(PROMPTS)
        uncond = policy.encode_prompts([" ", " "])
        v_cond, v_uncond = policy.velocity(latents, sigma, cond), policy.velocity(latents, sigma, uncond)
        policy.set_guidance(4.0, " ")
        guided_cond = policy.encode_prompts(PROMPTS)
        batches = []
        hook = policy.transformer.register_forward_hook(lambda m, a, kw, out: batches.append(kw["hidden_states"].shape[0]),
                                                        with_kwargs=True)
        guided = policy.velocity(latents, sigma, guided_cond)
        hook.remove()
    assert batches == [4]  # both branches in one forward of 2B rows
    assert guided_cond.negative.batch_size == 2 and torch.equal(guided_cond.negative.embeds, uncond.embeds)
    # one forward of 2B rows sums its GEMMs in another order than two of B: the last bits move
    torch.testing.assert_close(guided, true_cfg(v_cond, v_uncond, 4.0), rtol=1e-4, atol=5e-5)
    assert (guided - v_cond).abs().max() > 1e-3
    with pytest.raises(ValueError, match="no negative prompt"):
        policy.velocity(latents, sigma, cond)  # encoded before guidance was switched on


def test_training_recompute_uses_the_guided_velocity():
    """With unchanged weights the recomputed log-probs equal the rollout's: the rollout and the
    training path (`recompute_log_probs` on `policy.velocity`) both guide."""
    policy = tiny()
    policy.set_guidance(3.0, " ")
    traj = generate(policy, PROMPTS, [1, 2], RolloutSpec(num_steps=3, noise_level=0.7, kind="sde", window=None))
    cond = policy.encode_prompts(PROMPTS)
    for k in range(3):
        out = recompute_log_probs(lambda x, s: policy.velocity(x, s, cond), traj, k, noise_level=0.7, kind="sde")
        assert torch.equal(out.log_prob, traj.log_probs[:, k])
    policy.set_guidance(1.0, None)
    plain = policy.encode_prompts(PROMPTS)
    gaps = [(recompute_log_probs(lambda x, s: policy.velocity(x, s, plain), traj, k, noise_level=0.7,
                                 kind="sde").log_prob - traj.log_probs[:, k]).abs().max() for k in range(3)]
    assert max(gaps) > 1e-3  # an unguided recompute would not match the guided rollout


# ---------------------------------------------------------------- the real model against QwenImagePipeline


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from roll_spotlight.models import make_tiny_qwen

    return make_tiny_qwen(tmp_path_factory.mktemp("qwen_cfg"))


@pytest.fixture()
def qwen_policy(qwen_dir):
    from roll_spotlight.models import QwenImagePolicy

    return QwenImagePolicy.from_pretrained(qwen_dir, image_size=32)


@pytest.mark.parametrize("negative", [" ", "blurry, low quality"])
def test_ode_sampling_matches_qwen_image_pipeline_with_true_cfg(qwen_dir, qwen_policy, negative):
    from diffusers import QwenImagePipeline

    policy, prompts, steps, scale = qwen_policy, ["a cat", "a dog on the moon"], 6, 4.0
    policy.set_guidance(scale, negative)
    ours = generate(policy, prompts, [3, 4], RolloutSpec(steps, 0.7, "ode", None))
    pipe = QwenImagePipeline.from_pretrained(qwen_dir)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(prompt=prompts, negative_prompt=negative, true_cfg_scale=scale, height=32, width=32,
                  num_inference_steps=steps, latents=ours.latents[:, 0].clone())
    theirs = pipe(**kwargs, output_type="latent").images
    torch.testing.assert_close(pipe.scheduler.sigmas, sigma_schedule(steps, policy.image_seq_len), rtol=0, atol=1e-6)
    assert (theirs - ours.final).abs().max() < 1e-5
    pixels = pipe(**kwargs, output_type="pt").images
    assert (policy.decode(ours.final) - pixels).abs().max() < 1e-5
    unguided = pipe(**(kwargs | {"true_cfg_scale": 1.0}), output_type="latent").images
    assert (unguided - ours.final).abs().max() > 1e-2  # guidance changed the samples well beyond the tolerance


def test_prompt_embeddings_are_cached_per_prompt_and_batch_independent(qwen_policy):
    policy, calls = qwen_policy, []
    encode = policy._pipe.encode_prompt

    def counting(prompt, **kwargs):
        calls.append(list(prompt))
        return encode(prompt, **kwargs)

    policy._pipe.encode_prompt = counting
    policy.set_guidance(4.0, " ")  # checks the negative encodes: one call
    first = policy.encode_prompts(["a cat", "a dog on the moon", "a cat"])
    again = policy.encode_prompts(["a dog on the moon"])
    assert sorted(map(tuple, calls)) == [(" ",), ("a cat",), ("a dog on the moon",)]
    length = int(again.mask[0].sum())
    assert torch.equal(first.embeds[1, :length], again.embeds[0]) and torch.equal(first.embeds[0], first.embeds[2])
    assert first.negative.batch_size == 3 and torch.equal(first.negative.embeds[0], first.negative.embeds[2])


def test_prompt_cache_is_bounded(qwen_dir):
    from roll_spotlight.models import QwenImagePolicy

    policy = QwenImagePolicy.from_pretrained(qwen_dir, image_size=32, prompt_cache_size=2)
    policy.encode_prompts(["a", "b", "c", "b"])
    assert list(policy._prompt_cache) == ["c", "b"]
    uncached = QwenImagePolicy.from_pretrained(qwen_dir, image_size=32, prompt_cache_size=0)
    uncached.encode_prompts(["a"])
    assert not uncached._prompt_cache
    with pytest.raises(ValueError, match=r"model\.prompt_cache_size"):
        ModelConfig(prompt_cache_size=-1)
