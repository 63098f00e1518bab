"""Data-parallel trainer in the ROLL host (tier 4, `-m roll`): the CPU recipe with a trainer cluster
of two ROLL workers (gloo at ROLL's master address), each training its shard of every batch, gives
the one-rank in-process loop's curve, and the two replicas hold the same weights afterwards."""
from __future__ import annotations

import json

import pytest

from tests.test_roll_pipeline import _run_like_the_reference, local_ray, workdir  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.roll, pytest.mark.ray, pytest.mark.slow]


def _digest_pipeline_cls(seen: dict):
    """SpotlightPipeline that records its trainer cluster's size and each rank's weight hash after run()."""
    from roll_spotlight.roll import SpotlightPipeline

    class Digests(SpotlightPipeline):
        def run(self):
            result = super().run()
            seen["world_size"] = self.actor_train.world_size
            seen["digests"] = self.actor_train.weights_digest()
            return result

    return Digests


def test_two_trainer_ranks_train_like_one(workdir, local_ray):  # noqa: F811 (fixtures)
    seen: dict = {}
    rows = _run_like_the_reference(workdir, "dp2", _digest_pipeline_cls(seen), "actor_train.world_size=2",
                                   "dispatch.mode=static", "spot.enabled=false", "exploration.mode=off",
                                   "reward_fn.name=brightness", "~reward_fn.kwargs")  # continuous: no zero-std group
    assert seen["world_size"] == 2
    assert len(seen["digests"]) == 2 and len(set(seen["digests"])) == 1  # replicas agree bit for bit
    reference = [json.loads(line) for line in (workdir / "dp2-reference" / "metrics.jsonl").read_text().splitlines()]
    for got, want in zip(rows[1:], reference[1:]):
        assert got["trained_samples"] == want["trained_samples"] == 8  # both groups trained
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        # the loss is ~0, a float32 sum of O(1) terms +-advantage x ratio: equal up to their rounding
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
