import itertools

import numpy as np
import pytest

from roll_spotlight.exploration import (
    SELECTORS,
    get_selector,
    max_variance,
    select_best_worst_halves,
    select_max_variance,
    select_random,
    select_top,
)
from roll_spotlight.exploration.select import extreme_subset_variances


def brute_force_max_variance(values, k):
    return max(float(np.var(values[list(c)])) for c in itertools.combinations(range(len(values)), k))


def _random_cases(count):
    rng = np.random.default_rng(1234)
    for case in range(count):
        n = int(rng.integers(1, 9))
        kind = case % 3
        if kind == 0:
            values = rng.random(n)
        elif kind == 1:
            values = rng.integers(0, 3, n).astype(float)  # many ties
        else:
            values = rng.integers(0, 2, n).astype(float)  # binary rewards
        for k in range(1, n + 1):
            yield values, k


def test_matches_brute_force_on_many_small_arrays():
    checked = 0
    for values, k in _random_cases(160):
        chosen = select_max_variance(values, k)
        assert chosen.shape == (k,)
        assert len(set(chosen.tolist())) == k
        assert np.all(np.diff(chosen) > 0), "indices are returned sorted ascending"
        assert np.var(values[chosen]) == pytest.approx(brute_force_max_variance(values, k), abs=1e-12)
        assert max_variance(values, k) == pytest.approx(np.var(values[chosen]), abs=1e-12)
        checked += 1
    assert checked > 250


def test_extreme_candidates_batch_matches_single_rows():
    rng = np.random.default_rng(5)
    rows = np.sort(rng.random((6, 10)), axis=1)
    batched = extreme_subset_variances(rows, 4)
    assert batched.shape == (6, 5)
    for row, expected in zip(rows, batched):
        np.testing.assert_allclose(extreme_subset_variances(row, 4), expected)
        for j in range(5):
            subset = np.r_[row[: 4 - j], row[10 - j:]]
            assert expected[j] == pytest.approx(np.var(subset), abs=1e-12)


def test_k_equals_n_returns_everything():
    assert select_max_variance([0.3, 0.1, 0.2], 3).tolist() == [0, 1, 2]


def test_k_one_picks_lowest_index_of_the_minimum():
    assert select_max_variance([0.5, 0.2, 0.9, 0.2], 1).tolist() == [1]


def test_all_equal_rewards_pick_the_first_k():
    assert select_max_variance([1.0] * 6, 4).tolist() == [0, 1, 2, 3]


def test_equal_variance_candidates_prefer_smallest_j_and_lowest_indices():
    # j=1 -> {0, 0, 1} and j=2 -> {0, 1, 1} have equal variance: smallest j (more low values) wins,
    # and the lowest-index copies of each value are used.
    assert select_max_variance([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], 3).tolist() == [0, 1, 3]
    # Top values tied: lowest indices among the tied maxima.
    assert select_max_variance([1.0, 1.0, 0.0, 1.0], 2).tolist() == [0, 2]


def test_ties_are_deterministic_across_calls_and_input_types():
    values = [0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0]
    first = select_max_variance(values, 4)
    assert select_max_variance(np.array(values), 4).tolist() == first.tolist()
    assert select_max_variance(tuple(values), 4).tolist() == first.tolist()


def test_large_offsets_do_not_change_the_choice():
    rng = np.random.default_rng(9)
    values = rng.random(12)
    assert select_max_variance(values + 1e6, 5).tolist() == select_max_variance(values, 5).tolist()


@pytest.mark.parametrize("k", [0, 4, -1])
def test_invalid_k_names_k_and_n(k):
    with pytest.raises(ValueError, match=rf"k={k}, n=3"):
        select_max_variance([0.1, 0.2, 0.3], k)


def test_non_finite_and_non_1d_inputs_are_rejected():
    with pytest.raises(ValueError, match="finite"):
        select_max_variance([0.1, float("nan")], 1)
    with pytest.raises(ValueError, match="1-D"):
        select_max_variance([[0.1, 0.2]], 1)


def test_baseline_selectors():
    values = np.array([0.1, 0.9, 0.5, 0.3, 0.7, 0.2])
    assert select_top(values, 2).tolist() == [1, 4]
    halves = select_best_worst_halves(values, 4)
    assert sorted(values[halves].tolist()) == [0.1, 0.2, 0.7, 0.9]
    rand = select_random(values, 3, seed=7)
    assert rand.tolist() == select_random(values, 3, seed=7).tolist()
    assert len(set(rand.tolist())) == 3
    draws = {tuple(select_random(values, 3, seed=s).tolist()) for s in range(20)}
    assert len(draws) > 1


def test_selector_registry():
    assert set(SELECTORS) == {"max_variance", "best_worst_halves", "top_bottom", "random", "top", "pps"}
    values = [0.0, 1.0, 0.4, 0.6]
    assert get_selector("max_variance")(values, 2, 0).tolist() == select_max_variance(values, 2).tolist()
    # Sol-RL's top-k/2 + bottom-k/2 (exploration.selection: top_bottom): 0.0 and 0.4 below, 0.6 and 1.0 above
    assert get_selector("top_bottom")(values, 4, 0).tolist() == [0, 1, 2, 3]
    assert get_selector("top_bottom")([0.5, 0.1, 0.9, 0.2, 0.8, 0.3], 4, 0).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="known selectors"):
        get_selector("nope")
