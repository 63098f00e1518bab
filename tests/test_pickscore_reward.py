"""PickScore reward on a tiny random CLIP saved to a temporary directory (model and processor
together, or model-only with the processor in a second directory, as PickScore_v1 ships)."""
import numpy as np
import pytest
import torch

from roll_spotlight.rewards import build_reward
from roll_spotlight.rewards.pickscore import PickScoreReward


@pytest.fixture(scope="module")
def clip_dirs(tmp_path_factory):
    from reward_model_helpers import save_tiny_clip, save_tiny_mask2former

    root = tmp_path_factory.mktemp("pickscore_models")
    return {"full": str(save_tiny_clip(root / "full")),
            "model_only": str(save_tiny_clip(root / "model_only", with_processor=False)),
            "detector": str(save_tiny_mask2former(root / "m2f"))}


IMAGES = np.random.default_rng(0).integers(0, 256, size=(5, 40, 48, 3), dtype=np.uint8)
PROMPTS = ["a cat", "a dog on a sofa", 'a sign that says "Open"', "a cat", "x " * 200]


def _expected(model_dir, images, prompts):
    """PickScore's formula computed directly with transformers, one sample at a time."""
    from transformers import CLIPModel, CLIPProcessor

    from roll_spotlight.rewards.geneval_models import embedding

    model, processor = CLIPModel.from_pretrained(model_dir).eval(), CLIPProcessor.from_pretrained(model_dir)
    out = []
    for image, prompt in zip(images, prompts):
        with torch.no_grad():
            img = embedding(model.get_image_features(**processor(images=[image], return_tensors="pt")))
            txt = embedding(model.get_text_features(**processor(text=[prompt], return_tensors="pt",
                                                                truncation=True, max_length=77)))
        cosine = torch.nn.functional.cosine_similarity(img, txt).item()
        out.append(model.logit_scale.exp().item() * cosine)
    return np.array(out)


def test_score_is_scaled_cosine(clip_dirs):
    reward = build_reward("pickscore", model_path=clip_dirs["full"], device="cpu", batch_size=2)
    out = reward(IMAGES, PROMPTS)
    assert out.rewards.shape == (5,) and np.isfinite(out.rewards).all()
    np.testing.assert_allclose(out.info["pickscore_raw"], _expected(clip_dirs["full"], IMAGES, PROMPTS),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.rewards, out.info["pickscore_raw"] / 26.0)
    scale = np.exp(reward._clip.model.logit_scale.item())
    assert (np.abs(out.info["pickscore_raw"]) <= scale + 1e-4).all()
    again = reward(IMAGES, PROMPTS)
    np.testing.assert_array_equal(out.rewards, again.rewards)


def test_processor_from_a_second_directory(clip_dirs):
    separate = PickScoreReward(model_path=clip_dirs["model_only"], processor_path=clip_dirs["full"],
                               device="cpu", normalize_by=1.0)
    out = separate(IMAGES[:2], PROMPTS[:2])
    np.testing.assert_allclose(out.rewards, out.info["pickscore_raw"])


def test_errors_name_the_key(clip_dirs, tmp_path):
    with pytest.raises(ValueError, match="reward_fn.kwargs.model_path must name"):
        PickScoreReward()
    with pytest.raises(ValueError, match="reward_fn.kwargs.model_path=.*no such directory"):
        PickScoreReward(model_path=str(tmp_path / "PickScore_v1"))
    with pytest.raises(ValueError, match="model_path=.*found model_type 'mask2former'"):
        PickScoreReward(model_path=clip_dirs["detector"])
    with pytest.raises(ValueError, match="reward_fn.kwargs.processor_path=.*no such directory"):
        PickScoreReward(model_path=clip_dirs["full"], processor_path=str(tmp_path / "laion"))
    with pytest.raises(ValueError, match="reward_fn.kwargs.normalize_by must be a finite number > 0, got 0"):
        PickScoreReward(model_path=clip_dirs["full"], normalize_by=0)
    model_only = PickScoreReward(model_path=clip_dirs["model_only"], device="cpu")
    with pytest.raises(ValueError, match="reward_fn.kwargs.model_path=.*cannot load a CLIP processor"):
        model_only(IMAGES[:1], PROMPTS[:1])


def test_registered_as_a_builtin(monkeypatch):
    from roll_spotlight import plugins
    from roll_spotlight.rewards import known_rewards, resolve_reward

    monkeypatch.setattr(plugins, "_entry_points", lambda group: {})
    assert resolve_reward("pickscore") is PickScoreReward and "pickscore" in known_rewards()
