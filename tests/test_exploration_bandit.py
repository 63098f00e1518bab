import dataclasses
import math

import numpy as np
import pytest

from roll_spotlight.exploration import (
    BanditPlanner,
    SeedCostModel,
    ExplorationBudget,
    OraclePlanner,
    PlannerConfig,
    Pull,
    UniformPlanner,
    select_max_variance,
)
from roll_spotlight.exploration.bandit import _two_values, seed_stream
from roll_spotlight.exploration.select import max_variance
from benchmarks.synthetic_prompts import Bernoulli, BetaReward, ConstantReward
from roll_spotlight.exploration.value import (
    beta_binomial_pmf,
    binary_lookahead_gains,
    binary_selected_variance,
    lookahead_gains,
)


def population_bandit(cfg, *args, **kwargs):
    """The bandit with the population posterior (prior.py)."""
    return BanditPlanner(dataclasses.replace(cfg, posterior="population"), *args, **kwargs)


PLANNERS = [BanditPlanner, population_bandit, UniformPlanner]


def config(**overrides):
    base = dict(group_size=4, seeds_per_pull=2, min_seeds_before_abandon=4, predicted_train_s=100.0,
                spot_workers=1, per_seed_s=1.0, mc_draws=16)
    base.update(overrides)
    return PlannerConfig(**base)


def reward_table(prompt_rewards):
    """reward(prompt, seed) from a per-prompt function of the seed (deterministic)."""
    return lambda prompt, seed: prompt_rewards[prompt](seed)


def coin(prompt, seed):
    return float((seed * 2654435761 + sum(map(ord, str(prompt)))) % 2)


def run_sync(planner, reward, max_pulls=500, now_s=0.0, duration_s=1.0):
    """Pull and immediately observe until the planner stops; returns the pulls."""
    pulls = []
    while len(pulls) < max_pulls:
        pull = planner.next_pull(now_s)
        if pull is None:
            break
        pulls.append(pull)
        for seed in pull.seeds:
            planner.observe(pull.prompt_id, seed, reward(pull.prompt_id, seed), duration_s)
    return pulls


# ---- config ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key,value", [
    ("seeds_per_pull", 0), ("group_size", 1), ("min_seeds_before_abandon", 1), ("predicted_train_s", -1.0),
    ("spot_workers", -2), ("per_seed_s", 0.0), ("mc_draws", 0), ("prior_strength", 0.0), ("cost_ewma", 1.5),
    ("abandon_tolerance", -0.1), ("base_seed", -1), ("max_lookahead_pulls", 0), ("replace_abandoned", "yes"),
    ("predicted_train_s", math.nan), ("group_size", 2.5), ("posterior", "bayes"),
    ("binary_prior", -1.0), ("binary_prior", math.inf), ("kind_donors", "yes"), ("screen_seeds", -1),
    ("screen_seeds", 1.5),
])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"PlannerConfig\.{key}"):
        PlannerConfig(**{key: value})


@pytest.mark.parametrize("key,value", [("bins", 1), ("floor", 0.0), ("floor", 1.5), ("donor_strength", 0.0),
                                       ("tempering", -1.0)])
def test_prior_config_errors_name_the_key(key, value):
    from roll_spotlight.exploration.prior import PriorConfig

    with pytest.raises(ValueError, match=rf"PlannerConfig\.prior\.{key}"):
        PlannerConfig(prior=PriorConfig(**{key: value}))


def test_prompt_ids_must_be_unique_and_stable_types():
    with pytest.raises(ValueError, match="unique"):
        BanditPlanner(config(), ["a", "b"], reserve=["a"])
    with pytest.raises(ValueError, match="int or str"):
        BanditPlanner(config(), [("a", 1)])
    with pytest.raises(ValueError, match="empty"):
        BanditPlanner(config(), [])


# ---- budget ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", PLANNERS)
def test_total_cost_of_pulls_stays_within_budget(cls):
    planner = cls(config(predicted_train_s=10.0, spot_workers=3), list(range(5)))
    pulls = run_sync(planner, coin)
    seeds = sum(len(p.seeds) for p in pulls)
    assert seeds * 1.0 <= 30.0
    assert seeds == 30, "the whole budget is used when durations match the estimate"
    assert planner.next_pull(0.0) is None


def test_budget_counts_in_flight_work():
    planner = BanditPlanner(config(predicted_train_s=3.0, spot_workers=2), ["a", "b"])
    # 3 s x 2 workers = 6 worker-seconds; nothing is observed, so in-flight pulls of 2 s each
    # must stop the fourth.
    issued = [planner.next_pull(0.0) for _ in range(4)]
    assert all(p is not None for p in issued[:3]) and issued[3] is None
    assert planner.remaining_budget_s() == pytest.approx(0.0)


def test_budget_never_pays_for_a_pull_it_cannot_afford():
    planner = UniformPlanner(config(predicted_train_s=5.0, spot_workers=1, seeds_per_pull=2), ["a", "b"])
    pulls = run_sync(planner, coin)
    assert sum(len(p.seeds) for p in pulls) == 4, "5 s buys two pulls of 2 seeds, not a third"


def test_budget_shrinks_when_workers_disappear_and_time_passes():
    planner = BanditPlanner(config(predicted_train_s=10.0, spot_workers=4), list(range(3)))
    assert planner.remaining_budget_s() == pytest.approx(40.0)
    planner.update_budget(workers=2)
    assert planner.remaining_budget_s() == pytest.approx(20.0)
    assert planner.next_pull(5.0) is not None  # at t=5: (10-5)*2 = 10 s left, minus this pull (2 s)
    assert planner.remaining_budget_s() == pytest.approx(8.0)
    planner.update_budget(predicted_train_s=6.0)  # training will end sooner: (6-5)*2 - 2 in flight = 0
    assert planner.remaining_budget_s() == pytest.approx(0.0)
    assert planner.next_pull(5.0) is None


def test_budget_elapsed_reanchors_and_longer_training_grows_budget():
    planner = UniformPlanner(config(predicted_train_s=10.0, spot_workers=1), ["a"])
    planner.update_budget(elapsed_s=9.5, now_s=0.0)
    assert planner.remaining_budget_s() == pytest.approx(0.5)
    assert planner.next_pull(0.0) is None
    planner.update_budget(predicted_train_s=20.0)
    assert planner.remaining_budget_s() == pytest.approx(10.5)
    assert planner.next_pull(0.0) is not None


def test_exploration_budget_accrues_granted_time_per_worker_count():
    budget = ExplorationBudget(predicted_train_s=10.0, workers=2)
    budget.advance(4.0)
    budget.update(workers=1)
    budget.advance(20.0)  # clipped at the end of training
    assert budget.granted_s == pytest.approx(2 * 4 + 1 * 6)
    assert budget.remaining_s(spent_s=0.0, in_flight_s=0.0) == 0.0


def test_cost_model_learns_durations():
    model = SeedCostModel(per_seed_s=1.0, ewma=0.5)
    for _ in range(20):
        model.observe(3.0)
    assert model.predict(2) == pytest.approx(6.0, rel=1e-4)
    with pytest.raises(ValueError, match="ewma"):
        SeedCostModel(per_seed_s=1.0, ewma=0.0)


def test_slow_seeds_stop_exploration_earlier():
    fast = UniformPlanner(config(predicted_train_s=40.0, cost_ewma=1.0), ["a", "b"])
    slow = UniformPlanner(config(predicted_train_s=40.0, cost_ewma=1.0), ["a", "b"])
    n_fast = sum(len(p.seeds) for p in run_sync(fast, coin, duration_s=1.0))
    n_slow = sum(len(p.seeds) for p in run_sync(slow, coin, duration_s=2.0))
    assert n_fast == 40 and n_slow <= 20


# ---- abandonment and replacement ------------------------------------------------------------------

def test_zero_variance_prompt_abandoned_after_minimum_and_replaced():
    rewards = {"zero": lambda s: 0.0, "mixed": lambda s: float(s % 3 == 0), "r1": lambda s: float(s % 2)}
    planner = UniformPlanner(config(min_seeds_before_abandon=4, predicted_train_s=40.0), ["zero", "mixed"],
                             reserve=["r1"])
    pulls = run_sync(planner, reward_table(rewards))
    zero_seeds = sum(len(p.seeds) for p in pulls if p.prompt_id == "zero")
    assert zero_seeds == 4, "exactly min_seeds_before_abandon seeds, then never again"
    assert planner.is_abandoned("zero")
    assert planner.batch == ["r1", "mixed"]
    assert set(planner.selection()) == {"r1", "mixed"}
    assert planner.summary().replaced == {"zero": "r1"}


def test_abandonment_waits_for_the_minimum_seed_count():
    planner = BanditPlanner(config(min_seeds_before_abandon=6, seeds_per_pull=2), ["zero"])
    for _ in range(2):
        pull = planner.next_pull(0.0)
        for seed in pull.seeds:
            planner.observe("zero", seed, 1.0, 1.0)
    assert not planner.is_abandoned("zero")
    pull = planner.next_pull(0.0)
    planner.observe("zero", pull.seeds[0], 1.0, 1.0)
    assert not planner.is_abandoned("zero")
    planner.observe("zero", pull.seeds[1], 1.0, 1.0)
    assert planner.is_abandoned("zero")
    assert planner.next_pull(0.0) is None, "the only prompt is abandoned and the reserve is empty"


@pytest.mark.parametrize("cls", [BanditPlanner, UniformPlanner])
def test_screening_pulls_are_small_until_the_rewards_differ(cls):
    first_mixed = next(seed_stream(0, "mixed"))
    rewards = {"zero": lambda s: 0.0, "mixed": lambda s: float(s == first_mixed), "r": lambda s: float(s % 2)}
    planner = cls(config(group_size=8, seeds_per_pull=4, min_seeds_before_abandon=4, screen_seeds=2,
                         predicted_train_s=40.0, abandon_share=0.0), ["mixed", "zero"], reserve=["r"])
    first = [planner.next_pull(0.0) for _ in range(2)]
    assert [(p.prompt_id, len(p.seeds)) for p in first] == [("mixed", 2), ("zero", 2)]
    assert first[0].seeds[0] == first_mixed
    for pull in first:
        for seed in pull.seeds:
            planner.observe(pull.prompt_id, seed, rewards[pull.prompt_id](seed), 1.0)
    pulls = run_sync(planner, reward_table(rewards))
    assert [len(p.seeds) for p in pulls if p.prompt_id == "zero"] == [2], \
        "two equal rewards: screened with two more, then abandoned at four"
    assert planner.is_abandoned("zero") and planner.batch == ["mixed", "r"]
    assert {len(p.seeds) for p in pulls if p.prompt_id == "mixed"} == {4}, "its rewards differ: full pulls"
    assert [len(p.seeds) for p in pulls if p.prompt_id == "r"][:1] == [2], "the replacement is screened too"
    assert sum(len(p.seeds) for p in first + pulls) <= 40


@pytest.mark.parametrize("share, bandit_seeds", [(0.75, 6), (0.0, 4), (0.25, 4), (1.0, 8)])
def test_bandit_screens_all_equal_arms_for_its_share_of_a_group(share, bandit_seeds):
    """abandon_share: the bandit abandons an all-equal arm at max(min_seeds_before_abandon,
    ceil(share * group_size)) rewards; the round robin at min_seeds_before_abandon."""
    cfg = config(group_size=8, seeds_per_pull=4, min_seeds_before_abandon=4, screen_seeds=2, predicted_train_s=40.0,
                 abandon_share=share)
    for cls, want in ((BanditPlanner, bandit_seeds), (UniformPlanner, 4)):
        planner = cls(cfg, ["zero"], reserve=["r"])
        pulls = run_sync(planner, reward_table({"zero": lambda s: 0.0, "r": lambda s: float(s % 2)}))
        assert [len(p.seeds) for p in pulls if p.prompt_id == "zero"] == [2] * (want // 2), cls.__name__
        assert planner.is_abandoned("zero") and planner.batch == ["r"]
    unscreened = BanditPlanner(dataclasses.replace(cfg, screen_seeds=0), ["zero"])
    pulls = run_sync(unscreened, reward_table({"zero": lambda s: 0.0}))
    assert [len(p.seeds) for p in pulls] == [4] and unscreened.is_abandoned("zero"), "no screening: the minimum"
    with pytest.raises(ValueError, match="abandon_share"):
        config(abandon_share=1.5)


def test_screening_needs_abandonment_and_the_oracle_never_screens():
    cfg = config(group_size=8, seeds_per_pull=4, screen_seeds=2)
    no_abandon = BanditPlanner(dataclasses.replace(cfg, abandon_zero_variance=False), ["a"])
    assert len(no_abandon.next_pull(0.0).seeds) == 4
    oracle = OraclePlanner(cfg, ["b"], {"b": Bernoulli(0.5)})
    assert len(oracle.next_pull(0.0).seeds) == 4


def test_abandoned_prompt_stays_in_batch_without_replacement():
    planner = UniformPlanner(config(replace_abandoned=False, predicted_train_s=30.0), ["zero", "one"],
                             reserve=["spare"])
    pulls = run_sync(planner, lambda p, s: 0.0 if p == "zero" else float(s % 2))
    assert planner.batch == ["zero", "one"]
    assert planner.is_abandoned("zero") and not planner.is_abandoned("one")
    assert all(p.prompt_id != "spare" for p in pulls)
    assert len(planner.selection()["zero"]) == 4


def test_replacement_chains_through_the_reserve():
    planner = UniformPlanner(config(predicted_train_s=60.0), ["z0"], reserve=["z1", "z2", "ok"])
    run_sync(planner, lambda p, s: float(s % 2) if p == "ok" else 1.0)
    assert planner.batch == ["ok"]
    assert {"z0", "z1", "z2"} <= set(planner.summary().abandoned)


def test_abandonment_can_be_disabled():
    planner = UniformPlanner(config(abandon_zero_variance=False, predicted_train_s=12.0), ["zero"], reserve=["r"])
    run_sync(planner, lambda p, s: 0.0)
    assert not planner.is_abandoned("zero") and planner.batch == ["zero"]


# ---- lost pulls, seeds, determinism ---------------------------------------------------------------

@pytest.mark.parametrize("cls", PLANNERS)
def test_lost_pull_is_reissued_first(cls):
    planner = cls(config(), ["a", "b", "c"])
    first = planner.next_pull(0.0)
    second = planner.next_pull(0.0)
    planner.lost(first)
    again = planner.next_pull(0.0)
    assert again == first
    assert planner.next_pull(0.0).seeds not in (first.seeds, second.seeds)


def test_partially_observed_lost_pull_reissues_only_the_rest():
    planner = BanditPlanner(config(seeds_per_pull=3), ["a"])
    pull = planner.next_pull(0.0)
    planner.observe("a", pull.seeds[0], 0.3, 1.0)
    planner.lost(pull)
    planner.lost(pull)  # reporting twice changes nothing
    assert planner.next_pull(0.0) == Pull("a", pull.seeds[1:])


def test_late_result_of_a_lost_seed_is_accepted_and_not_reissued():
    planner = BanditPlanner(config(seeds_per_pull=2), ["a"])
    pull = planner.next_pull(0.0)
    planner.lost(pull)
    planner.observe("a", pull.seeds[0], 0.5, 1.0)
    assert planner.next_pull(0.0) == Pull("a", pull.seeds[1:])
    assert planner.explored("a") == [(pull.seeds[0], 0.5)]


def test_observe_rejects_unknown_and_ignores_duplicates():
    planner = BanditPlanner(config(), ["a"])
    pull = planner.next_pull(0.0)
    with pytest.raises(ValueError, match="never issued"):
        planner.observe("a", 12345, 0.0, 1.0)
    with pytest.raises(ValueError, match="unknown prompt"):
        planner.observe("zzz", pull.seeds[0], 0.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        planner.observe("a", pull.seeds[0], math.inf, 1.0)
    planner.observe("a", pull.seeds[0], 0.25, 1.0)
    planner.observe("a", pull.seeds[0], 0.75, 1.0)
    assert planner.explored("a") == [(pull.seeds[0], 0.25)]


@pytest.mark.parametrize("cls", PLANNERS)
def test_never_repeats_a_seed_even_with_losses(cls):
    planner = cls(config(predicted_train_s=400.0, spot_workers=1), ["a", "b", "c"])
    rng = np.random.default_rng(0)
    fresh = {}
    lost_seeds = set()
    for _ in range(120):
        pull = planner.next_pull(0.0)
        if pull is None:
            break
        for seed in pull.seeds:
            if (pull.prompt_id, seed) not in lost_seeds:
                assert (pull.prompt_id, seed) not in fresh, "a fresh pull repeated a seed"
                fresh[(pull.prompt_id, seed)] = True
        if rng.random() < 0.2:
            planner.lost(pull)
            lost_seeds |= {(pull.prompt_id, s) for s in pull.seeds}
            continue
        for seed in pull.seeds:
            planner.observe(pull.prompt_id, seed, coin(pull.prompt_id, seed), 1.0)
    for pid in "abc":
        seeds = [s for s, _ in planner.explored(pid)]
        assert len(seeds) == len(set(seeds))
        assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("cls", PLANNERS)
def test_deterministic_given_seeds(cls):
    def run(base_seed):
        planner = cls(config(base_seed=base_seed, predicted_train_s=60.0), ["a", "b", "c"], reserve=["d"])
        return run_sync(planner, coin), planner.selection()

    assert run(3) == run(3)
    assert run(3)[0] != run(4)[0]


def test_unexplored_prompts_are_pulled_first_in_slot_order():
    planner = BanditPlanner(config(), ["a", "b", "c"])
    assert [planner.next_pull(0.0).prompt_id for _ in range(3)] == ["a", "b", "c"]


def test_uniform_is_round_robin():
    planner = UniformPlanner(config(predicted_train_s=1000.0, abandon_zero_variance=False), ["a", "b", "c"])
    ids = [p.prompt_id for p in run_sync(planner, lambda p, s: float(s % 2), max_pulls=9)]
    assert ids == ["a", "b", "c"] * 3


def test_uniform_counts_in_flight_seeds():
    planner = UniformPlanner(config(predicted_train_s=1000.0), ["a", "b", "c"])
    first = [planner.next_pull(0.0) for _ in range(3)]
    for seed in first[0].seeds:
        planner.observe("a", seed, 0.5, 1.0)
    assert [p.prompt_id for p in first] == ["a", "b", "c"]
    assert [planner.next_pull(0.0).prompt_id for _ in range(3)] == ["a", "b", "c"]


@pytest.mark.parametrize("posterior", ["pooled", "population"])
def test_bandit_prefers_the_prompt_with_more_to_gain(posterior):
    # "binary" already holds the best possible 2+2 split of {0, 1}; "spread" can still find more
    # extreme values. After both are explored the bandit must keep exploring "spread".
    planner = BanditPlanner(config(group_size=4, seeds_per_pull=4, predicted_train_s=1000.0, posterior=posterior),
                            ["binary", "spread"])
    values = {"binary": [0.0, 1.0, 0.0, 1.0], "spread": [0.45, 0.5, 0.55, 0.6]}
    for _ in range(2):
        pull = planner.next_pull(0.0)
        for seed, r in zip(pull.seeds, values[pull.prompt_id]):
            planner.observe(pull.prompt_id, seed, r, 1.0)
    assert planner.next_pull(0.0).prompt_id == "spread"


def test_bandit_spreads_concurrent_pulls_over_prompts():
    # With results pending, the planned seeds count as explored, so the same prompt is not credited
    # twice with its most valuable pull.
    planner = BanditPlanner(config(group_size=4, seeds_per_pull=4, predicted_train_s=1000.0), ["a", "b"])
    rng = np.random.default_rng(1)
    for _ in range(2):
        pull = planner.next_pull(0.0)
        for seed in pull.seeds:
            planner.observe(pull.prompt_id, seed, float(rng.random()), 1.0)
    concurrent = [planner.next_pull(0.0).prompt_id for _ in range(4)]
    assert set(concurrent) == {"a", "b"}


def _pooled_index_of(prompt, donor_rewards, own_rewards, **overrides):
    """The pooled bandit's index of ``prompt`` after every donor and ``prompt`` got one pull."""
    cfg = config(**{**dict(group_size=4, seeds_per_pull=4, predicted_train_s=1000.0, mc_draws=256, prior_strength=4.0,
                           abandon_zero_variance=False), **overrides})
    table = {**{f"d{i}": r for i, r in enumerate(donor_rewards)}, prompt: own_rewards}
    planner = BanditPlanner(cfg, list(table))
    for _ in table:
        pull = planner.next_pull(0.0)
        for seed, r in zip(pull.seeds, table[pull.prompt_id]):
            planner.observe(pull.prompt_id, seed, r, 1.0)
    return planner._score(planner.batch.index(prompt), planner._arms[prompt])


def test_pooled_base_measure_keeps_each_donor_prompt_together():
    # Both populations pool the same rewards (half 0s, half 1s). With constant donors, one
    # hypothetical future of "narrow" borrows only 0s or only 1s (one donor per Monte Carlo row),
    # so more seeds are worth less than with binary donors, whose every row holds both extremes.
    # A flat pool of rewards (draws mixing prompts) values the two populations the same.
    narrow = [0.45, 0.5, 0.55, 0.6]
    constant_donors = _pooled_index_of("narrow", [[0.0] * 4, [1.0] * 4] * 3, narrow)
    binary_donors = _pooled_index_of("narrow", [[0.0, 1.0, 0.0, 1.0]] * 6, narrow)
    assert 0 < constant_donors < 0.8 * binary_donors


def test_continuous_prompt_borrows_only_from_continuous_donors():
    # Six pass / fail donors and two narrow continuous ones. Borrowing 0s and 1s would credit the
    # narrow continuous prompt with extremes a continuous score of its kind does not produce.
    donors = [[0.0, 1.0, 0.0, 1.0]] * 6 + [[0.5, 0.51, 0.52, 0.53], [0.47, 0.5, 0.52, 0.55]]
    narrow = [0.45, 0.5, 0.55, 0.6]
    same_kind = _pooled_index_of("narrow", donors, narrow)
    any_kind = _pooled_index_of("narrow", donors, narrow, kind_donors=False)
    assert 0 < same_kind < 0.5 * any_kind


def test_two_valued_prompts_are_recognised():
    assert _two_values([0.0, 0.0, 1.0]) == (0.0, 1.0)
    assert _two_values([0.2, 0.2, 0.7, 0.7]) == (0.2, 0.7)
    assert _two_values([0.0, 1.0]) is None, "two seeds cannot tell a pass / fail prompt from a continuous one"
    assert _two_values([0.0, 0.5, 1.0]) is None
    assert _two_values([1.0, 1.0, 1.0]) is None


def test_beta_binomial_pmf_matches_the_formula():
    def direct(n, a, b):
        log_beta = lambda x, y: math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)  # noqa: E731
        return np.array([math.comb(n, i) * math.exp(log_beta(i + a, n - i + b) - log_beta(a, b)) for i in range(n + 1)])

    for n, a, b in [(0, 1.0, 1.0), (1, 2.0, 3.0), (12, 0.5, 4.5), (24, 3.0, 1.0)]:
        np.testing.assert_allclose(beta_binomial_pmf(n, a, b), direct(n, a, b), atol=1e-12)


@pytest.mark.parametrize("highs,pool,k", [(0, 8, 4), (1, 8, 4), (3, 5, 4), (5, 6, 4), (7, 12, 8), (2, 2, 2)])
def test_binary_selected_variance_is_the_max_variance_selection(highs, pool, k):
    rewards = [0.2] * (pool - highs) + [0.7] * highs
    assert binary_selected_variance(np.array([highs]), pool, k, 0.5)[0] == pytest.approx(max_variance(rewards, k))


@pytest.mark.parametrize("highs,lows,planned", [(1, 3, 0), (1, 7, 0), (4, 4, 2), (2, 1, 0)])
def test_binary_lookahead_is_the_monte_carlo_limit(highs, lows, planned):
    # Exact Beta-binomial look-ahead vs the generic Monte Carlo one on draws from the same posterior.
    k, m, horizons, a = 8, 4, 3, 1.0
    base, gains = binary_lookahead_gains(highs, lows, 1.0, a, a, k, planned, m, horizons)
    rng = np.random.default_rng(0)
    rate = rng.beta(a + highs, a + lows, size=100_000)
    draws = (rng.random((rate.size, planned + horizons * m + k)) < rate[:, None]).astype(float)
    explored = np.array([0.0] * lows + [1.0] * highs)
    mc_base, mc_gains = lookahead_gains(explored, draws, k, planned, m, horizons)
    assert base == pytest.approx(mc_base, abs=2e-3)
    np.testing.assert_allclose(gains, mc_gains, atol=2e-3)
    if min(highs, lows) < k // 2:
        assert gains[-1] > 0, "more seeds of a prompt with a rare value always help a max-variance selection"
    else:
        assert not gains.any(), "the best possible k/2 + k/2 split is already explored"


def test_bandit_values_two_valued_prompts_in_closed_form():
    # One success in eight: the value comes from the Beta posterior, not from Monte Carlo rows, so
    # it does not depend on the Monte Carlo settings; with binary_prior=0 it does.
    def index(**overrides):
        planner = BanditPlanner(config(group_size=8, seeds_per_pull=4, screen_seeds=0, predicted_train_s=1000.0,
                                       **overrides), ["rare"])
        for rewards in ([0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]):
            pull = planner.next_pull(0.0)
            for seed, r in zip(pull.seeds, rewards):
                planner.observe("rare", seed, r, 1.0)
        arm = planner._arms["rare"]
        assert sorted(arm.rewards) == [0.0] * 7 + [1.0]
        return planner._score(0, arm) * planner._cost.predict(1)

    exact = binary_lookahead_gains(1, 7, 1.0, 1.0, 1.0, 8, 0, 4, 1)[1][0] / 4
    assert exact > 0
    assert index(mc_draws=8) == pytest.approx(exact)
    assert index(mc_draws=64, base_seed=9) == pytest.approx(exact)
    assert index(binary_prior=0.0, mc_draws=8) != pytest.approx(exact)


def test_monte_carlo_columns_do_not_change_when_more_are_needed():
    # Common random numbers across look-ahead widths: an arm evaluated with more columns must see
    # the same first columns (the uniforms are regenerated when a wider look-ahead needs more).
    planner = BanditPlanner(config(mc_draws=8), ["a"])
    narrow = [u.copy() for u in planner._columns(4)]
    wide = planner._columns(40)
    for before, after in zip(narrow, wide):
        assert after.shape == (8, 40)
        assert np.array_equal(before, after[:, :4])


# ---- selection ------------------------------------------------------------------------------------

def test_selection_uses_max_variance_and_tops_up_with_fresh_seeds():
    planner = BanditPlanner(config(group_size=4, seeds_per_pull=3, screen_seeds=0, predicted_train_s=9.0), ["a", "b"])
    rewards = {}
    pulls = []
    for _ in range(3):
        pull = planner.next_pull(0.0)
        pulls.append(pull)
        for i, seed in enumerate(pull.seeds):
            rewards[(pull.prompt_id, seed)] = 0.1 * (len(rewards) % 7)
            planner.observe(pull.prompt_id, seed, rewards[(pull.prompt_id, seed)], 1.0)
    explored = {pid: planner.explored(pid) for pid in ("a", "b")}
    rich, poor = sorted(explored, key=lambda pid: -len(explored[pid]))
    assert len(explored[rich]) == 6 and len(explored[poor]) == 3
    selection = planner.selection(4)
    assert selection == planner.selection(4), "selection is pure"
    seeds, values = zip(*explored[rich])
    assert selection[rich] == [seeds[i] for i in select_max_variance(values, 4)]
    poor_seeds = [s for s, _ in explored[poor]]
    assert selection[poor][:3] == poor_seeds
    top_up = selection[poor][3]
    issued = {s for p in pulls for s in p.seeds}
    assert top_up not in issued
    with pytest.raises(ValueError, match="k must be"):
        planner.selection(0)


def test_bandit_selects_fresh_seeds_for_a_prompt_with_few_all_equal_rewards():
    """Fewer than k explored rewards, all equal: the group is k fresh seeds; differing ones are kept."""
    cfg = config(group_size=8, seeds_per_pull=4, min_seeds_before_abandon=4, screen_seeds=2, abandon_share=0.75,
                 predicted_train_s=6.0)
    rewards = reward_table({"flat": lambda s: 0.0, "mixed": lambda s: (s % 1000) / 1000})
    for cls in (BanditPlanner, UniformPlanner):
        planner = cls(cfg, ["mixed", "flat"])
        pulls = run_sync(planner, rewards)
        explored = {pid: [s for s, _ in planner.explored(pid)] for pid in ("flat", "mixed")}
        assert 0 < len(explored["flat"]) < 6 and not planner.is_abandoned("flat"), pulls
        selection = planner.selection()
        issued = {s for p in pulls for s in p.seeds}
        assert len(selection["flat"]) == 8 and len(set(selection["flat"])) == 8
        if cls is BanditPlanner:
            assert not set(selection["flat"]) & issued, "all-equal explored seeds are left out"
        else:
            assert selection["flat"][:len(explored["flat"])] == explored["flat"], "the round robin keeps them"
        assert len({r for _, r in planner.explored("mixed")}) == len(explored["mixed"]) > 1
        assert selection["mixed"][:len(explored["mixed"])] == explored["mixed"], "differing explored seeds are kept"


def test_selection_top_up_never_returns_lost_seeds_and_is_later_issued_fresh():
    planner = BanditPlanner(config(group_size=4, seeds_per_pull=2), ["a"])
    pull = planner.next_pull(0.0)
    planner.lost(pull)
    selection = planner.selection()["a"]
    assert len(selection) == 4 and not set(selection) & set(pull.seeds)


# ---- oracle ---------------------------------------------------------------------------------------

def test_oracle_abandons_constant_prompts_without_exploring():
    dists = {"c0": ConstantReward(0.0), "c1": ConstantReward(1.0), "b": Bernoulli(0.3), "beta": BetaReward(2, 2),
             "r": Bernoulli(0.5)}
    planner = OraclePlanner(config(predicted_train_s=40.0), ["c0", "b", "c1", "beta"], dists, reserve=["r"])
    assert planner.batch == ["r", "b", "c1", "beta"]
    rng = np.random.default_rng(0)
    pulls = run_sync(planner, lambda p, s: float(dists[p].sample(rng, (1,))[0]))
    assert all(p.prompt_id not in ("c0", "c1") for p in pulls)
    assert "c1" in planner.selection(), "no reserve left: c1 stays in the batch"


def test_oracle_requires_every_distribution():
    with pytest.raises(ValueError, match="distributions missing"):
        OraclePlanner(config(), ["a"], {})


def test_config_is_a_plain_dataclass_for_yaml_loading():
    fields = {f.name: f.type for f in dataclasses.fields(PlannerConfig)}
    assert set(fields) >= {"group_size", "seeds_per_pull", "min_seeds_before_abandon", "replace_abandoned"}
