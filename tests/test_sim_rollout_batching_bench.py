"""benchmarks.sim_rollout_batching without the spot shapes: the JSON the docs and the report read."""
from __future__ import annotations

import json

import pytest

from benchmarks import sim_rollout_batching as module


def test_the_json_holds_the_fit_the_calibration_and_the_rollout_rows(tmp_path):
    out = tmp_path / "sim.json"
    assert module.main(["--skip-shapes", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["fit"]["ratios"]) == 8 and all(abs(r["error"]) <= 0.10 for r in data["fit"]["ratios"])
    lora, full = data["calibration"]["rows"]
    assert (lora["published_s"], full["published_s"]) == (420.0, 250.0) and lora["within_tolerance"]
    assert data["calibration"]["waterfall"][0]["simulated_s"] == pytest.approx(lora["simulated_s"])
    for res in ("512", "1280"):
        row = data["vanilla_rollout"][res]
        walls = row["wall_s"]
        assert row["rollout_speedup"] == pytest.approx(walls["batch 1"]["rollout"] / walls["batched"]["rollout"])
        assert walls["batched"]["train"] == pytest.approx(walls["batch 1"]["train"])   # only rollouts change
    assert data["vanilla_rollout"]["512"]["max_batch"] == 16 and data["shapes"] == []
    same = data["same_shape_as_verl_omni"]
    assert same["published_s"] == 420.0 and same["simulated_s"]["batched"] < same["simulated_s"]["batch 1"]
