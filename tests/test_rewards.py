"""Tier 1 tests of rewards: registry, combinators, shapes, OCR formula (+ a little real OCR), JPEG."""
import importlib.metadata
import logging

import numpy as np
import pytest

from roll_spotlight.rewards import (
    JpegCompressibility,
    MeanBrightness,
    OcrReward,
    Reward,
    RewardOutput,
    SafeReward,
    ShapesReward,
    WeightedReward,
    as_uint8_images,
    build_reward,
    known_rewards,
    register_reward,
)
from roll_spotlight import plugins
from roll_spotlight.rewards.ocr import levenshtein, ocr_text_reward
from roll_spotlight.tasks.ocr_text import quoted_target
from roll_spotlight.tasks.shapes import make_prompt_set, render


class _Fixed(Reward):
    """Returns preset rewards, or raises."""

    def __init__(self, values=None, error=None):
        self.values, self.error = values, error

    def score(self, images, prompts):
        if self.error is not None:
            raise self.error
        return RewardOutput(np.array(self.values, dtype=np.float64), {"raw": np.array(self.values)})


def _images(n=3, size=16, value=0):
    return np.full((n, size, size, 3), value, dtype=np.uint8)


# ---- registry --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,cls", [("shapes", ShapesReward), ("ocr", OcrReward),
                                      ("jpeg_compressibility", JpegCompressibility), ("brightness", MeanBrightness)])
def test_builtins_resolve_without_installation(name, cls, monkeypatch):
    monkeypatch.setattr(plugins, "_entry_points", lambda group: {})
    assert type(build_reward(name)) is cls
    assert name in known_rewards()


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as info:
        build_reward("clip_score")
    assert "'clip_score'" in str(info.value) and "shapes" in str(info.value) and "brightness" in str(info.value)


def test_dotted_paths_resolve_or_raise():
    assert type(build_reward("roll_spotlight.rewards.jpeg:MeanBrightness")) is MeanBrightness
    with pytest.raises(ValueError, match="roll_spotlight.rewards.jpeg:Nope"):
        build_reward("roll_spotlight.rewards.jpeg:Nope")
    with pytest.raises(ValueError, match="no_such_module"):
        build_reward("no_such_module:Thing")


def test_entry_point_names_resolve(monkeypatch):
    ep = importlib.metadata.EntryPoint("plugin_bright", "roll_spotlight.rewards.jpeg:MeanBrightness",
                                       "roll_spotlight.rewards")
    monkeypatch.setattr(plugins, "_entry_points", lambda group: {"plugin_bright": ep})
    assert "plugin_bright" in known_rewards()
    assert type(build_reward("plugin_bright")) is MeanBrightness


@pytest.fixture
def fixed_registered():
    register_reward("test_fixed")(_Fixed)
    yield "test_fixed"
    plugins.unregister("rewards", "test_fixed")


def test_register_reward_builds_and_refuses_a_taken_name(fixed_registered):
    register_reward(fixed_registered)(_Fixed)  # same object again: a no-op
    assert build_reward(fixed_registered, values=[1.0, 2.0]).values == [1.0, 2.0]
    assert fixed_registered in known_rewards()
    with pytest.raises(ValueError, match="already registered"):
        register_reward(fixed_registered)(MeanBrightness)
    with pytest.raises(ValueError, match="name"):
        register_reward("a:b")(_Fixed)


# ---- input conversion and the call contract --------------------------------------------------

def test_as_uint8_images_accepts_numpy_and_torch():
    rng = np.random.default_rng(0)
    floats = rng.random((2, 8, 8, 3))
    expected = np.round(floats * 255).astype(np.uint8)
    assert np.array_equal(as_uint8_images(floats), expected)
    torch = pytest.importorskip("torch")
    tensor = torch.from_numpy(floats).permute(0, 3, 1, 2).float()
    assert np.array_equal(as_uint8_images(tensor), expected)
    assert as_uint8_images(torch.full((1, 3, 4, 4), 2.0)).max() == 255  # clamped
    with pytest.raises(ValueError):
        as_uint8_images(tensor.permute(0, 2, 3, 1))


@pytest.mark.parametrize("bad", [np.zeros((8, 8, 3), np.uint8), np.zeros((1, 8, 8, 4), np.uint8),
                                 np.zeros((1, 8, 8, 3), np.int64), [[0]]])
def test_as_uint8_images_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        as_uint8_images(bad)


def test_reward_checks_prompt_count_and_output_shape():
    with pytest.raises(ValueError, match="3 images but 2 prompts"):
        MeanBrightness()(_images(3), ["a", "b"])
    with pytest.raises(ValueError, match="shape"):
        _Fixed(values=[1.0, 2.0])(_images(3), ["a"] * 3)


# ---- combinators -----------------------------------------------------------------------------

def test_weighted_reward_sums_components_and_reports_each():
    images = np.stack([_images(1, 32, 0)[0], _images(1, 32, 255)[0]])
    reward = WeightedReward({"brightness": 2.0, "jpeg_compressibility": 0.5},
                            jpeg_compressibility={"quality": 50})
    out = reward(images, ["x", "y"])
    bright = MeanBrightness()(images, ["x", "y"]).rewards
    jpeg = JpegCompressibility(quality=50)(images, ["x", "y"])
    np.testing.assert_allclose(out.rewards, 2.0 * bright + 0.5 * jpeg.rewards)
    np.testing.assert_allclose(out.info["brightness"], bright)
    np.testing.assert_allclose(out.info["jpeg_compressibility/jpeg_kb"], jpeg.info["jpeg_kb"])
    assert type(build_reward("weighted", components={"brightness": 1.0})) is WeightedReward


@pytest.mark.parametrize("args,kwargs,match", [({}, {}, "at least one"),
                                               ({"brightness": float("nan")}, {}, "finite"),
                                               ({"brightness": 1.0}, {"shapes": {}}, "'shapes'")])
def test_weighted_reward_validates(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        WeightedReward(args, **kwargs)


def test_safe_reward_replaces_non_finite_values(caplog):
    safe = SafeReward(_Fixed(values=[1.0, np.nan, np.inf]), fallback=-1.0)
    with caplog.at_level(logging.WARNING):
        out = safe(_images(3), ["p"] * 3)
    np.testing.assert_array_equal(out.rewards, [1.0, -1.0, -1.0])
    np.testing.assert_array_equal(out.info["reward_fallback"], [0.0, 1.0, 1.0])
    assert (safe.nonfinite, safe.failures) == (2, 0)
    assert "non-finite" in caplog.text


def test_safe_reward_turns_an_exception_into_fallback(caplog):
    safe = SafeReward(_Fixed(error=RuntimeError("reward server down")))
    with caplog.at_level(logging.WARNING):
        out = safe(_images(4), ["p"] * 4)
        out = safe(_images(4), ["p"] * 4)
    np.testing.assert_array_equal(out.rewards, np.zeros(4))
    np.testing.assert_array_equal(out.info["reward_fallback"], np.ones(4))
    assert (safe.failures, safe.nonfinite) == (2, 0)
    assert "reward server down" in caplog.text
    wrong_shape = SafeReward(_Fixed(values=[1.0]))(_images(2), ["p"] * 2)  # inner contract broken
    np.testing.assert_array_equal(wrong_shape.rewards, [0.0, 0.0])


def test_safe_reward_validates_and_builds_by_name():
    with pytest.raises(ValueError, match="fallback"):
        SafeReward(MeanBrightness(), fallback=float("nan"))
    safe = SafeReward("brightness")
    assert type(safe.inner) is MeanBrightness
    np.testing.assert_allclose(safe(_images(2, value=255), ["a", "b"]).rewards, [1.0, 1.0])


# ---- shapes ----------------------------------------------------------------------------------

def test_shapes_reward_modes():
    prompts = make_prompt_set("val", 12, seed=2)
    images = np.stack([render(p.spec, seed=i) for i, p in enumerate(prompts)])
    texts = [p.text for p in prompts]
    strict = ShapesReward(mode="strict")(images, texts)
    np.testing.assert_array_equal(strict.rewards, np.ones(12))
    shuffled = texts[1:] + texts[:1]  # every image now scored against another prompt
    partial = ShapesReward(mode="partial")(images, shuffled)
    mix = ShapesReward(mode="mix", strict_weight=0.25)(images, shuffled)
    assert partial.rewards.mean() < 1.0
    np.testing.assert_allclose(partial.rewards, partial.info["partial"])
    np.testing.assert_allclose(mix.rewards, 0.25 * mix.info["strict"] + 0.75 * mix.info["partial"])
    with pytest.raises(ValueError, match=r"ShapesReward\.mode must be one of .*, got 'best'"):
        ShapesReward(mode="best")
    with pytest.raises(ValueError, match=r"ShapesReward\.strict_weight must be a finite number in \[0, 1\], got 2"):
        ShapesReward(mode="mix", strict_weight=2)


def test_shapes_reward_accepts_a_float_tensor():
    torch = pytest.importorskip("torch")
    prompt = make_prompt_set("val", 1, seed=0, tags=["counting"])[0]
    tensor = torch.from_numpy(render(prompt.spec, seed=0)).permute(2, 0, 1)[None].float() / 255
    assert ShapesReward(mode="strict")(tensor, [prompt.text]).rewards[0] == 1.0


# ---- OCR -------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,d", [("", "", 0), ("abc", "", 3), ("", "ab", 2), ("kitten", "sitting", 3),
                                   ("flaw", "lawn", 2), ("abc", "abc", 0), ("abc", "cba", 2)])
def test_levenshtein(a, b, d):
    assert levenshtein(a, b) == d == levenshtein(b, a)


@pytest.mark.parametrize("recognized,target,expected", [
    ("Hello World", "hello world", 1.0),        # case and spaces ignored
    ("big sign: HELLO world!", "hello world", 1.0),  # target inside the recognised text
    ("hallo", "hello", 0.8),
    ("", "hello", 0.0),
    ("completely different and much longer", "hi", 0.0),  # distance clipped at len(target)
    ("helo", "hello", 0.8),
])
def test_ocr_text_reward_formula(recognized, target, expected):
    assert ocr_text_reward(recognized, target) == pytest.approx(expected)


def test_quoted_target_and_errors_name_the_prompt():
    assert quoted_target('a sign that says "Open 24h" in neon') == "Open 24h"
    assert quoted_target('"a" and "b"') == "a"
    for prompt in ["a sign without quotes", 'an "unclosed quote']:
        with pytest.raises(ValueError) as info:
            quoted_target(prompt)
        assert repr(prompt) in str(info.value)
    with pytest.raises(ValueError, match="empty"):
        ocr_text_reward("x", "  ")


def test_ocr_reward_with_injected_recognizer():
    reward = OcrReward(recognizer=lambda image: "HELLO" if image.mean() > 100 else "")
    out = reward(np.stack([_images(1, value=255)[0], _images(1, value=0)[0]]), ['"hello"', '"hello"'])
    np.testing.assert_array_equal(out.rewards, [1.0, 0.0])
    np.testing.assert_array_equal(out.info["exact_match"], [1.0, 0.0])
    with pytest.raises(ValueError, match="no quotes here"):
        reward(_images(1), ["no quotes here"])


def _text_image(text):
    from PIL import Image, ImageDraw, ImageFont
    image = Image.new("RGB", (512, 256), "white")
    ImageDraw.Draw(image).text((30, 90), text, fill="black", font=ImageFont.load_default(size=56))
    return np.asarray(image)


@pytest.mark.slow
def test_real_ocr_reads_rendered_text():
    pytest.importorskip("rapidocr_onnxruntime")
    images = np.stack([_text_image("hello world"), _text_image("hello")])
    out = OcrReward()(images, ['a sign that says "hello world"'] * 2)
    assert out.rewards[0] == 1.0
    assert 0.0 < out.rewards[1] < 1.0


# ---- JPEG and brightness ---------------------------------------------------------------------

def test_jpeg_compressibility_prefers_flat_images():
    flat = _images(1, 64, 128)[0]
    noisy = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    out = build_reward("jpeg_compressibility")(np.stack([flat, noisy]), ["", ""])
    assert out.rewards[0] > out.rewards[1] and (out.rewards < 0).all()
    np.testing.assert_allclose(out.rewards, -out.info["jpeg_kb"])
    with pytest.raises(ValueError, match=r"JpegCompressibility.quality must be an integer in \[1, 100\], got 0"):
        JpegCompressibility(quality=0)


def test_mean_brightness():
    images = np.stack([_images(1, value=0)[0], _images(1, value=255)[0], _images(1, value=51)[0]])
    np.testing.assert_allclose(MeanBrightness()(images, ["", "", ""]).rewards, [0.0, 1.0, 0.2])
