import numpy as np
import pytest

from roll_spotlight.exploration.prior import DonorPool, PopulationPrior, PriorConfig, is_continuous
from roll_spotlight.exploration.value import shrunk_predictive_draws


def prior_with(donors, **overrides):
    prior = PopulationPrior(PriorConfig(**overrides), capacity=2)  # small capacity: exercises growth
    for row, rewards in enumerate(donors):
        prior.set_rewards(row, np.asarray(rewards, dtype=float))
    return prior


BINARY = [[0, 1, 1, 0, 1, 0], [1, 1, 0, 1, 1, 1, 1, 0]]
CONTINUOUS = [[0.42, 0.48, 0.5, 0.55, 0.61], [0.3, 0.35, 0.4, 0.45], [0.6, 0.66, 0.7, 0.72, 0.75]]


def test_binary_prompt_borrows_from_binary_donors_only():
    prior = prior_with(BINARY + CONTINUOUS, floor=0.01)
    weights = prior.donor_weights(prior.bin_counts(np.array([0.0, 1.0, 1.0, 0.0, 1.0])), exclude=None)
    assert weights[:2].sum() > 0.999
    rng = np.random.default_rng(0)
    draws = prior.draw(weights, rng.random(4000), rng.random(4000))
    own_draws = np.isin(draws, [0.0, 1.0]).mean()
    assert own_draws > 0.8, "binary donors produce 0/1; only their shrinkage to the pool adds other values"
    assert set(np.unique(draws)) <= set(np.concatenate([np.ravel(d) for d in map(np.asarray, BINARY + CONTINUOUS)]))


def test_continuous_prompt_prefers_the_donor_at_its_location():
    prior = prior_with(BINARY + CONTINUOUS)
    weights = prior.donor_weights(prior.bin_counts(np.array([0.32, 0.37, 0.41])), exclude=None)
    assert int(np.argmax(weights)) == 3
    assert weights.sum() == pytest.approx(1.0)


def test_a_prompt_is_never_its_own_donor_and_no_donor_gives_none():
    prior = prior_with([[0.1, 0.9, 0.5]])
    assert prior.donor_weights(prior.bin_counts(np.array([0.1, 0.9])), exclude=0) is None
    prior.set_rewards(1, np.array([0.2, 0.3]))
    weights = prior.donor_weights(prior.bin_counts(np.array([0.1, 0.9])), exclude=0)
    assert weights.tolist() == [0.0, 1.0]
    assert prior.donors == 2


def test_range_grows_to_cover_new_rewards_and_rebins_every_donor():
    prior = prior_with([[0.4, 0.5]], bins=8)
    prior.set_rewards(1, np.array([-3.0, 7.0]))
    counts = prior.bin_counts(np.array([-3.0, 0.45, 7.0]))
    assert counts[0] == 1 and counts[-1] == 1 and counts.sum() == 3
    densities = prior._densities()
    assert densities.shape == (2, 8)
    assert np.allclose(densities.mean(axis=1), 1.0), "every donor row is a normalised density"


def test_replacing_a_donor_row_keeps_the_pool_consistent():
    prior = prior_with([[0.1, 0.2], [0.8, 0.9]])
    prior.set_rewards(0, np.array([0.1, 0.2, 0.3, 0.35]))
    assert prior._pool_smoothed.sum() == pytest.approx(6.0)
    rng = np.random.default_rng(1)
    weights = np.array([0.0, 1.0])
    draws = prior.draw(weights, rng.random(2000), rng.random(2000))
    assert set(np.unique(draws)) <= {0.1, 0.2, 0.3, 0.35, 0.8, 0.9}
    assert np.isin(draws, [0.8, 0.9]).mean() > 0.45  # n=2 own draws with donor_strength 2: about half + pool share


def test_shrunk_predictive_mixes_own_and_prior_draws_by_sample_count():
    rng = np.random.default_rng(2)
    u_mix, u_pick = rng.random((2, 400, 5))
    prior_draws = np.full((400, 5), -1.0)
    assert np.array_equal(shrunk_predictive_draws(np.empty(0), prior_draws, 1.0, u_mix, u_pick), prior_draws)
    few = shrunk_predictive_draws(np.array([0.5]), prior_draws, 1.0, u_mix, u_pick)
    many = shrunk_predictive_draws(np.full(19, 0.5), prior_draws, 1.0, u_mix, u_pick)
    assert set(np.unique(few)) == {-1.0, 0.5} and set(np.unique(many)) == {-1.0, 0.5}
    assert (few == -1.0).mean() == pytest.approx(0.5, abs=0.05)
    assert (many == -1.0).mean() == pytest.approx(0.05, abs=0.02)


def donor_pool_with(donors, **kwargs):
    pool = DonorPool(**kwargs)
    for row, rewards in enumerate(donors):
        for reward in rewards:
            pool.append(row, float(reward))
    return pool


def test_donor_pool_draws_one_donor_per_monte_carlo_row():
    pool = donor_pool_with([[0.0] * 4, [1.0] * 4, [0.25, 0.75]])
    rng = np.random.default_rng(3)
    draws = pool.draw(rng.random(600), rng.random((600, 6)))
    assert draws.shape == (600, 6)
    constant_rows = np.isin(draws, [0.0]).all(axis=1) | np.isin(draws, [1.0]).all(axis=1)
    mixed_rows = np.isin(draws, [0.25, 0.75]).all(axis=1)
    assert (constant_rows | mixed_rows).all(), "a row never mixes two donors' rewards"
    for share in (np.isin(draws[:, 0], [0.0]).mean(), np.isin(draws[:, 0], [1.0]).mean(), mixed_rows.mean()):
        assert share == pytest.approx(1 / 3, abs=0.07), "donors are uniform over prompts, not over rewards"


def test_donor_pool_excludes_the_prompt_itself_and_grows():
    pool = donor_pool_with([[0.5, 0.6], [0.1] * 20], capacity=1, width=2)  # small: exercises growth
    assert pool.rows == 2
    rng = np.random.default_rng(4)
    u_row, u_value = rng.random(50), rng.random((50, 3))
    assert np.array_equal(pool.draw(u_row, u_value, exclude=0), np.full((50, 3), 0.1))
    assert set(np.unique(pool.draw(u_row, u_value, exclude=1))) <= {0.5, 0.6}
    assert donor_pool_with([[0.3]]).draw(u_row, u_value, exclude=0) is None
    assert DonorPool().draw(u_row, u_value) is None


def test_is_continuous_needs_three_distinct_values():
    assert is_continuous([0.1, 0.2, 0.3])
    assert not is_continuous([0.0, 1.0, 1.0, 0.0, 1.0])
    assert not is_continuous([0.5, 0.5, 0.5])
    assert not is_continuous([0.1, 0.2])


def test_donor_pool_restricts_donors_to_the_prompts_kind():
    # rows 0-1 two-valued, row 2 continuous (its kind is known from its third distinct value on), row 3 own
    pool = donor_pool_with([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.3, 0.4, 0.5, 0.6], [0.2, 0.25, 0.3]])
    assert list(pool.kinds(4)) == [False, False, True, True]
    rng = np.random.default_rng(5)
    u_row, u_value = rng.random(400), rng.random((400, 4))
    continuous = pool.draw(u_row, u_value, exclude=3, continuous=True)
    assert set(np.unique(continuous)) <= {0.3, 0.4, 0.5, 0.6}, "a continuous prompt never borrows 0s and 1s"
    discrete = pool.draw(u_row, u_value, exclude=3, continuous=False)
    assert set(np.unique(discrete)) <= {0.0, 1.0} and len(np.unique(discrete)) == 2
    anything = pool.draw(u_row, u_value, exclude=3)
    assert {0.0, 1.0, 0.3} <= set(np.unique(anything)), "no kind: every donor, as before"
    # no donor of that kind (the only continuous row is the prompt itself): every other donor instead
    lone = donor_pool_with([[0.0, 1.0, 1.0, 0.0], [0.2, 0.25, 0.3]])
    assert set(np.unique(lone.draw(u_row, u_value, exclude=1, continuous=True))) == {0.0, 1.0}
