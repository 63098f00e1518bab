"""GenEval reward: its rules on synthetic detections (numpy only), then the reward end to end on a
tiny random Mask2Former and a tiny random CLIP saved to temporary directories."""
import json

import numpy as np
import pytest

from roll_spotlight.rewards import build_reward
from roll_spotlight.rewards.geneval import GenevalReward
from roll_spotlight.rewards.geneval_models import geneval_label_names, object_crop
from roll_spotlight.rewards.geneval_rules import (
    Detection,
    GenevalRules,
    box_iou,
    evaluate,
    relative_position,
    select_detections,
)

RULES = GenevalRules()


def det(x1, y1, x2, y2, score=0.95, color=None):
    d = Detection((x1, y1, x2, y2), score)
    if color is not None:
        COLOR_OF[d.box] = color
    return d


COLOR_OF: dict = {}


def colors(name, dets):
    return [COLOR_OF.get(d.box, "white") for d in dets]


def meta(tag, include, exclude=None, prompt="p"):
    out = {"tag": tag, "prompt": prompt, "include": include}
    if exclude is not None:
        out["exclude"] = exclude
    return out


def score(objects, metadata):
    return evaluate(select_detections(objects, metadata["tag"], RULES), metadata, colors, RULES)


# ---- detection selection ----------------------------------------------------------------------

def test_thresholds_depend_on_the_counting_tag():
    found = {"cup": [det(0, 0, 10, 10, 0.5), det(20, 0, 30, 10, 0.95)], "dog": [det(0, 0, 5, 5, 0.2)]}
    assert [d.score for d in select_detections(found, "two_object", RULES)["cup"]] == [0.95, 0.5]
    assert "dog" not in select_detections(found, "two_object", RULES)
    assert [d.score for d in select_detections(found, "counting", RULES)["cup"]] == [0.95]


def test_max_objects_and_overlap():
    found = {"cup": [det(i, 0, i + 10, 10, 0.5 + i / 100) for i in range(20)]}
    assert len(select_detections(found, "counting", GenevalRules(counting_threshold=0.3))["cup"]) == 16
    nms = GenevalRules(max_overlap=0.5)
    kept = select_detections(found, "single_object", nms)["cup"]
    assert all(box_iou(a.box, b.box) < 0.5 for a in kept for b in kept if a is not b)
    assert kept[0].score == max(d.score for d in found["cup"])


def test_iou_inclusive_pixels():
    assert box_iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1.0
    assert box_iou((0, 0, 9, 9), (10, 0, 19, 9)) == 0.0
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(50 / 150)


@pytest.mark.parametrize("a,b,expected", [
    ((0, 40, 20, 60), (60, 40, 80, 60), {"left of"}),
    ((60, 40, 80, 60), (0, 40, 20, 60), {"right of"}),
    ((40, 0, 60, 20), (40, 60, 60, 80), {"above"}),
    ((40, 60, 60, 80), (40, 0, 60, 20), {"below"}),
    ((0, 0, 20, 20), (70, 70, 90, 90), {"left of", "above"}),
    ((40, 40, 60, 60), (45, 42, 65, 62), set()),  # centres closer than 0.1 x the summed sizes
])
def test_relative_position(a, b, expected):
    assert relative_position(a, b, 0.1) == expected


def test_position_threshold_shrinks_offsets():
    a, b = (0, 0, 20, 20), (22, 0, 42, 20)  # centres 22 apart, sizes 20 + 20
    assert relative_position(a, b, 0.1) == {"left of"}
    assert relative_position(a, b, 0.6) == set()


# ---- verdicts ---------------------------------------------------------------------------------

def test_counting_exact_vs_at_least():
    metadata = meta("counting", [{"class": "cup", "count": 3}], [{"class": "cup", "count": 4}])
    three = {"cup": [det(i * 20, 0, i * 20 + 10, 10) for i in range(3)]}
    assert score(three, metadata) == score(three, metadata)
    result = score(three, metadata)
    assert result.geneval and result.strict and result.partial == 1.0
    four = {"cup": [det(i * 20, 0, i * 20 + 10, 10) for i in range(4)]}
    result = score(four, metadata)
    assert not result.geneval and not result.strict and result.partial == pytest.approx(2 / 3)
    no_exclude = meta("counting", [{"class": "cup", "count": 3}])
    result = score(four, no_exclude)
    assert result.geneval and not result.strict  # GenEval asks at least 3; flow_grpo's strict exactly 3
    assert score({}, metadata).partial == 0.0


def test_two_objects_partial_is_the_fraction_met():
    metadata = meta("two_object", [{"class": "cup", "count": 1}, {"class": "dog", "count": 1}])
    result = score({"cup": [det(0, 0, 10, 10)]}, metadata)
    assert (result.geneval, result.strict, result.partial) == (False, False, 0.5)
    assert "dog" in result.reasons[0]


def test_colors_judged_on_the_most_confident_objects():
    metadata = meta("color_attr", [{"class": "cup", "count": 1, "color": "red"},
                                   {"class": "dog", "count": 1, "color": "black"}])
    objects = {"cup": [det(0, 0, 10, 10, 0.99, "red")], "dog": [det(50, 50, 70, 70, 0.9, "brown")]}
    result = score(objects, metadata)
    assert not result.geneval and not result.strict and result.partial == pytest.approx(3 / 4)
    objects["dog"].append(det(20, 20, 30, 30, 0.95, "black"))  # the more confident dog is black
    result = score(objects, metadata)
    assert result.geneval and not result.strict  # two dogs: not exactly one
    assert result.partial == pytest.approx((1 + 1 + 0 + 0) / 4)


def test_position_against_the_target_clause():
    metadata = meta("position", [{"class": "laptop", "count": 1},
                                 {"class": "cow", "count": 1, "position": ["right of", 0]}])
    laptop, cow_right, cow_left = det(0, 40, 20, 60), det(60, 40, 80, 60), det(0, 0, 10, 10, 0.5)
    result = score({"laptop": [laptop], "cow": [cow_right]}, metadata)
    assert result.geneval and result.strict and result.partial == 1.0
    result = score({"laptop": [laptop], "cow": [cow_left]}, metadata)
    assert not result.geneval and result.partial == pytest.approx(2 / 3)
    result = score({"cow": [cow_right]}, metadata)  # no target: the position cannot hold
    assert not result.geneval and result.partial == pytest.approx(1 / 3)
    assert any("no target" in r for r in result.reasons)


def test_exclude_of_another_class_is_a_condition():
    metadata = meta("single_object", [{"class": "cup", "count": 1}], [{"class": "dog", "count": 1}])
    result = score({"cup": [det(0, 0, 10, 10)], "dog": [det(30, 30, 40, 40)]}, metadata)
    assert (result.geneval, result.strict, result.partial) == (False, False, 0.5)


def test_rules_config_errors():
    with pytest.raises(ValueError, match=r"reward_fn\.kwargs\.threshold must be a finite number in \[0, 1\], got 1\.5"):
        GenevalRules(threshold=1.5)
    with pytest.raises(ValueError, match="max_objects"):
        GenevalRules(max_objects=0)


# ---- the reward with injected models ----------------------------------------------------------

PROMPTS = {
    "a photo of a cup": meta("single_object", [{"class": "cup", "count": 1}], prompt="a photo of a cup"),
    "a photo of two dogs": meta("counting", [{"class": "dog", "count": 2}], [{"class": "dog", "count": 3}],
                                prompt="a photo of two dogs"),
    "a photo of a red cup": meta("colors", [{"class": "cup", "count": 1, "color": "red"}],
                                 prompt="a photo of a red cup"),
}


def _fake_detector(images, cutoffs):
    """One cup (score 0.95) and two dogs (0.95, 0.5) in every image, regardless of the pixels."""
    return [{"cup": [det(0, 0, 10, 10)], "dog": [det(20, 0, 30, 10), det(40, 0, 50, 10, 0.5)]} for _ in images]


def test_reward_modes_and_metadata_lookup(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in PROMPTS.values()), encoding="utf-8")
    images = np.zeros((3, 16, 16, 3), np.uint8)
    prompts = list(PROMPTS)
    out = {}
    for mode in ("partial", "strict", "geneval"):
        reward = GenevalReward(metadata_file=str(path), mode=mode, detector=_fake_detector,
                               color_model=lambda image, name, dets: ["red"] * len(dets))
        out[mode] = reward(images, prompts)
        np.testing.assert_array_equal(out[mode].rewards, out[mode].info[mode])
    # two dogs: the second (0.5) passes 0.3 but not the counting threshold 0.9
    np.testing.assert_array_equal(out["geneval"].rewards, [1.0, 0.0, 1.0])
    np.testing.assert_allclose(out["partial"].rewards, [1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="no GenEval metadata for prompt 'a cat'"):
        reward(images[:1], ["a cat"])
    with pytest.raises(ValueError, match="metadata_file"):
        GenevalReward(detector=_fake_detector, color_model=lambda *a: [])
    with pytest.raises(ValueError, match="reward_fn.kwargs.mode must be one of .*, got 'mix'"):
        GenevalReward(metadata=PROMPTS, mode="mix", detector=_fake_detector, color_model=lambda *a: [])
    with pytest.raises(ValueError, match="describes another prompt"):
        GenevalReward(metadata={"x": PROMPTS["a photo of a cup"]}, detector=_fake_detector, color_model=lambda *a: [])


def test_object_crop_masks_and_clamps():
    image = np.full((8, 8, 3), 200, np.uint8)
    mask = np.zeros((8, 8), bool)
    mask[2:4, 2:4] = True
    crop = object_crop(image, Detection((1, 1, 5, 5), 0.9, mask))
    assert crop.shape == (4, 4, 3) and (crop[1, 1] == 200).all() and (crop[0, 0] == 153).all()
    assert object_crop(image, Detection((7.6, 7.6, 7.6, 7.6), 0.9)).shape == (1, 1, 3)


def test_label_aliases():
    names = geneval_label_names({0: "motorbike", 1: "mouse", 2: "wall-other-merged", 3: "Dining_Table"})
    assert names == {0: "motorcycle", 1: "computer mouse", 3: "dining table"}


# ---- end to end on tiny random models ---------------------------------------------------------

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from reward_model_helpers import save_tiny_clip, save_tiny_mask2former

    root = tmp_path_factory.mktemp("geneval_models")
    metadata = root / "metadata.jsonl"
    metadata.write_text("".join(json.dumps(m) + "\n" for m in PROMPTS.values()), encoding="utf-8")
    return {"detector": str(save_tiny_mask2former(root / "m2f", favourite="cup")),
            "clip": str(save_tiny_clip(root / "clip")), "metadata": str(metadata), "root": root}


def test_end_to_end_on_tiny_models(model_dirs):
    reward = build_reward("geneval", detector_path=model_dirs["detector"], clip_path=model_dirs["clip"],
                          metadata_file=[model_dirs["metadata"]], device="cpu", batch_size=2)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 48, 40, 3), dtype=np.uint8)
    prompts = list(PROMPTS)
    first = reward(images, prompts)
    second = reward(images, prompts)
    assert first.rewards.shape == (3,) and set(first.info) == {"strict", "partial", "geneval"}
    for key, value in first.info.items():
        assert ((value >= 0) & (value <= 1)).all(), key
        np.testing.assert_array_equal(value, second.info[key])
    # every query says "cup" with probability ~1: at least one cup, no dogs
    assert first.info["geneval"][0] == 1.0 and first.info["geneval"][1] == 0.0
    assert first.info["geneval"][2] in (0.0, 1.0)  # decided by the random CLIP's colour
    detections = reward._detector(images[:1], [0.3])[0]
    assert set(detections) == {"cup"} and len(detections["cup"]) <= 10
    cup = detections["cup"][0]
    assert cup.mask.shape == (48, 40) and 0 <= cup.box[0] < cup.box[2] <= 40 and 0.3 < cup.score <= 1


def test_low_thresholds_exercise_every_class(model_dirs):
    reward = GenevalReward(detector_path=model_dirs["detector"], clip_path=model_dirs["clip"],
                           metadata_file=model_dirs["metadata"], device="cpu", threshold=0.0,
                           counting_threshold=0.0, mode="strict")
    images = np.random.default_rng(1).integers(0, 256, size=(2, 64, 64, 3), dtype=np.uint8)
    out = reward(images, ["a photo of a red cup", "a photo of two dogs"])
    assert set(np.unique(out.rewards)) <= {0.0, 1.0}


def test_directory_errors(model_dirs, tmp_path):
    from reward_model_helpers import save_tiny_mask2former

    common = {"metadata_file": model_dirs["metadata"], "device": "cpu"}
    with pytest.raises(ValueError, match="reward_fn.kwargs.detector_path=.*no such directory"):
        GenevalReward(detector_path=str(tmp_path / "none"), clip_path=model_dirs["clip"], **common)
    with pytest.raises(ValueError, match="reward_fn.kwargs.detector_path must name"):
        GenevalReward(clip_path=model_dirs["clip"], **common)
    with pytest.raises(ValueError, match="reward_fn.kwargs.clip_path=.*no such directory"):
        GenevalReward(detector_path=model_dirs["detector"], clip_path=str(tmp_path / "none"), **common)
    with pytest.raises(ValueError, match="detector_path=.*found model_type 'clip'.*expected mask2former"):
        GenevalReward(detector_path=model_dirs["clip"], clip_path=model_dirs["clip"], **common)
    with pytest.raises(ValueError, match="clip_path=.*found model_type 'mask2former'"):
        GenevalReward(detector_path=model_dirs["detector"], clip_path=model_dirs["detector"], **common)
    ade = save_tiny_mask2former(tmp_path / "ade", labels=["wall", "floor", "cup"])
    with pytest.raises(ValueError, match="does not report GenEval classes .*'airplane'"):
        GenevalReward(detector_path=str(ade), clip_path=model_dirs["clip"], **common)


def test_registered_as_a_builtin(monkeypatch):
    from roll_spotlight import plugins
    from roll_spotlight.rewards import known_rewards, resolve_reward

    monkeypatch.setattr(plugins, "_entry_points", lambda group: {})
    assert resolve_reward("geneval") is GenevalReward and "geneval" in known_rewards()


def test_scipy_is_checked_at_start_up(model_dirs, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real(name, *a))
    with pytest.raises(ImportError, match=r"roll_spotlight\[geneval\]"):
        GenevalReward(detector_path=model_dirs["detector"], clip_path=model_dirs["clip"],
                      metadata_file=model_dirs["metadata"], device="cpu")
