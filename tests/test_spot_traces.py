"""Trace loaders and statistics against the shipped public traces and their README numbers."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from roll_spotlight.spot import (
    PACKAGED_TRACES,
    CountSeries,
    EventList,
    TraceFormatError,
    discover_traces,
    load_trace,
    summarize_shipped_traces,
    trace_stats,
    traces_root,
)
from roll_spotlight.spot.traces import TRACES_ENV

BAMBOO = "bamboo-spot-traces/aws/p3-trace.csv"
AVAIL16 = "skypilot-aws-v100-multinode/availability-16node"
PREEMPT4 = "skypilot-aws-v100-multinode/preemption-4node"
GCP = "skynomad-gcp-h100"
WIDE = "skynomad-gcp-h100/h100_probe_counts_wide.csv"
LONG = "skynomad-gcp-h100/h100_probe_counts_long.csv"


# --- each format loads ---------------------------------------------------------------------------


def test_event_csv_loads(shipped_traces):
    trace = load_trace(shipped_traces / BAMBOO)
    assert (trace.kind, trace.measures, trace.provider, trace.gpu_type) == ("events", "running", "aws", "V100")
    assert trace.zone_names == ("p3",)
    events = trace.zones["p3"]
    assert isinstance(events, EventList)
    assert len(events.events) == 177 + 167
    assert events.events[0].node == "node1" and events.events[0].op == "add"
    assert not any("\r" in ev.node for ev in events.events)
    assert trace.capacity == {"p3": 32}
    assert trace.span_s == pytest.approx(40_920.0)


def test_count_json_folder_loads_as_multizone(shipped_traces):
    trace = load_trace(shipped_traces / AVAIL16)
    assert (trace.kind, trace.measures, trace.provider, trace.gpu_type) == ("counts", "capacity", "aws", "V100")
    assert trace.zone_names == ("us-east-2b", "us-west-2a", "us-west-2c")
    series = trace.zones["us-east-2b"]
    assert isinstance(series, CountSeries)
    assert series.times_s[1] - series.times_s[0] == 300.0
    assert series.counts.size == 3247
    assert load_trace(shipped_traces / PREEMPT4).measures == "running"


def test_single_count_json_and_zone_argument(shipped_traces):
    path = shipped_traces / AVAIL16 / "us-west-2a_v100_1.json"
    assert load_trace(path).zone_names == ("us-west-2a",)
    assert load_trace(path, zone="west").zone_names == ("west",)
    picked = load_trace(shipped_traces / AVAIL16, zone="us-west-2c")
    assert picked.zone_names == ("us-west-2c",)
    with pytest.raises(ValueError, match="us-west-9z"):
        load_trace(shipped_traces / AVAIL16, zone="us-west-9z")


def test_probe_wide_and_long_agree_and_gap_is_held(shipped_traces):
    wide, long = load_trace(shipped_traces / WIDE), load_trace(shipped_traces / LONG)
    assert (wide.kind, wide.measures, wide.provider, wide.gpu_type) == ("counts", "capacity", "gcp", "H100")
    assert len(wide.zones) == 13 and wide.zone_names == long.zone_names
    for zone in wide.zone_names:
        np.testing.assert_array_equal(wide.zones[zone].counts, long.zones[zone].counts)
        np.testing.assert_array_equal(wide.zones[zone].times_s, long.zones[zone].times_s)
    series = wide.zones["us-central1-b"]
    assert series.gaps == ((746 * 600.0, 756 * 600.0),)
    assert series.counts.size == 2104
    # inside the gap N(t) is the value probed at tick 745 (3 for us-central1-b)
    assert series.value_at(750 * 600.0) == series.value_at(745 * 600.0) == 3
    assert wide.start_utc == "2025-10-04T00:10:00Z"
    assert any("held" in note for note in wide.notes)


def test_folder_with_wide_and_long_picks_wide(shipped_traces):
    assert load_trace(shipped_traces / GCP).source_path == shipped_traces / GCP
    assert [p.name for p in discover_traces(shipped_traces / GCP)] == ["h100_probe_counts_wide.csv"]


def test_provider_and_measures_overrides(shipped_traces):
    trace = load_trace(shipped_traces / BAMBOO, provider="azure", measures="capacity")
    assert (trace.provider, trace.measures) == ("azure", "capacity")
    with pytest.raises(ValueError, match="provider='ibm'"):
        load_trace(shipped_traces / BAMBOO, provider="ibm")


# --- statistics against the README summary table ---------------------------------------------------


def test_bamboo_stats_match_readme(shipped_traces):
    stats = trace_stats(load_trace(shipped_traces / BAMBOO))
    assert stats.instances_lost == 167 and stats.preemption_events == 79
    assert stats.mtbp_s / 60 == pytest.approx(8.6, abs=0.05)
    zone = stats.zones[0]
    assert zone.mean_alive == pytest.approx(24.0, abs=0.05)
    assert zone.distinct_nodes == 177 and zone.capacity == 32
    assert zone.span_s / 3600 == pytest.approx(11.37, abs=0.005)


@pytest.mark.parametrize("folder, lost, drops, mtbp_min, lo, hi", [
    (AVAIL16, 3749, 404, 157, 119, 193),
    (PREEMPT4, 600, 377, 185, 135, 428),
    (GCP, 20261, 3750, 73, 28, 44 * 60),
])
def test_count_stats_match_readme(shipped_traces, folder, lost, drops, mtbp_min, lo, hi):
    stats = trace_stats(load_trace(shipped_traces / folder))
    assert (stats.instances_lost, stats.preemption_events) == (lost, drops)
    assert stats.mtbp_s / 60 == pytest.approx(mtbp_min, abs=0.5)
    assert stats.mtbp_min_s / 60 == pytest.approx(lo, abs=0.5)
    assert stats.mtbp_max_s / 60 == pytest.approx(hi, rel=0.005)


def test_per_zone_means_match_source_tables(shipped_traces):
    avail = {z.zone: z for z in trace_stats(load_trace(shipped_traces / AVAIL16)).zones}
    assert avail["us-east-2b"].mean_alive == pytest.approx(8.76, abs=0.01)
    assert avail["us-east-2b"].span_s / 3600 == pytest.approx(270.5, abs=0.05)
    gcp = {z.zone: z for z in trace_stats(load_trace(shipped_traces / WIDE)).zones}
    readme = {"asia-south2-b": (15.97, 8), "asia-southeast1-c": (8.37, 25), "europe-west3-c": (1.80, 35),
              "us-central1-b": (9.05, 744), "us-west1-b": (2.61, 244)}
    for zone, (mean, drops) in readme.items():
        assert gcp[zone].mean_alive == pytest.approx(mean, abs=0.006), zone
        assert gcp[zone].preemption_events == drops, zone


def test_summarize_shipped_traces(shipped_traces):
    rows = summarize_shipped_traces(shipped_traces)
    by_trace = {row["trace"]: row for row in rows}
    assert set(by_trace) == {BAMBOO, AVAIL16, PREEMPT4, WIDE}
    assert by_trace[BAMBOO]["preemption_events"] == 79
    assert by_trace[WIDE]["zones"] == 13 and by_trace[WIDE]["capacity_per_zone"] == 16
    json.dumps(rows)  # JSON-ready


# --- where the traces are ------------------------------------------------------------------------


def test_traces_root_is_the_option_else_the_variable_else_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv(TRACES_ENV, raising=False)
    assert traces_root() == PACKAGED_TRACES
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert traces_root() == tmp_path
    assert traces_root(PACKAGED_TRACES) == PACKAGED_TRACES
    with pytest.raises(ValueError, match="--traces-root="):
        traces_root(tmp_path / "missing")
    monkeypatch.setenv(TRACES_ENV, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"\$SPOTLIGHT_TRACES="):
        traces_root()


def test_the_package_ships_data_with_its_source_and_license_only():
    folders = sorted(p.name for p in PACKAGED_TRACES.iterdir() if p.is_dir())
    assert folders == ["bamboo-spot-traces", "skynomad-gcp-h100", "skypilot-aws-v100-multinode"]
    for name in folders:
        assert (PACKAGED_TRACES / name / "SOURCE.md").is_file() and (PACKAGED_TRACES / name / "LICENSE").is_file()
    suffixes = {p.suffix for p in PACKAGED_TRACES.rglob("*") if p.is_file()}
    assert suffixes == {".csv", ".json", ".md", ""}, suffixes  # "": LICENSE and NOTICE; no code
    assert all(folder.relative_to(PACKAGED_TRACES).parts[0] in folders for folder in discover_traces(PACKAGED_TRACES))


# --- malformed traces ------------------------------------------------------------------------------


def _copy(root: Path, rel: str, tmp_path: Path) -> Path:
    dst = tmp_path / Path(rel).name
    shutil.copyfile(root / rel, dst)
    return dst


def _replace_line(path: Path, lineno: int, text: str, newline: str = "\n") -> None:
    lines = path.read_bytes().decode().split(newline)
    lines[lineno - 1] = text
    path.write_bytes(newline.join(lines).encode())


@pytest.mark.parametrize("bad, reason", [
    ("6120000,explode,node40", "event must be"),
    ("6120000,add", "expected 3 fields"),
    ("-5,add,node40", "non-negative integer"),
    ("1,remove,node200", "not sorted"),
    ("9999999,remove,node999", "removed before it was added"),
])
def test_bad_event_row_names_file_and_line(shipped_traces, tmp_path, bad, reason):
    path = _copy(shipped_traces, BAMBOO, tmp_path)
    _replace_line(path, 100, bad, newline="\r\n")
    with pytest.raises(TraceFormatError, match=reason) as info:
        load_trace(path)
    err = info.value
    assert (err.line, err.text) == (100, bad)
    assert str(path) in str(err) and ":100:" in str(err)


def test_truncated_json_reports_line(tmp_path):
    path = tmp_path / "zone-a_v100_1.json"
    path.write_text('{"metadata": {"gap_seconds": 300},\n "data": [1, 2,\n 3, 4\n')
    with pytest.raises(TraceFormatError, match="bad JSON") as info:
        load_trace(path)
    assert info.value.line >= 3 and str(path) in str(info.value)


@pytest.mark.parametrize("text, reason", [
    ('{"metadata": {"gap_seconds": 300},\n "data": [1, -2, 3]}', "non-negative integers"),
    ('{"metadata": {"gap_seconds": 300},\n "data": [1, "x"]}', "non-negative integers"),
    ('{"metadata": {"gap_seconds": 0},\n "data": [1]}', "gap_seconds"),
    ('{"metadata": {"gap_seconds": 300},\n "data": []}', "non-empty"),
])
def test_bad_json_values(tmp_path, text, reason):
    path = tmp_path / "zone-a_v100_1.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=reason) as info:
        load_trace(path)
    assert info.value.line == (1 if "gap_seconds\": 0" in text else 2)


def test_probe_missing_column(shipped_traces, tmp_path):
    path = _copy(shipped_traces, WIDE, tmp_path)
    header = path.read_text().split("\n", 1)[0]
    _replace_line(path, 1, header.replace(",tick,", ",tock,"))
    with pytest.raises(TraceFormatError, match="tick") as info:
        load_trace(path)
    assert info.value.line == 1


def test_probe_long_missing_created_column(shipped_traces, tmp_path):
    path = tmp_path / "probe_long.csv"
    path.write_text("scheduled_at_utc,tick,zone,instances_requested\n2025-10-04T00:10:00Z,0,a,16\n")
    with pytest.raises(TraceFormatError, match="instances_created"):
        load_trace(path)


@pytest.mark.parametrize("bad, reason", [
    ("2025-10-04T01:00:00Z,5,16,16,16,7,1,16,13,16,16,5,0,16", "expected 15 columns"),
    ("2025-10-04T01:00:00Z,5,16,16,16,7,1,16,13,16,16,5,0,16,x", "must be a non-negative integer"),
    ("2025-10-04T01:07:00Z,5,16,16,16,7,1,16,13,16,16,5,0,16,13", "tick grid"),
    ("2025-10-04T00:50:00Z,4,16,16,16,7,1,16,13,16,16,5,0,16,13", "repeated"),
])
def test_bad_probe_row(shipped_traces, tmp_path, bad, reason):
    path = _copy(shipped_traces, WIDE, tmp_path)
    _replace_line(path, 7, bad)  # line 7 is tick 5
    with pytest.raises(TraceFormatError, match=reason) as info:
        load_trace(path)
    assert str(path) in str(info.value) and info.value.line == 7


def test_unknown_file_is_rejected(tmp_path):
    path = tmp_path / "zones.csv"
    path.write_text("zone,region\nus-east4-a,us-east4\n")
    with pytest.raises(TraceFormatError, match="not a known trace format") as info:
        load_trace(path)
    assert info.value.line == 1


def test_tiny_event_trace_without_shared_folder(tmp_path):
    path = tmp_path / "mini-trace.csv"
    path.write_bytes(b"0,add,a\r\n0,add,b\r\n60000,remove,a\r\n120000,add,c\r\n")
    trace = load_trace(path)
    assert trace.zone_names == ("mini",) and trace.provider == "aws"  # format fallback
    series = trace.alive_series("mini")
    assert series.times_s.tolist() == [0.0, 60.0, 120.0] and series.counts.tolist() == [2, 1, 2]
    assert series.time_mean() == pytest.approx(1.5)
