"""SpotMarket: ordering, notices, victims, compression, windows, caps, multi-zone pools."""

import json
from pathlib import Path

import pytest

from roll_spotlight.spot import EventKind, MarketConfig, SpotMarket, load_trace, synthetic_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="module")
def root() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES}")
    return TRACES


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


def test_bamboo_market_order_and_aws_notice(root):
    market = SpotMarket(load_trace(root / "bamboo-spot-traces/aws/p3-trace.csv"))
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
    market = SpotMarket(trace)
    downs = [(ev.time_s, ev.node_id) for ev in market if ev.kind is EventKind.NODE_DOWN]
    # 3 -> 1 at 120 s takes the two newest (n1, n2); 1 -> 2 adds n3; 2 -> 0 takes the rest
    assert sorted(downs) == [(120.0, "z/n1"), (120.0, "z/n2"), (240.0, "z/n0"), (240.0, "z/n3")]
    assert market.alive_at(130.0) == frozenset({"z/n0"})
    assert market.notice_s == 30.0  # GCP
    assert _check_notices(market, 30.0) == 4


def test_seeded_random_victims_are_deterministic(root):
    trace = load_trace(root / "skypilot-aws-v100-multinode/preemption-4node")

    def downs(seed):
        market = SpotMarket(trace, MarketConfig(victims="seeded_random", seed=seed))
        return [ev.node_id for ev in market if ev.kind is EventKind.NODE_DOWN]

    newest = [ev.node_id for ev in SpotMarket(trace) if ev.kind is EventKind.NODE_DOWN]
    assert downs(1) == downs(1)
    assert downs(1) != downs(2) and downs(1) != newest
    assert len(downs(1)) == len(newest) == 600


def test_count_trace_alive_equals_counts(root):
    trace = load_trace(root / "skypilot-aws-v100-multinode/preemption-4node")
    market = SpotMarket(trace, MarketConfig(victims="seeded_random", seed=3))
    _check_lifecycles(market)
    for t in range(0, int(market.duration_s), 7_777):
        alive = market.alive_at(float(t))
        for zone, series in trace.zones.items():
            assert sum(node.startswith(zone + "/") for node in alive) == series.value_at(float(t))


def test_compression_scales_times(root):
    trace = load_trace(root / "bamboo-spot-traces/aws/p3-trace.csv")
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


def test_window_and_skip_ramp(root):
    trace = load_trace(root / "bamboo-spot-traces/aws/p3-trace.csv")
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


def test_cap_nodes_bounds_alive_set(root):
    trace = load_trace(root / "skynomad-gcp-h100")
    market = SpotMarket(trace, MarketConfig(cap_nodes=10))
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
    market = SpotMarket(trace)
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
    ({"start_s": -5}, "start_s"),
])
def test_config_validation_names_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        MarketConfig(**kwargs)


def test_window_past_the_end_is_rejected():
    trace = synthetic_trace(nodes=2, span_s=1000.0)
    with pytest.raises(ValueError, match="start_s"):
        SpotMarket(trace, MarketConfig(start_s=2000.0))
