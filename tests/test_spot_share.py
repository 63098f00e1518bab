"""`spot.training_phase: auto`: the split of spot workers between training and exploring follows the
two measured values (tier 1, pure). Each branch is driven with made-up measurements."""
from __future__ import annotations

import math

import pytest

from roll_spotlight.exploration.spot_share import SpotPlacement


def test_before_both_sides_are_measured_half_the_workers_explore_first():
    p = SpotPlacement(probe_every=5)
    assert p.explore_share(1) == 0.5 and "measuring training and exploration" in p.reason
    p.observe_training(1, saved_s=4.0, workers=2)
    assert p.explore_share(2) == 0.5 and "measuring exploration" in p.reason


def test_training_wins_when_it_saves_more_per_worker_than_exploration_is_worth():
    p = SpotPlacement(probe_every=5)
    p.observe_training(1, saved_s=6.0, workers=2)  # 3 s per worker
    # 10% of groups rescued from all-equal, 10% all-equal at random, a 40 s iteration, 1 explorer:
    # 0.1 / 0.9 x 40 = 4.4 s... per explorer: 4.4 > 3, so exploration would win; with 2 explorers 2.2 < 3
    p.observe_exploration(1, removed=0.1, equal_random=0.1, iteration_s=40.0, workers=2, buys=True)
    assert p.explore_share(2) == 0.0 and "every spot worker trains first" in p.reason
    assert p.metrics()["spot/train_value_s"] == 3.0
    assert p.metrics()["spot/explore_value_s"] == pytest.approx(0.1 / 0.9 * 40.0 / 2)


def test_exploration_wins_when_the_controller_says_it_rescues_more_than_training_saves():
    p = SpotPlacement(probe_every=5)
    p.observe_training(1, saved_s=1.0, workers=2)
    p.observe_exploration(1, removed=0.3, equal_random=0.3, iteration_s=40.0, workers=1, buys=True)
    assert p.explore_share(2) == 1.0 and "every spot worker explores first" in p.reason


def test_a_controller_that_says_exploration_buys_nothing_makes_it_worth_zero():
    p = SpotPlacement(probe_every=5)
    p.observe_training(1, saved_s=0.5, workers=2)
    p.observe_exploration(1, removed=0.3, equal_random=0.3, iteration_s=40.0, workers=1, buys=False)
    assert p.explore_share(2) == 0.0 and p.explore.per_worker_s == 0.0


def test_the_losing_side_is_probed_every_probe_every_iterations():
    p = SpotPlacement(probe_every=3)
    p.observe_training(1, saved_s=6.0, workers=2)
    p.observe_exploration(1, removed=0.0, equal_random=0.1, iteration_s=40.0, workers=1, buys=True)
    assert [p.explore_share(it) for it in (2, 3)] == [0.0, 0.0]
    for it in (2, 3):
        p.observe_training(it, saved_s=6.0, workers=2)
    assert p.explore_share(4) == 0.5 and "probing" in p.reason
    p.observe_exploration(4, removed=0.0, equal_random=0.1, iteration_s=40.0, workers=1, buys=True)
    assert p.explore_share(5) == 0.0


def test_rounds_without_explorers_or_measures_change_nothing_and_state_round_trips():
    p = SpotPlacement(probe_every=5)
    p.observe_exploration(1, removed=0.3, equal_random=0.3, iteration_s=40.0, workers=0, buys=True)
    p.observe_exploration(1, removed=math.nan, equal_random=0.3, iteration_s=40.0, workers=2, buys=True)
    p.observe_training(1, saved_s=5.0, workers=0)
    assert p.train is None and p.explore is None
    p.observe_training(2, saved_s=5.0, workers=1)
    p.explore_share(3)
    q = SpotPlacement(probe_every=5)
    q.load_state_dict(p.state_dict())
    assert q.state_dict() == p.state_dict()
    with pytest.raises(ValueError, match="probe_every"):
        SpotPlacement(probe_every=0)
