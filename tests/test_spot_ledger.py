"""Price tables (defaults, per-zone GCP prices) and the GPU-hour cost ledger."""

import json

import pytest

from roll_spotlight.spot import (
    DEFAULT_PRICE_TABLES,
    CostLedger,
    EventKind,
    Price,
    PriceTable,
    SpotMarket,
    default_prices,
    load_gcp_zone_prices,
    load_trace,
    prices_for_trace,
    synthetic_trace,
)


def _table() -> PriceTable:
    return PriceTable("X", {
        "ondemand": Price(4.0, "test"), "spot": Price(1.0, "test"),
        "spot/b": Price(2.0, "test"), "ondemand/b": Price(5.0, "test"),
    })


def test_ledger_arithmetic():
    ledger = CostLedger(_table())
    ledger.start("n1", "spot/a", 0.0)
    ledger.start("n2", "spot/b", 100.0, gpus=2)
    assert ledger.stop("n1", 3600.0) == 3600.0
    assert ledger.stop("n2", 1900.0) == 3600.0
    ledger.add("ondemand", 7200.0)
    report = ledger.report()
    pools = {p.pool: p for p in report.pools}
    assert pools["spot/a"].gpu_hours == pytest.approx(1.0) and pools["spot/a"].usd == pytest.approx(1.0)
    assert pools["spot/b"].usd == pytest.approx(2.0) and pools["spot/b"].ondemand_usd == pytest.approx(5.0)
    assert pools["ondemand"].usd == pytest.approx(8.0)
    assert report.total_gpu_hours == pytest.approx(4.0)
    assert report.total_usd == pytest.approx(11.0)
    assert report.ondemand_usd == pytest.approx(4.0 + 5.0 + 8.0)  # spot/a falls back to "ondemand"
    assert report.savings_usd == pytest.approx(6.0)
    assert report.savings_fraction == pytest.approx(6.0 / 17.0)
    assert json.loads(json.dumps(report.to_dict()))["total_usd"] == pytest.approx(11.0)


def test_open_intervals_need_now():
    ledger = CostLedger(_table())
    ledger.start("n1", "spot", 10.0)
    with pytest.raises(ValueError, match="n1"):
        ledger.report()
    assert ledger.report(now=3610.0).total_usd == pytest.approx(1.0)
    assert ledger.open_nodes == ("n1",)


@pytest.mark.parametrize("action, match", [
    (lambda led: led.start("n1", "spot", 5.0), "already billing"),
    (lambda led: led.stop("n9", 5.0), "not billing"),
    (lambda led: led.stop("n1", 5.0), "precedes"),
    (lambda led: led.add("spot", -1.0), "gpu_seconds"),
    (lambda led: led.add("preemptible/a", 1.0), "pool"),
    (lambda led: led.start("n2", "spot", 0.0, gpus=0), "gpus"),
])
def test_ledger_rejects_bad_input(action, match):
    ledger = CostLedger(_table())
    ledger.start("n1", "spot", 10.0)
    with pytest.raises(ValueError, match=match):
        action(ledger)


def test_empty_report_has_no_savings():
    report = CostLedger(_table()).report()
    assert (report.total_usd, report.savings_fraction, report.pools) == (0.0, 0.0, ())


def test_default_tables_carry_sources():
    v100 = default_prices("V100")
    assert v100.price("ondemand").usd_per_gpu_hour == 3.06
    assert v100.price("spot/us-east-1f").usd_per_gpu_hour == 0.918  # zone falls back to the default
    assert v100.spot_ratio() == pytest.approx(0.3)
    for table in DEFAULT_PRICE_TABLES.values():
        for price in table.prices.values():
            assert price.source.strip() and "/work" not in price.source and "/root" not in price.source
    with pytest.raises(ValueError, match="A100"):
        default_prices("A100")
    with pytest.raises(ValueError, match="spot"):
        PriceTable("X", {"ondemand": Price(1.0, "s")})
    with pytest.raises(ValueError, match="source"):
        Price(1.0, " ")


def test_gcp_zone_prices(shipped_traces):
    table = load_gcp_zone_prices(shipped_traces / "skynomad-gcp-h100")
    zones = load_trace(shipped_traces / "skynomad-gcp-h100").zone_names
    for zone in zones:
        assert f"spot/{zone}" in table.prices and f"ondemand/{zone}" in table.prices
    assert table.spot_ratio("asia-south2-b") == pytest.approx(0.705, abs=0.001)
    assert table.spot_ratio("us-east4-a") == pytest.approx(0.18, abs=0.001)
    assert table.price("spot/us-central1-a").usd_per_gpu_hour == pytest.approx(18.979008 / 8)
    assert "prices/us-central1_a3-highgpu-8g.json" in table.price("spot/us-central1-a").source
    assert prices_for_trace(load_trace(shipped_traces / "skynomad-gcp-h100")).prices == table.prices


def test_prices_for_traces_without_zone_prices(shipped_traces):
    assert prices_for_trace(load_trace(shipped_traces / "bamboo-spot-traces/aws/p3-trace.csv")).gpu_type == "V100"
    assert prices_for_trace(synthetic_trace(gpu_type="T4")).gpu_type == "T4"
    with pytest.raises(ValueError, match="PriceTable"):
        prices_for_trace(synthetic_trace(gpu_type=None, provider="azure"))


def test_ledger_over_a_market_bills_alive_time():
    trace = synthetic_trace(nodes=3, mtbp_s=400.0, span_s=4_000.0, seed=9)
    market = SpotMarket(trace)
    ledger = CostLedger(default_prices("V100"))
    for ev in market:
        if ev.kind is EventKind.NODE_UP:
            ledger.start(ev.node_id, "spot/synthetic", ev.time_s)
        elif ev.kind is EventKind.NODE_DOWN:
            ledger.stop(ev.node_id, ev.time_s)
    report = ledger.report(now=market.duration_s)
    mean_alive = trace.alive_series("synthetic").time_mean()
    assert report.total_gpu_hours == pytest.approx(mean_alive * 4_000.0 / 3600.0)
    assert report.savings_fraction == pytest.approx(1 - 0.918 / 3.06)
