"""Tier 1: the rollout time per forward against batch, fitted to published points, is the cost model's
(the fit: benchmarks.batching_fit)."""
import math

import pytest

from benchmarks import batching_fit as batching
from benchmarks.batching_fit import RATIO_TOLERANCE, VERL_OMNI_GEN, Curve, fit, fit_stack
from roll_spotlight.sim.costmodel import CONSTANTS, CostModel


@pytest.fixture(scope="module")
def fitted():
    return fit(CostModel())


def test_the_fitted_curve_reproduces_every_published_ratio(fitted):
    rows = fitted["ratios"]
    assert len(rows) == 8 and RATIO_TOLERANCE == 0.10
    for row in rows:
        assert abs(row["error"]) <= RATIO_TOLERANCE, row
    by_key = {(r["source"], r["resolution"], r["batch"]): r for r in rows}
    # the ratios issue 54 quotes: 2.77x at batch 4, 3.21x at 16 (512^2), about 1.02x at 1024^2 batch 2
    assert by_key[("SGLang H200", 512, 4)]["published"] == pytest.approx(2.78, abs=0.01)
    assert by_key[("SGLang H200", 512, 16)]["published"] == pytest.approx(3.21, abs=0.01)
    assert by_key[("SGLang H200", 1024, 2)]["published"] == pytest.approx(1.03, abs=0.01)
    verl = by_key[("verl-omni (generation phase)", 512, 32)]
    assert verl["published"] == pytest.approx(226.4 / 107.9) and verl["fitted"] == pytest.approx(verl["published"])


def test_the_cost_model_carries_the_fit(fitted):
    stack = fitted["verl_omni_h800"]
    assert CONSTANTS["batch_knee_p"].value == pytest.approx(fitted["knee_p"], rel=1e-3)
    assert CONSTANTS["rollout_floor_s"].value == pytest.approx(stack["floor_s"], rel=1e-3)
    assert CONSTANTS["rollout_mfu"].value == pytest.approx(stack["mfu"], rel=1e-3)
    for name in ("batch_knee_p", "rollout_floor_s", "rollout_mfu"):
        assert CONSTANTS[name].source.startswith("fitted"), name
    # the serial cost model generates the verl-omni recipe's images in the published serial time
    cost = CostModel().with_gpu("h800")
    serial = VERL_OMNI_GEN.images_per_gpu * cost.rollout_s(512, serial=True)
    assert serial == pytest.approx(VERL_OMNI_GEN.serial_s, rel=2e-3)


def test_batching_pays_at_512_and_not_at_1280_with_sp():
    cost = CostModel()
    per_image = {b: cost.step_s(512, batch=b) / b for b in (1, 2, 4, 16, 32)}
    serial = cost.step_s(512, serial=True)
    assert serial / per_image[16] >= 2.0                       # the rollout phase >= 2x at the recipe batch
    assert per_image[1] < serial                               # one image: both branches share the floor
    assert all(per_image[a] >= per_image[b] for a, b in ((1, 2), (2, 4), (4, 16), (16, 32)))
    assert per_image[16] == pytest.approx(per_image[32], rel=0.01)     # flat past the knee
    big_serial, big_batched = cost.step_s(1280, 4, serial=True), cost.step_s(1280, 4, batch=4) / 4
    assert 1.0 < big_serial / big_batched < 1.3                # one 1280^2 image nearly fills an SP group


def test_the_curve_is_the_floor_below_the_knee_and_the_rate_above():
    curve = Curve(floor_s=0.1, rate=1e15, p=4.0)
    assert curve.forward_s(1e12) == pytest.approx(0.1, rel=1e-6)
    assert curve.forward_s(1e16) == pytest.approx(10.0, rel=1e-6)
    assert curve.forward_s(1e14) == pytest.approx(0.1 * 2 ** 0.25)


def test_a_stack_whose_batched_time_beats_the_rows_has_no_floor():
    run = batching.GenerationRun("made up", "h100", 512, images_per_gpu=32, steps=1, cfg_forwards=1, batch=32,
                                 serial_s=32.0, batched_s=0.5)   # 32 rows in half the time of one
    with pytest.raises(ValueError, match="admit no floor"):
        fit_stack(run, 1e13, 4.0)
    assert not math.isnan(VERL_OMNI_GEN.batched_forward_s())
