"""`python -m benchmarks.soak`: trace tiling and the memory sampler (tier 1), and a few-second soak on the
live Ray runtime that must lose, duplicate and mismatch nothing (tier 3)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from roll_spotlight.spot import EventList, NodeEvent, Trace
from benchmarks.replay import TraceRunConfig
from benchmarks.soak import DEFAULTS, RssSampler, laps_needed, main, tile_trace
from roll_spotlight.spot.traces import CountSeries


def _events() -> Trace:
    rows = (NodeEvent(0.0, "add", "a"), NodeEvent(0.0, "add", "b"), NodeEvent(50.0, "remove", "a"),
            NodeEvent(60.0, "add", "c"))
    return Trace(name="t", kind="events", measures="running", provider="aws",
                 zones={"z": EventList(rows, 0.0, 100.0)})


def test_tiling_an_event_trace_renames_nodes_and_reclaims_survivors_at_each_wrap():
    tiled = tile_trace(_events(), 3)
    rows = tiled.trace.zones["z"].events
    assert tiled.laps == 3 and tiled.period_s == 100.0 and tiled.trace.end_s == 300.0
    assert tiled.wraps == ((100.0, 2), (200.0, 2)), "b and c survive laps 0 and 1"
    assert tiled.wrap_removals == 4 and tiled.removals_until(150.0) == 2
    assert [(r.time_s, r.op, r.node) for r in rows if r.time_s == 100.0] == [
        (100.0, "remove", "b~0"), (100.0, "remove", "c~0"), (100.0, "add", "a~1"), (100.0, "add", "b~1")]
    alive = tiled.trace.alive_series("z")
    assert alive.value_at(270.0) == 2 and alive.capacity == 2, "never more nodes than one lap has"


def test_tiling_a_count_trace_concatenates_and_counts_the_wrap_drop():
    series = CountSeries(np.array([0.0, 10.0, 20.0]), np.array([2, 5, 3]), end_s=30.0)
    trace = Trace(name="c", kind="counts", measures="running", provider="aws", zones={"z": series})
    tiled = tile_trace(trace, 2)
    out = tiled.trace.zones["z"]
    assert out.times_s.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0] and out.end_s == 60.0
    assert out.counts.tolist() == [2, 5, 3, 2, 5, 3] and tiled.wrap_removals == 1
    assert tile_trace(trace, 1).trace is trace


@pytest.mark.parametrize("name", ["bamboo-spot-traces/aws/p3-trace.csv", "skypilot-aws-v100-multinode/preemption-4node"])
def test_shipped_traces_tile(name, shipped_traces):
    from roll_spotlight.spot.traces import load_trace

    trace = load_trace(shipped_traces / name)
    tiled = tile_trace(trace, 2)
    assert tiled.trace.end_s == 2 * trace.end_s
    assert tiled.trace.capacity == trace.capacity


def test_laps_cover_the_soak_and_its_drain():
    trace = _events()  # 100 trace seconds
    assert laps_needed(TraceRunConfig(duration_s=60.0, speedup=10.0, drain_timeout_s=60.0), trace) == 12
    assert laps_needed(TraceRunConfig(duration_s=0.6, speedup=1.0, drain_timeout_s=1.0), trace) == 1


def test_rss_sampler_sees_this_process():
    with RssSampler(every_s=10.0) as rss:
        pass
    assert rss.samples >= 1 and rss.peak_actors_mb > 10.0 and rss.peak_all_mb >= rss.peak_actors_mb


def test_config_names_the_bad_option():
    from benchmarks.soak import build_parser, config_from_args

    with pytest.raises(ValueError, match="--speedup"):
        config_from_args(build_parser().parse_args(["--speedup", "0"]))
    with pytest.raises(ValueError, match="--nodes"):
        config_from_args(build_parser().parse_args(["--cap-nodes", "0"]))
    with pytest.raises(ValueError, match="--minutes"):
        config_from_args(build_parser().parse_args(["--minutes", "nan"]))


@pytest.mark.ray
@pytest.mark.slow
def test_few_second_soak_loses_nothing_and_reports_memory(capsys):
    # synthetic trace, one spot node: notified at 1.7 s, reclaimed at 3.7 s (as the replay test)
    code = main(["--minutes", str(5 / 60), "--speedup", "200", "--cap-nodes", "1", "--notice-s", "2",
                 "--num-steps", "6", "--drain-timeout", "60", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["kind"] == "measured" and report["trace_laps"] == 1
    assert report["requests"] == report["requests_completed"] > 0
    assert report["preemptions"] >= 1 and report["completed_on_spot"] > 0
    for key in ("lost", "duplicated", "mismatched", "regroups"):
        assert report[key] == 0, key
    assert report["peak_rss_mb"] > 100 and report["rss_samples"] >= 2


def test_count_model_reaches_the_config_and_market_only_counts_preemptions(tmp_path, capsys):
    from benchmarks.soak import build_parser, config_from_args

    cfg = config_from_args(build_parser().parse_args(["--count-model", "capacity"]))
    assert cfg.count_model == "capacity" and cfg.duration_s == DEFAULTS.duration_s == 60.0
    assert DEFAULTS.count_model == "instances"
    with pytest.raises(ValueError, match="--count-model"):
        TraceRunConfig(count_model="capacities")
    folder = tmp_path / "gcp-group"
    folder.mkdir()
    counts = [55] + [50, 55, 30, 55] * 3  # 2 trace hours: a 20-hour soak needs 10 laps
    (folder / "z_x.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": counts}))
    reports = {}
    for model in ("instances", "capacity"):
        assert main(["--trace", str(folder), "--market-only", "--count-model", model, "--minutes", "10",
                     "--speedup", "120", "--cap-nodes", "4", "--json"]) == 0
        reports[model] = json.loads(capsys.readouterr().out)
    for report in reports.values():
        assert report["kind"] == "market" and report["trace_laps"] > 10 and report["simulated_minutes"] == 1200.0
    assert reports["capacity"]["preemptions"] == 0 < reports["instances"]["preemptions"]
