"""`python -m benchmarks.replay`: window choice, notice defaults, argument handling (tier 1) and a few-second
live replay on Ray checked bit for bit (tier 3)."""
from __future__ import annotations

import json

import pytest

from benchmarks.replay import TraceRunConfig
from roll_spotlight.spot import EventKind, EventList, NodeEvent, Trace
from benchmarks.replay import (
    MIN_NOTICE_S,
    RequestStream,
    build_market,
    build_parser,
    busiest_window,
    check_placement,
    config_from_args,
    failed_checks,
    main,
    notice_wall_s,
)


def trace_with_downs(down_times: list[float], span: float = 20_000.0) -> Trace:
    """One node per down time, all up at 0, plus a node that never leaves."""
    rows = [NodeEvent(0.0, "add", f"n{i}") for i in range(len(down_times) + 1)]
    rows += [NodeEvent(t, "remove", f"n{i}") for i, t in enumerate(down_times)]
    rows.sort(key=lambda r: (r.time_s, r.op != "remove"))
    return Trace(name="fake", kind="events", measures="running", provider="gcp",
                 zones={"z": EventList(tuple(rows), 0.0, span)}, gpu_type="H100")


def test_busiest_window_starts_a_lead_before_the_densest_preemptions():
    trace = trace_with_downs([1_000.0, 9_000.0, 9_500.0, 10_200.0, 15_000.0])
    assert busiest_window(trace, 3_600.0, lead_s=600.0) == 8_400.0  # 9000, 9500, 10200 in [8400, 12000)
    assert busiest_window(trace, 3_600.0, cap_nodes=2, lead_s=600.0) == 400.0  # only n0 (1000) and n1 (9000)
    assert busiest_window(trace_with_downs([]), 3_600.0) == 0.0


def test_auto_window_is_what_the_market_replays():
    trace = trace_with_downs([1_000.0, 9_000.0, 9_500.0, 10_200.0, 15_000.0])
    market = build_market(TraceRunConfig(start_s="auto", speedup=30.0, duration_s=120.0, drain_timeout_s=10.0), trace)
    downs = [e.time_s for e in market.events if e.kind is EventKind.NODE_DOWN]
    assert market.window_start_s == 8_400.0 and downs == [20.0, 1_100.0 / 30, 60.0]


def test_notice_defaults_to_the_compressed_provider_notice_with_a_floor():
    assert notice_wall_s(TraceRunConfig(speedup=30.0), "aws") == 4.0
    assert notice_wall_s(TraceRunConfig(speedup=30.0), "gcp") == MIN_NOTICE_S
    assert notice_wall_s(TraceRunConfig(speedup=30.0, notice_s=0.5), "aws") == 0.5


def test_arguments_become_a_validated_config():
    args = build_parser().parse_args(["--trace", "t.csv", "--start-s", "auto", "--zones", "a, b",
                                      "--no-notice", "--commit-every", "3", "--speedup", "60"])
    cfg = config_from_args(args)
    assert (cfg.start_s, cfg.zones, cfg.no_notice, cfg.commit_every, cfg.speedup) == ("auto", ("a", "b"), True, 3, 60.0)
    assert config_from_args(build_parser().parse_args(["--start-s", "7200"])).start_s == 7200.0
    with pytest.raises(ValueError, match="--start-s"):
        config_from_args(build_parser().parse_args(["--start-s", "soon"]))
    with pytest.raises(ValueError, match="--speedup"):
        TraceRunConfig(speedup=0.0)
    with pytest.raises(ValueError, match="--commit-every"):
        TraceRunConfig(commit_every=-1)
    with pytest.raises(ValueError, match="--gpus-per-node=3 does not fit --sp-degree=2"):
        check_placement(TraceRunConfig(gpus_per_node=3, sp_degree=2))
    with pytest.raises(ValueError, match="--sp-degree=3 must divide model.num_attention_heads=4"):
        config_from_args(build_parser().parse_args(["--sp-degree", "3"]))
    assert config_from_args(build_parser().parse_args(["--cap-nodes", "2"])).nodes == 2  # the earlier flag


def test_bad_input_exits_2(capsys):
    assert main(["--trace", "/nonexistent/trace.csv", "--duration", "1"]) == 2
    assert "python -m benchmarks.replay" in capsys.readouterr().err


def test_request_stream_is_deterministic_and_distinct():
    a, b = RequestStream(("p0", "p1", "p2"), 4, 0.7, seed=1), RequestStream(("p0", "p1", "p2"), 4, 0.7, seed=1)
    first = a.take(5)
    assert first == b.take(5) and a.issued == 5
    assert [s.prompt for s in first] == ["p0", "p1", "p2", "p0", "p1"]
    assert len({s.seed for s in first + a.take(5)}) == 10


def test_failed_checks_name_the_nonzero_correctness_counters():
    report = {"requests_lost": 0, "duplicate_completions": 1, "mismatched_outputs": 2, "denoise_steps_lost": 9}
    assert failed_checks(report) == ["duplicate_completions", "mismatched_outputs"]


@pytest.mark.ray
@pytest.mark.slow
def test_few_second_replay_with_notice_loses_nothing_and_matches_bit_for_bit(capsys):
    # synthetic trace, one spot node of 2 GPUs running an SP 2 group: notified at 1.7 s,
    # reclaimed at 3.7 s (12.4 trace minutes)
    code = main(["--duration", "5", "--speedup", "200", "--cap-nodes", "1", "--gpus-per-node", "2", "--sp-degree",
                 "2", "--notice-s", "2", "--num-steps", "6", "--drain-timeout", "60", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["kind"] == "measured" and report["simulated_minutes"] == pytest.approx(1000 / 60)
    assert report["requests_completed"] == report["requests_submitted"] > 0
    assert report["completed_on_spot"] > 0 and report["completed_on_ondemand"] > 0
    assert report["preemptions"] == report["notices"] == 1
    assert (report["gpus_per_node"], report["sp_degree"], report["regroups_after_loss"]) == (2, 2, 1)
    assert report["newcomer_weights_storage"] == 1 and report["newcomer_weights_same_node_peer"] == 1
    for key in ("requests_lost", "duplicate_completions", "mismatched_outputs", "denoise_steps_lost"):
        assert report[key] == 0, key
    assert report["cost"]["savings_fraction"] > 0


def _group_trace() -> Trace:
    """One zone of 55 instances whose count drops to 50 or 30 and comes back, every 10 minutes."""
    import numpy as np

    from roll_spotlight.spot import CountSeries

    counts = [55] + [50, 55, 30, 55] * 30
    series = CountSeries(np.arange(len(counts)) * 600.0, np.asarray(counts), (len(counts) - 1) * 600.0)
    return Trace(name="group", kind="counts", measures="capacity", provider="gcp", zones={"z": series})


def test_count_model_reaches_the_market_and_the_auto_window():
    trace = _group_trace()
    base = dict(speedup=60.0, duration_s=120.0, drain_timeout_s=10.0, nodes=4, seed=5)
    capacity = build_market(TraceRunConfig(count_model="capacity", **base), trace)
    instances = build_market(TraceRunConfig(**base), trace)
    assert (capacity.config.count_model, instances.config.count_model) == ("capacity", "instances")
    downs = [e for e in instances.events if e.kind is EventKind.NODE_DOWN]
    assert downs and not any(e.kind is EventKind.NODE_DOWN for e in capacity.events)
    # the auto window is chosen on the market that is replayed (same model, same seed)
    auto = build_market(TraceRunConfig(start_s="auto", **base), trace)
    start = busiest_window(trace, 120.0 * 60.0, cap_nodes=4, count_model="instances", seed=5)
    assert auto.window_start_s == start
    with pytest.raises(ValueError, match="--count-model"):
        TraceRunConfig(count_model="capacities")
    args = build_parser().parse_args(["--count-model", "capacity"])
    assert config_from_args(args).count_model == "capacity"
    assert config_from_args(build_parser().parse_args([])).count_model == "instances"


def test_market_only_reports_preemptions_without_ray(tmp_path, capsys):
    import sys

    folder = tmp_path / "gcp-group"
    folder.mkdir()
    counts = [55] + [50, 55, 30, 55] * 30
    (folder / "z_x.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": counts}))
    reports = {}
    for model in ("instances", "capacity"):
        # 119 samples of 10 minutes: the window ends on a rise, after the last drop's replacements
        assert main(["--trace", str(folder), "--market-only", "--count-model", model, "--speedup", "600",
                     "--duration", "119", "--cap-nodes", "4", "--json"]) == 0
        reports[model] = json.loads(capsys.readouterr().out)
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    for model, report in reports.items():
        assert report["kind"] == "market" and report["trace_window"]["count_model"] == model
        assert report["simulated_minutes"] == 1190.0 and report["spot_nodes_initial"] == 4
        assert report["spot_nodes_started"] == 4 + report["preemptions"]  # every loss is replaced
    assert reports["capacity"]["preemptions"] == 0 < reports["instances"]["preemptions"]
    # a notice comes 2 wall s (the floor) before its NODE_DOWN: the last drop's notices fall in the window
    assert reports["instances"]["notices"] >= reports["instances"]["preemptions"]
