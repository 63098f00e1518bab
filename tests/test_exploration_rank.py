import logging
import math

import numpy as np
import pytest

from roll_spotlight.exploration import RankMonitor, kendall_tau_b, spearman_rho
from roll_spotlight.exploration.rank import average_ranks, grouped_correlations

stats = pytest.importorskip("scipy.stats")


def _pairs(seed, n, ties):
    rng = np.random.default_rng(seed)
    x = rng.random(n)
    y = x + 0.5 * rng.random(n)
    if ties:
        x, y = np.round(x * 4), np.round(y * 3)
    return x, y


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ties", [False, True])
def test_matches_scipy(seed, ties):
    x, y = _pairs(seed, 40 + seed, ties)
    assert spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


def test_average_ranks_match_scipy():
    x = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0])
    np.testing.assert_allclose(average_ranks(x), stats.rankdata(x))


def test_kendall_chunks_agree_with_one_block():
    x, y = _pairs(11, 1100, ties=True)  # more than one 512-row chunk
    assert kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


def test_constant_or_tiny_inputs_are_nan():
    assert math.isnan(spearman_rho([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(kendall_tau_b([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(spearman_rho([1.0], [2.0]))
    with pytest.raises(ValueError, match="equal length"):
        spearman_rho([1.0, 2.0], [1.0])


def test_grouped_correlation_ignores_between_prompt_differences():
    # Within each prompt the ranking is reversed; pooled, the prompt offsets make it look perfect.
    stale = np.array([0.0, 0.1, 0.2, 10.0, 10.1, 10.2])
    fresh = np.array([0.2, 0.1, 0.0, 10.2, 10.1, 10.0])
    groups = ["a"] * 3 + ["b"] * 3
    assert spearman_rho(stale, fresh) > 0.4
    rho, tau, n = grouped_correlations(stale, fresh, groups)
    assert rho == pytest.approx(-1.0) and tau == pytest.approx(-1.0) and n == 6


def test_grouped_skips_constant_groups_and_weights_by_size():
    stale = [0.0, 1.0, 2.0, 3.0, 5.0, 5.0, 0.0, 1.0]
    fresh = [0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 1.0, 0.0]
    groups = ["a"] * 4 + ["const"] * 2 + ["c"] * 2
    rho, tau, n = grouped_correlations(np.array(stale), np.array(fresh), groups)
    assert n == 6
    assert rho == pytest.approx((4 * 1.0 + 2 * -1.0) / 6)
    assert tau == pytest.approx((6 - 1) / math.sqrt(7 * 7))
    with pytest.raises(ValueError, match="label every pair"):
        grouped_correlations(np.array(stale), np.array(fresh), groups[:-1])


def test_fallback_switches_on_below_threshold_and_off_after_recovery(caplog):
    monitor = RankMonitor(threshold=0.5, fallback="random", min_pairs=4)
    good = np.arange(10.0)
    bad = good[::-1].copy()
    assert not monitor.update(good, good).fallback_active
    with caplog.at_level(logging.WARNING, logger="roll_spotlight.exploration.rank"):
        report = monitor.update(good, bad)
    assert report.fallback_active and report.spearman == pytest.approx(-1.0)
    assert "switching the 'random' fallback on" in report.message
    assert any("fallback on" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert monitor.update(good, bad).fallback_active
    assert not monitor.update(good, good).fallback_active
    assert [h["fallback_active"] for h in monitor.history] == [False, True, True, False]
    assert [h["iteration"] for h in monitor.history] == [0, 1, 2, 3]


def test_too_few_pairs_leave_the_state_unchanged():
    monitor = RankMonitor(threshold=0.9, min_pairs=8)
    report = monitor.update([0.0, 1.0, 2.0], [2.0, 1.0, 0.0])
    assert report.n == 3 and not report.fallback_active and "need 8" in report.message
    monitor.update(np.arange(8.0), np.arange(8.0)[::-1])
    assert monitor.fallback_active
    assert monitor.update([0.0, 1.0], [0.0, 1.0]).fallback_active, "too few pairs: stays on"


def test_kendall_statistic_can_drive_the_decision():
    monitor = RankMonitor(threshold=0.7, statistic="kendall", min_pairs=4)
    x = np.arange(8.0)
    y = np.array([0, 2, 1, 3, 5, 4, 7, 6], dtype=float)  # 3 of 28 pairs discordant: rho 0.93, tau 0.786
    assert not monitor.update(x, y).fallback_active
    assert monitor.history[-1]["kendall"] == pytest.approx(22 / 28)
    monitor = RankMonitor(threshold=0.8, statistic="kendall", min_pairs=4)
    assert monitor.update(x, y).fallback_active
    assert not RankMonitor(threshold=0.8, statistic="spearman", min_pairs=4).update(x, y).fallback_active


@pytest.mark.parametrize("kwargs,key", [
    (dict(threshold=1.5), "threshold"), (dict(fallback="stale"), "fallback"),
    (dict(min_pairs=1), "min_pairs"), (dict(statistic="pearson"), "statistic"),
])
def test_monitor_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        RankMonitor(**kwargs)
