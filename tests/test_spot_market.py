"""SpotMarket: ordering, notices, victims, count models, compression, windows, caps, multi-zone pools."""

import dataclasses
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from roll_spotlight.spot import EventKind, MarketConfig, SpotMarket, load_trace, synthetic_trace


def _count_trace(tmp_path: Path, zones: dict[str, list[int]], gap: int = 60, provider="gcp"):
    folder = tmp_path / f"{provider}-pool"
    folder.mkdir()
    for zone, data in zones.items():
        (folder / f"{zone}_x.json").write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return load_trace(folder, provider=provider)


def _check_lifecycles(market: SpotMarket) -> dict[str, list[EventKind]]:
    """Every node goes UP -> (NOTICE -> (DOWN)); times never decrease; returns the per-node kinds."""
    seen: dict[str, list[EventKind]] = {}
    last = 0.0
    for ev in market:
        assert ev.time_s >= last
        last = ev.time_s
        seen.setdefault(ev.node_id, []).append(ev.kind)
    allowed = ([EventKind.NODE_UP], [EventKind.NODE_UP, EventKind.NOTICE],
               [EventKind.NODE_UP, EventKind.NOTICE, EventKind.NODE_DOWN])
    for node, kinds in seen.items():
        assert kinds in allowed, (node, kinds)
    return seen


def _check_notices(market: SpotMarket, notice_s: float) -> int:
    """Each NODE_DOWN's NOTICE is exactly notice_s earlier, or clamped onto the node's NODE_UP."""
    up, notice = {}, {}
    checked = 0
    for ev in market:
        if ev.kind is EventKind.NODE_UP:
            up[ev.node_id] = ev.time_s
        elif ev.kind is EventKind.NOTICE:
            notice[ev.node_id] = ev.time_s
        else:
            expected = max(ev.time_s - notice_s, up[ev.node_id])
            assert notice[ev.node_id] == pytest.approx(expected, abs=1e-9)
            checked += 1
    return checked


def test_bamboo_market_order_and_aws_notice(shipped_traces):
    market = SpotMarket(load_trace(shipped_traces / "bamboo-spot-traces/aws/p3-trace.csv"))
    kinds = _check_lifecycles(market)
    assert market.notice_s == 120.0
    assert _check_notices(market, 120.0) == 167  # every preemption, the last instant included
    assert len(kinds) == 177 and "p3/node17" in kinds
    assert len(market.alive_at(0.0)) == 18 and len(market.alive_at(25 * 60.0)) == 32


def test_notice_clamped_to_arrival(tmp_path):
    path = tmp_path / "aws-trace.csv"
    path.write_text("0,add,a\n300000,add,b\n330000,remove,b\n600000,remove,a\n")
    market = SpotMarket(load_trace(path))
    by_node = {(ev.node_id, ev.kind): ev.time_s for ev in market}
    assert by_node[("aws/b", EventKind.NOTICE)] == 300.0  # 330 - 120 < arrival at 300
    assert by_node[("aws/a", EventKind.NOTICE)] == 480.0
    order = [(ev.node_id, ev.kind) for ev in market if ev.node_id == "aws/b"]
    assert order == [("aws/b", EventKind.NODE_UP), ("aws/b", EventKind.NOTICE), ("aws/b", EventKind.NODE_DOWN)]


def test_zero_notice_keeps_notice_before_down(tmp_path):
    path = tmp_path / "aws-trace.csv"
    path.write_text("0,add,a\n60000,remove,a\n60000,add,b\n")
    market = SpotMarket(load_trace(path), MarketConfig(notice_s=0.0))
    assert [(ev.kind, ev.node_id, ev.time_s) for ev in market] == [
        (EventKind.NODE_UP, "aws/a", 0.0), (EventKind.NOTICE, "aws/a", 60.0),
        (EventKind.NODE_DOWN, "aws/a", 60.0), (EventKind.NODE_UP, "aws/b", 60.0)]


def test_newest_first_victims(tmp_path):
    trace = _count_trace(tmp_path, {"z": [3, 3, 1, 2, 0]})
    market = SpotMarket(trace, MarketConfig(count_model="capacity"))
    downs = [(ev.time_s, ev.node_id) for ev in market if ev.kind is EventKind.NODE_DOWN]
    # 3 -> 1 at 120 s takes the two newest (n1, n2); 1 -> 2 adds n3; 2 -> 0 takes the rest
    assert sorted(downs) == [(120.0, "z/n1"), (120.0, "z/n2"), (240.0, "z/n0"), (240.0, "z/n3")]
    assert market.alive_at(130.0) == frozenset({"z/n0"})
    assert market.notice_s == 30.0  # GCP
    assert _check_notices(market, 30.0) == 4


def test_seeded_random_victims_are_deterministic(shipped_traces):
    trace = load_trace(shipped_traces / "skypilot-aws-v100-multinode/preemption-4node")

    def downs(seed):
        market = SpotMarket(trace, MarketConfig(victims="seeded_random", seed=seed, count_model="capacity"))
        return [ev.node_id for ev in market if ev.kind is EventKind.NODE_DOWN]

    newest = [ev.node_id for ev in SpotMarket(trace, MarketConfig(count_model="capacity"))
              if ev.kind is EventKind.NODE_DOWN]
    assert downs(1) == downs(1)
    assert downs(1) != downs(2) and downs(1) != newest
    assert len(downs(1)) == len(newest) == 600


@pytest.mark.parametrize("count_model", ["instances", "capacity"])
def test_count_trace_alive_equals_counts(shipped_traces, count_model):
    # uncapped, both models follow every instance: the alive set is the trace's count
    trace = load_trace(shipped_traces / "skypilot-aws-v100-multinode/preemption-4node")
    market = SpotMarket(trace, MarketConfig(victims="seeded_random", seed=3, count_model=count_model))
    _check_lifecycles(market)
    for t in range(0, int(market.duration_s), 7_777):
        alive = market.alive_at(float(t))
        for zone, series in trace.zones.items():
            assert sum(node.startswith(zone + "/") for node in alive) == series.value_at(float(t))


def test_compression_scales_times(shipped_traces):
    trace = load_trace(shipped_traces / "bamboo-spot-traces/aws/p3-trace.csv")
    plain, fast = SpotMarket(trace), SpotMarket(trace, MarketConfig(compression=60.0))
    assert fast.duration_s == pytest.approx(plain.duration_s / 60)
    plain_moves = [ev for ev in plain if ev.kind is not EventKind.NOTICE]
    fast_moves = [ev for ev in fast if ev.kind is not EventKind.NOTICE]
    assert len(plain_moves) == len(fast_moves) == 177 + 167
    for a, b in zip(plain_moves, fast_moves):
        assert (a.node_id, a.kind, a.trace_time_s) == (b.node_id, b.kind, b.trace_time_s)
        assert b.time_s == pytest.approx(a.time_s / 60)
    # the notice is a wall-clock deadline: still 120 s (or clamped) before the compressed NODE_DOWN
    assert _check_notices(fast, 120.0) == 167


def test_window_and_skip_ramp(shipped_traces):
    trace = load_trace(shipped_traces / "bamboo-spot-traces/aws/p3-trace.csv")
    steady = SpotMarket(trace, MarketConfig(skip_ramp=True))
    assert steady.window_start_s == 1500.0  # 32 nodes after 25 min
    assert len(steady.alive_at(0.0)) == 32
    assert steady.events[0].trace_time_s == 1500.0
    window = SpotMarket(trace, MarketConfig(start_s=3600.0, duration_s=1800.0))
    assert window.duration_s == 1800.0
    assert all(0.0 <= ev.time_s < 1800.0 for ev in window)
    full = SpotMarket(trace)
    assert window.alive_at(0.0) == full.alive_at(3600.0)
    downs_full = [ev.node_id for ev in full.events_between(3600.0, 5400.0) if ev.kind is EventKind.NODE_DOWN]
    assert [ev.node_id for ev in window if ev.kind is EventKind.NODE_DOWN] == downs_full


@pytest.mark.parametrize("count_model", ["instances", "capacity"])
def test_cap_nodes_bounds_alive_set(shipped_traces, count_model):
    trace = load_trace(shipped_traces / "skynomad-gcp-h100")
    market = SpotMarket(trace, MarketConfig(cap_nodes=10, count_model=count_model))
    _check_lifecycles(market)
    alive = 0
    for ev in market:
        alive += {EventKind.NODE_UP: 1, EventKind.NODE_DOWN: -1}.get(ev.kind, 0)
        assert alive <= 10
    assert len(market.alive_at(0.0)) == 10
    assert _check_notices(market, 30.0) > 0


def test_event_trace_cap_ignores_adds_beyond_cap(tmp_path):
    path = tmp_path / "aws-trace.csv"
    path.write_text("0,add,a\n0,add,b\n0,add,c\n60000,remove,c\n120000,remove,a\n180000,add,d\n")
    market = SpotMarket(load_trace(path), MarketConfig(cap_nodes=2))
    nodes = {ev.node_id for ev in market}
    assert nodes == {"aws/a", "aws/b", "aws/d"}  # c was ignored at its add, so its remove is too


def test_multizone_pools_and_zone_selection(tmp_path):
    trace = _count_trace(tmp_path, {"east": [2, 1, 1], "west": [0, 2, 0]})
    market = SpotMarket(trace, MarketConfig(count_model="capacity"))
    assert {ev.zone for ev in market} == {"east", "west"}
    assert market.alive_at(60.0) == frozenset({"east/n0", "west/n0", "west/n1"})
    only_west = SpotMarket(trace, MarketConfig(zones=("west",)))
    assert {ev.zone for ev in only_west} == {"west"}
    with pytest.raises(ValueError, match="north"):
        SpotMarket(trace, MarketConfig(zones=("north",)))


def test_events_between_partitions_and_is_deterministic():
    trace = synthetic_trace(nodes=6, mtbp_s=300.0, span_s=20_000.0, seed=5)
    market = SpotMarket(trace, MarketConfig(compression=10.0))
    chunks = [ev for t in range(0, 2100, 100) for ev in market.events_between(float(t), t + 100.0)]
    assert tuple(chunks) == market.events
    again = SpotMarket(trace, MarketConfig(compression=10.0))
    assert again.events == market.events
    _check_lifecycles(market)


@pytest.mark.parametrize("kwargs, key", [
    ({"victims": "oldest"}, "victims"), ({"compression": 0}, "compression"),
    ({"notice_s": -1}, "notice_s"), ({"cap_nodes": 0}, "cap_nodes"), ({"duration_s": 0}, "duration_s"),
    ({"start_s": -5}, "start_s"), ({"count_model": "capacities"}, "count_model"),
])
def test_config_validation_names_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        MarketConfig(**kwargs)


def test_window_past_the_end_is_rejected():
    trace = synthetic_trace(nodes=2, span_s=1000.0)
    with pytest.raises(ValueError, match="start_s"):
        SpotMarket(trace, MarketConfig(start_s=2000.0))


# ---------------------------------------------------------------------------------------------
# Count traces: our nodes as instances of the group (count_model="instances") vs capacity


def _series_trace(zones: dict[str, list[int]], gap: float = 60.0):
    """A GCP count trace from per-zone sample lists (sample i at i * gap trace seconds)."""
    from roll_spotlight.spot import CountSeries, Trace

    series = {z: CountSeries(np.arange(len(c)) * gap, np.asarray(c, np.int64), (len(c) - 1) * gap)
              for z, c in zones.items()}
    return Trace(name="counts", kind="counts", measures="running", provider="gcp", zones=series)


def _downs(market: SpotMarket) -> list[tuple[float, str]]:
    return [(ev.trace_time_s, ev.node_id) for ev in market if ev.kind is EventKind.NODE_DOWN]


def _ups(market: SpotMarket) -> list[tuple[float, str]]:
    return [(ev.trace_time_s, ev.node_id) for ev in market if ev.kind is EventKind.NODE_UP]


def test_instances_model_preempts_a_small_pool_inside_a_large_group():
    # 4 nodes among 55 instances: the count never falls to 4, so the capacity reading loses nothing
    counts = [55] + [50, 55, 30, 55] * 25
    trace = _series_trace({"z": counts})
    capacity = SpotMarket(trace, MarketConfig(cap_nodes=4, count_model="capacity"))
    assert _downs(capacity) == [] and len(_ups(capacity)) == 4
    market = SpotMarket(trace, MarketConfig(cap_nodes=4, seed=7))
    assert market.config.count_model == "instances"  # the default
    _check_lifecycles(market)
    downs = _downs(market)
    assert len(downs) > 0 and _check_notices(market, 30.0) == len(downs)
    drops = [60.0 * i for i in range(1, len(counts)) if counts[i] < counts[i - 1]]
    assert {t for t, _ in downs} <= set(drops)
    # every rise starts replacements for the nodes lost: the pool is back to 4 before each drop
    assert all(len(market.alive_at(t - 1.0)) == 4 for t in drops)
    assert len(_ups(market)) == 4 + len(downs)
    # seeded by the market seed: the same seed gives the same events, another seed other victims
    assert SpotMarket(trace, MarketConfig(cap_nodes=4, seed=7)).events == market.events
    assert _downs(SpotMarket(trace, MarketConfig(cap_nodes=4, seed=8))) != downs


@pytest.mark.parametrize("seed", range(4))
def test_instances_model_drop_to_zero_takes_all_and_rises_start_replacements(seed):
    # 50 -> 0 reclaims every instance (k/n = 1); 0 -> 2 lets exactly 2 replacements start, 2 -> 50 the rest
    market = SpotMarket(_series_trace({"z": [50, 0, 2, 50, 50]}), MarketConfig(cap_nodes=4, seed=seed))
    assert sorted(_downs(market)) == [(60.0, f"z/n{i}") for i in range(4)]
    assert _ups(market) == ([(0.0, f"z/n{i}") for i in range(4)] + [(120.0, "z/n4"), (120.0, "z/n5"),
                                                                      (180.0, "z/n6"), (180.0, "z/n7")])
    assert len(market.alive_at(130.0)) == 2 and len(market.alive_at(190.0)) == 4


def _oracle_downs(counts: list[int], cap: int, seed: int, zone: str, gap: float = 60.0) -> list[tuple[float, str]]:
    """The documented rule, written out: our nodes are slots 0..m-1 (join order) of the n instances;
    a drop draws its k reclaimed slots without replacement from the zone's RNG (seed, crc32(zone))."""
    rng = np.random.default_rng([seed, zlib.crc32(zone.encode())])
    ours: list[str] = []
    out: list[tuple[float, str]] = []
    previous, joined = 0, 0
    for i, n in enumerate(counts):
        if n < previous and ours:
            hit = set(rng.choice(previous, size=previous - n, replace=False).tolist())
            lost = [node for slot, node in enumerate(ours) if slot in hit]
            out += [(i * gap, node) for node in lost]
            ours = [node for node in ours if node not in lost]
        for _ in range(max(n - previous, 0)):
            if len(ours) < cap:
                ours.append(f"{zone}/n{joined}")
                joined += 1
        previous = n
    return out


@pytest.mark.parametrize("seed", [0, 11])
def test_instances_model_victims_for_a_fixed_seed(seed):
    counts = [20] + [15, 20, 8, 20, 17, 19] * 6
    expected = _oracle_downs(counts, cap=3, seed=seed, zone="z")
    assert expected, "the trace must preempt some of our nodes"
    market = SpotMarket(_series_trace({"z": counts}), MarketConfig(cap_nodes=3, seed=seed))
    assert _downs(market) == expected


def test_instances_model_preempts_in_proportion_to_the_drop():
    # drops of 5 and of 25 among 50 instances: each of our 4 nodes goes with probability 0.1 and 0.5;
    # the rises after them (5 and 25) always refill the pool, so 4 nodes face every drop
    reps, seeds, cap, n = 25, range(40), 4, 50
    counts = [n] + [45, n, 25, n] * reps
    trace = _series_trace({"z": counts})
    lost = {5: 0, 25: 0}
    for seed in seeds:
        market = SpotMarket(trace, MarketConfig(cap_nodes=cap, seed=seed))
        per_drop: dict[float, int] = {}
        for t, _ in _downs(market):
            per_drop[t] = per_drop.get(t, 0) + 1
        for t, count in per_drop.items():
            k = n - counts[int(t // 60)]
            assert count <= min(k, cap)
            lost[k] += count
    drops = reps * len(seeds)
    for k, total in lost.items():
        p = k / n  # per node; jointly hypergeometric over the pool
        mean = drops * cap * p
        sd = (drops * cap * p * (1 - p) * (n - cap) / (n - 1)) ** 0.5
        assert abs(total - mean) < 5 * sd, (k, total, mean, sd)


def test_count_model_does_not_touch_event_traces():
    trace = synthetic_trace(nodes=6, mtbp_s=300.0, span_s=20_000.0, seed=5)
    for cap in (None, 3):
        capacity = SpotMarket(trace, MarketConfig(cap_nodes=cap, count_model="capacity"))
        assert SpotMarket(trace, MarketConfig(cap_nodes=cap)).events == capacity.events


def test_instances_model_on_a_shipped_group_trace_preempts_a_capped_pool(shipped_traces):
    # the availability-16node zones, 4 nodes: the capacity reading hides most drops
    trace = load_trace(shipped_traces / "skypilot-aws-v100-multinode/availability-16node")
    window = MarketConfig(cap_nodes=4, duration_s=20 * 3600.0)
    capacity = SpotMarket(trace, dataclasses.replace(window, count_model="capacity"))
    instances = SpotMarket(trace, window)
    _check_lifecycles(instances)
    alive = 0
    for ev in instances:
        alive += {EventKind.NODE_UP: 1, EventKind.NODE_DOWN: -1}.get(ev.kind, 0)
        assert alive <= 4
    assert len(_downs(instances)) > len(_downs(capacity))


def test_run_config_count_model_reaches_the_training_market():
    from roll_spotlight.config.run import SpotConfig
    from roll_spotlight.spot_pool.training_pool import training_market

    trace = _series_trace({"z": [55, 50, 55]})
    assert SpotConfig().count_model == "instances"
    for model in ("instances", "capacity"):
        market = training_market(SpotConfig(count_model=model, max_workers=4, seed=3), trace)
        assert (market.config.count_model, market.config.cap_nodes, market.config.seed) == (model, 4, 3)
    with pytest.raises(ValueError, match="spot.count_model"):
        SpotConfig(count_model="capacities")
