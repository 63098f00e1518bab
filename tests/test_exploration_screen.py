"""Prompt screening: the all-equal predictive, the history's decay, inclusion probabilities and the draw."""
import math

import numpy as np
import pytest

from roll_spotlight.exploration.screen import PromptHistory, all_equal_predictive, screen_draw
from roll_spotlight.exploration.select import inclusion_probabilities, pps_inclusion, select_pps, systematic_sample


def test_predictive_closed_forms():
    # unseen prompt, alpha 1: (k-1)! / k! = 1/k; after n all-pass rewards the pass term is n / (n + k)
    assert all_equal_predictive({}, 16) == pytest.approx(1 / 16)
    for n in (16, 48):
        tail = math.exp(math.lgamma(16) - math.lgamma(n + 17) + math.lgamma(n + 1))
        assert all_equal_predictive({1.0: n}, 16) == pytest.approx(n / (n + 16) + tail)
    assert all_equal_predictive({1.0: 8, 0.0: 8}, 16) < 1e-3  # a prompt that splits its groups
    assert all_equal_predictive({0.3: 1.0}, 1) == 1.0


def test_predictive_matches_polya_urn_simulation():
    """The formula is the urn's: draw k from counts {0: 3, 1: 1.5} plus alpha for a new value,
    each draw reinforcing its value (columns: the two seen values, the first new one)."""
    k, alpha, trials = 5, 0.7, 40_000
    rng = np.random.default_rng(0)
    c = np.tile([3.0, 1.5, 0.0], (trials, 1))
    first, same, rows = np.full(trials, -1), np.ones(trials, dtype=bool), np.arange(trials)
    for _ in range(k):
        w = np.concatenate([c, np.full((trials, 1), alpha)], axis=1)
        pick = (rng.random((trials, 1)) * w.sum(axis=1, keepdims=True) > np.cumsum(w, axis=1)).sum(axis=1)
        cat = np.where(pick == 3, np.where(c[:, 2] > 0, 3, 2), pick)  # 3: a second, different new value
        c[rows[cat < 3], cat[cat < 3]] += 1.0
        first = np.where(first < 0, cat, first)
        same &= cat == first
    p = all_equal_predictive({0.0: 3.0, 1.0: 1.5}, k, alpha)
    assert abs(same.mean() - p) < 4 * math.sqrt(p * (1 - p) / trials), (same.mean(), p)


def test_history_decays_and_round_trips():
    h = PromptHistory(decay=0.5)
    h.observe("a circle", [1.0] * 16)
    fresh = h.all_equal("a circle", 16)
    h.advance()
    assert h.counts["a circle"] == {1.0: 8.0}
    assert 1 / 16 < h.all_equal("a circle", 16) < fresh
    for _ in range(20):
        h.advance()
    assert "a circle" not in h.counts  # weights under the prune level are dropped
    h.observe(("p", 3), [0.5, 0.25])
    again = PromptHistory(decay=0.5)
    again.load_state_dict(h.state_dict())
    assert again.all_equal(("p", 3), 4) == h.all_equal(("p", 3), 4)


def test_inclusion_probabilities_cap_and_sum():
    pi = inclusion_probabilities([10.0, 1.0, 1.0, 1.0, 1.0], 2)
    assert pi.sum() == pytest.approx(2.0) and pi[0] == 1.0 and np.allclose(pi[1:], 0.25)
    assert np.allclose(inclusion_probabilities([1.0] * 4, 4), 1.0)


def test_systematic_sample_hits_its_inclusion_probabilities():
    pi = inclusion_probabilities([5.0, 3.0, 1.0, 1.0, 0.5, 0.5], 3)
    rng = np.random.default_rng(1)
    trials = 10_000
    freq = np.zeros(len(pi))
    for _ in range(trials):
        picked = systematic_sample(pi, rng)
        assert len(picked) == 3 and len(set(picked.tolist())) == 3
        freq[picked] += 1
    se = np.sqrt(pi * (1 - pi) / trials) + 1e-12
    assert np.all(np.abs(freq / trials - pi) <= 4 * se + 1e-12), (freq / trials, pi)


def test_pps_selection_prefers_far_rewards_and_never_starves():
    rewards = np.array([0.0] * 14 + [1.0, 1.0])
    pi = pps_inclusion(rewards, 8)
    assert pi.sum() == pytest.approx(8) and pi[-1] == 1.0 and np.all(pi > 0)
    assert np.allclose(pps_inclusion(np.ones(16), 8), 0.5)  # all equal: uniform
    assert select_pps(rewards, 8, 3).tolist() == select_pps(rewards, 8, 3).tolist()  # deterministic in the seed


def test_screen_draw_keeps_signal_and_reports_skips():
    predicted = np.array([0.95, 0.95, 0.02, 0.02, 0.02, 0.02, 0.95, 0.02])
    draw = screen_draw(predicted, 4, floor=0.1, rng=np.random.default_rng(0))
    assert len(draw.chosen) == 4
    assert draw.inclusion.min() >= 0.1 * 4 / 8 - 1e-12  # the floor: no prompt starves
    assert np.allclose(draw.weights, 4 / (8 * draw.inclusion))
    m = draw.metrics()
    assert m["screen/predicted_unscreened"] == pytest.approx(predicted[:4].mean())
    assert m["screen/predicted_batch"] <= m["screen/predicted_unscreened"]
    assert m["screen/skipped"] == pytest.approx(1 - np.isin(np.arange(4), draw.chosen).mean())
