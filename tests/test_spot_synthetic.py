"""Synthetic trace generator: requested MTBP and batch size, determinism, defaults from the p3 trace."""

import numpy as np
import pytest

from roll_spotlight.spot import (
    DEFAULT_SYNTHETIC,
    SpotMarket,
    SyntheticTraceConfig,
    load_trace,
    synthetic_trace,
    trace_stats,
)


def test_mtbp_and_batch_size_over_a_long_span():
    mtbp = 600.0
    trace = synthetic_trace(nodes=40, mtbp_s=mtbp, mean_batch=2.5, span_s=mtbp * 3000, replace_delay_s=600.0,
                            seed=11)
    stats = trace_stats(trace)
    # 3000 expected batches: Poisson sd 1.8 %, so 6 % is > 3 sd
    assert stats.mtbp_s == pytest.approx(mtbp, rel=0.06)
    assert stats.instances_lost / stats.preemption_events == pytest.approx(2.5, rel=0.06)
    assert trace.kind == "events" and trace.measures == "running" and trace.provider == "aws"


def test_poisson_batches_have_the_requested_mean():
    stats = trace_stats(synthetic_trace(nodes=40, mtbp_s=100.0, mean_batch=3.0, span_s=300_000.0,
                                        batch_dist="poisson", replace_delay_s=60.0, seed=2))
    assert stats.instances_lost / stats.preemption_events == pytest.approx(3.0, rel=0.06)


def test_deterministic_by_seed():
    a, b = synthetic_trace(seed=7), synthetic_trace(seed=7)
    c = synthetic_trace(seed=8)
    assert a.zones["synthetic"].events == b.zones["synthetic"].events
    assert a.zones["synthetic"].events != c.zones["synthetic"].events


def test_replacements_arrive_after_the_delay_and_fleet_never_exceeds_nodes():
    cfg = SyntheticTraceConfig(nodes=5, mtbp_s=200.0, mean_batch=2.0, span_s=50_000.0,
                               replace_delay_s=300.0, seed=4)
    events = synthetic_trace(cfg).zones["synthetic"].events
    removes = sorted(ev.time_s for ev in events if ev.op == "remove")
    late_adds = sorted(ev.time_s for ev in events if ev.op == "add" and ev.time_s > 0)
    due = [t + 300.0 for t in removes if t + 300.0 <= cfg.span_s]
    np.testing.assert_allclose(late_adds, due)
    alive = 0
    for ev in events:
        alive += 1 if ev.op == "add" else -1
        assert 0 <= alive <= 5
    assert len({ev.node for ev in events}) == 5 + len(late_adds)  # names are never reused


def test_short_fleet_truncates_batches_and_warns(caplog):
    with caplog.at_level("WARNING", logger="roll_spotlight.spot.synthetic"):
        stats = trace_stats(synthetic_trace(nodes=2, mtbp_s=10.0, mean_batch=4.0, span_s=20_000.0, seed=1))
    assert stats.instances_lost / stats.preemption_events < 2.0
    assert "too few nodes" in caplog.text


def test_synthetic_trace_drives_a_market():
    market = SpotMarket(synthetic_trace(nodes=4, span_s=5_000.0, seed=1))
    assert market.notice_s == 120.0
    assert len(market.alive_at(0.0)) == 4


@pytest.mark.parametrize("kwargs, key", [
    ({"nodes": 0}, "nodes"), ({"mtbp_s": 0}, "mtbp_s"), ({"mean_batch": 0.5}, "mean_batch"),
    ({"replace_delay_s": -1}, "replace_delay_s"), ({"provider": "ibm"}, "provider"),
    ({"batch_dist": "zipf"}, "batch_dist"), ({"span_s": -3}, "span_s"),
])
def test_config_validation(kwargs, key):
    with pytest.raises(ValueError, match=key):
        synthetic_trace(**kwargs)


def test_defaults_are_derived_from_the_p3_trace(shipped_traces):
    real = trace_stats(load_trace(shipped_traces / "bamboo-spot-traces/aws/p3-trace.csv"))
    assert DEFAULT_SYNTHETIC.nodes == real.zones[0].capacity
    assert DEFAULT_SYNTHETIC.span_s == real.zones[0].span_s
    assert DEFAULT_SYNTHETIC.mtbp_s == pytest.approx(real.mtbp_s, rel=0.01)
    assert DEFAULT_SYNTHETIC.mean_batch == pytest.approx(real.instances_lost / real.preemption_events, rel=0.01)
    # the replacement delay is chosen so the mean alive count matches (Little's law); check over 8 seeds
    means = [trace_stats(synthetic_trace(seed=s)).zones[0].mean_alive for s in range(8)]
    assert np.mean(means) == pytest.approx(real.zones[0].mean_alive, abs=1.5)
