"""Tier 1 tests of the shapes world: grammar, renderer, detector."""
import numpy as np
import pytest

from roll_spotlight.tasks.shapes import (
    COLORS,
    MAX_PROMPT_WORDS,
    TAGS,
    VOCAB,
    ObjectSpec,
    SceneSpec,
    detect,
    enumerate_specs,
    format_prompt,
    layout,
    make_prompt_set,
    parse_prompt,
    render,
    score,
    shape_mask,
    text_overlap,
    tokenize,
)
from roll_spotlight.tasks.shapes.detect import label_components
from roll_spotlight.tasks.shapes.render import RELATION_MARGIN, relation_holds

EXAMPLES = {
    "a circle": "single_object",
    "a yellow square": "colors",
    "three green triangles": "counting",
    "a red circle and a red square": "two_object",
    "a red circle and a blue circle": "two_object",
    "a red circle and a green square": "color_attr",
    "a red circle left of a blue square": "position",
    "a blue triangle below a blue square": "position",
}


# ---- grammar ---------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", TAGS)
def test_parse_format_round_trip_every_spec_of_tag(tag):
    specs = enumerate_specs(tag)
    assert len(specs) > 0
    for spec in specs:
        text = format_prompt(spec)
        assert parse_prompt(text) == spec
        assert format_prompt(parse_prompt(text)) == text
        assert spec.tag == tag


@pytest.mark.parametrize("text,tag", EXAMPLES.items())
def test_examples_parse_to_their_tag(text, tag):
    assert parse_prompt(text).tag == tag
    assert parse_prompt(text.upper() + "  ").tag == tag  # case and surrounding space are ignored


def test_prompt_space_sizes():
    sizes = {tag: len(enumerate_specs(tag)) for tag in TAGS}
    assert sizes == {"single_object": 3, "colors": 12, "counting": 36, "two_object": 60,
                     "color_attr": 72, "position": 528}
    texts = [format_prompt(s) for tag in TAGS for s in enumerate_specs(tag)]
    assert len(set(texts)) == len(texts)  # tags never share a text


@pytest.mark.parametrize("text,word", [
    ("a purple circle", "purple"),
    ("a red hexagon", "hexagon"),
    ("seven red circles", "seven"),
    ("a red circle near a blue square", "near"),
    ("a red circle left a blue square", "a"),
    ("a red circle and a blue square please", "please"),
    ("two red circle", "circle"),
])
def test_unknown_word_error_names_prompt_and_word(text, word):
    with pytest.raises(ValueError) as info:
        parse_prompt(text)
    assert repr(text) in str(info.value) and repr(word) in str(info.value)


@pytest.mark.parametrize("text", ["", "a red", "a red circle left", "three triangles",
                                  "a red circle and a red circle", "a circle and a square"])
def test_out_of_grammar_structure_error_names_prompt(text):
    with pytest.raises(ValueError, match="prompt"):
        parse_prompt(text)
    with pytest.raises(ValueError) as info:
        parse_prompt(text)
    assert repr(text) in str(info.value)


def test_spec_validation_names_key_and_value():
    with pytest.raises(ValueError, match="ObjectSpec.count=5"):
        ObjectSpec("circle", "red", 5)
    with pytest.raises(ValueError, match="ObjectSpec.color='pink'"):
        ObjectSpec("circle", "pink")
    with pytest.raises(ValueError, match="SceneSpec.tag='colors'"):
        SceneSpec((ObjectSpec("circle", "red"), ObjectSpec("square", "blue")), None, "colors")


def test_vocab_covers_every_prompt_and_tokenize():
    for tag in TAGS:
        for spec in enumerate_specs(tag):
            ids = tokenize(format_prompt(spec))
            assert 1 <= len(ids) <= MAX_PROMPT_WORDS
            assert " ".join(VOCAB[i] for i in ids) == format_prompt(spec)
    assert len(set(VOCAB)) == len(VOCAB)
    with pytest.raises(ValueError, match="purple"):
        tokenize("a purple circle")


def test_prompt_sets_deterministic_balanced_and_split_dependent():
    a = make_prompt_set("train", 60, seed=3)
    assert a == make_prompt_set("train", 60, seed=3)
    assert [p.text for p in a] != [p.text for p in make_prompt_set("train", 60, seed=4)]
    assert [p.text for p in a] != [p.text for p in make_prompt_set("val", 60, seed=3)]
    assert all(sum(p.tag == t for p in a) == 10 for t in TAGS)
    assert all(parse_prompt(p.text) == p.spec and p.spec.tag == p.tag for p in a)
    only = make_prompt_set("val", 12, seed=0, tags=["position", "counting"])
    assert {p.tag for p in only} == {"position", "counting"}
    overlap = text_overlap(make_prompt_set("train", 600, seed=0), make_prompt_set("val", 120, seed=0))
    assert 0.0 < overlap < 1.0  # documented: the splits overlap in text, but not entirely


@pytest.mark.parametrize("kwargs", [dict(split="dev", n=4, seed=0), dict(split="train", n=-1, seed=0),
                                    dict(split="train", n=4, seed=0, tags=["bogus"])])
def test_prompt_set_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        make_prompt_set(**kwargs)


# ---- renderer --------------------------------------------------------------------------------

def test_render_is_deterministic_by_seed():
    spec = parse_prompt("four yellow triangles")
    a, b = render(spec, seed=11), render(spec, seed=11)
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, render(spec, seed=12))
    assert render(spec, seed=11, size=64).shape == (64, 64, 3)


def test_render_uses_only_palette_and_background():
    allowed = {(0, 0, 0), *COLORS.values()}
    for i, p in enumerate(make_prompt_set("train", 30, seed=1)):
        pixels = {tuple(px) for px in render(p.spec, seed=i).reshape(-1, 3)}
        assert pixels <= allowed


@pytest.mark.parametrize("shape", ["circle", "square", "triangle"])
def test_shape_masks_fill_their_box_edge_to_edge(shape):
    for side in range(5, 25):
        mask = shape_mask(shape, side, side)
        assert mask[0].any() and mask[-1].any() and mask[:, 0].any() and mask[:, -1].any()


def test_layout_respects_relation_margin_and_gaps():
    for i, p in enumerate(make_prompt_set("train", 60, seed=5, tags=["position"])):
        a, b = (box.centroid() for box in layout(p.spec, seed=i))
        assert relation_holds(a, b, p.spec.relation, RELATION_MARGIN * 32)
    for i, p in enumerate(make_prompt_set("train", 30, seed=6, tags=["counting"])):
        assert len(detect(render(p.spec, seed=i))) == p.spec.objects[0].count


@pytest.mark.parametrize("tag", TAGS)
def test_slot_layout_is_legible_and_keeps_objects_apart(tag):
    from roll_spotlight.tasks.shapes.render import _fits

    for i, p in enumerate(make_prompt_set("train", 40, seed=8, tags=[tag])):
        boxes = layout(p.spec, seed=i, style="slots")
        assert len(boxes) == sum(o.count for o in p.spec.objects)
        assert all(_fits(box, boxes[:k], gap=2) for k, box in enumerate(boxes))
        assert all(1 <= b.top and b.top + b.side <= 31 and 1 <= b.left and b.left + b.side <= 31 for b in boxes)
        assert score(render(p.spec, seed=i, style="slots"), p.spec).strict == 1.0
        assert score(render(p.spec, seed=i, size=64, style="slots"), p.spec).strict == 1.0


def test_slot_layout_follows_the_relation_and_varies_with_the_seed():
    spec = parse_prompt("a red circle above a blue square")
    for seed in range(20):
        a, b = (box.centroid() for box in layout(spec, seed=seed, style="slots"))
        assert b[0] - a[0] > RELATION_MARGIN * 32 and abs(a[1] - b[1]) <= 4
    pair = parse_prompt("two green triangles")
    axes = {layout(pair, seed=s, style="slots")[0].top == layout(pair, seed=s, style="slots")[1].top
            for s in range(20)}
    assert axes == {True, False}  # side by side for some seeds, stacked for others
    singles = {layout(parse_prompt("a square"), seed=s, style="slots")[0] for s in range(20)}
    assert len(singles) > 5       # jitter, size and the free colour differ between seeds
    assert np.array_equal(render(spec, 3, style="slots"), render(spec, 3, style="slots"))


def test_layout_rejects_an_unknown_style():
    with pytest.raises(ValueError, match="style"):
        layout(parse_prompt("a square"), seed=0, style="grid")


# ---- detector --------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", TAGS)
def test_detector_strict_accuracy_on_own_renders(tag):
    prompts = make_prompt_set("val", 50, seed=7, tags=[tag])
    strict = [score(render(p.spec, seed=i), p.spec).strict for i, p in enumerate(prompts)]
    big = [score(render(p.spec, seed=i, size=64), p.spec).strict for i, p in enumerate(prompts[:10])]
    assert np.mean(strict) >= 0.98
    assert np.mean(big) >= 0.98


def test_correct_render_scores_full_and_other_specs_score_lower():
    spec = parse_prompt("a red circle left of a blue square")
    image = render(spec, seed=0)
    right = score(image, spec)
    assert right.strict == 1.0 and right.partial == 1.0
    for other in ["a blue square left of a red circle", "a red triangle left of a blue square",
                  "three green triangles", "a red circle and a blue triangle", "a yellow square"]:
        wrong = score(image, parse_prompt(other))
        assert wrong.strict == 0.0 and wrong.partial < right.partial, other


def test_partial_credit_grows_with_correctness():
    spec = parse_prompt("three green triangles")
    nearly = score(render(parse_prompt("two green triangles"), seed=1), spec)
    wrong_shape = score(render(parse_prompt("three green squares"), seed=1), spec)
    blank = score(np.zeros((32, 32, 3), np.uint8), spec)
    assert blank.partial < wrong_shape.partial < nearly.partial < 1.0
    assert nearly.details["objects"][0]["found"] == 2


def test_extra_objects_of_mentioned_colours_fail_strict_only():
    spec = parse_prompt("a red circle")
    image = render(spec, seed=3)
    corners = [(1, 1), (1, 21), (21, 1), (21, 21)]
    spare = next((y, x) for y, x in corners if not image[y:y + 9, x:x + 9].any())
    extra_red, extra_blue = image.copy(), image.copy()
    extra_red[spare[0]:spare[0] + 8, spare[1]:spare[1] + 8] = COLORS["red"]
    extra_blue[spare[0]:spare[0] + 8, spare[1]:spare[1] + 8] = COLORS["blue"]
    assert score(extra_red, spec).strict == 0.0 and score(extra_red, spec).details["extras"] == 1
    assert score(extra_blue, spec).strict == 1.0  # unmentioned colours are ignored, as in GenEval


def test_detector_tolerates_speckle_and_washed_out_colours():
    rng = np.random.default_rng(0)
    for i, p in enumerate(make_prompt_set("val", 30, seed=8)):
        image = render(p.spec, seed=i).astype(float) * 0.75 + rng.normal(0, 12, (32, 32, 3))
        image = np.clip(image, 0, 255).astype(np.uint8)
        y, x = rng.integers(0, 30, size=2)
        if not image[y:y + 2, x:x + 2].any(axis=-1).any():
            image[y:y + 2, x:x + 2] = COLORS["red"]  # a 4-pixel speckle is below the component size
        assert score(image, p.spec).strict == 1.0, p.text


def test_detect_rejects_non_uint8_images():
    with pytest.raises(ValueError, match="uint8"):
        detect(np.zeros((32, 32, 3), np.float32))


def test_label_components_matches_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    rng = np.random.default_rng(1)
    for _ in range(20):
        classes = rng.integers(-1, 3, size=(24, 20)) * (rng.random((24, 20)) < 0.6) - (rng.random((24, 20)) >= 0.6)
        ours = label_components(classes)
        for cls in range(3):
            ref, n = ndimage.label(classes == cls, structure=np.ones((3, 3)))
            sel = classes == cls
            pairs = set(zip(ours[sel].tolist(), ref[sel].tolist()))
            assert len(pairs) == n == len({o for o, _ in pairs})  # same partition
        assert (ours[classes < 0] == -1).all()
