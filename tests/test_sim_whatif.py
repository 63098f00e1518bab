"""Tier 1: the what-if tool: market from a trace, a shipped provider + zone, or a synthetic provider."""
import json

import pytest

from roll_spotlight.sim.api import main
from roll_spotlight.sim.whatif import resolve_market, shipped_trace

SMALL = {"prompts_per_iteration": 4, "group_size": 4}


def test_resolve_market_choices(tmp_path):
    assert resolve_market("aws", None, None).source == "aws"
    trace = tmp_path / "t.csv"
    market = resolve_market(None, "z1", trace)
    assert market.source == trace and market.zones == ("z1",)
    with pytest.raises(ValueError, match="not both"):
        resolve_market("gcp", None, trace)
    with pytest.raises(ValueError, match="--provider"):
        resolve_market(None, None, None)
    with pytest.raises(ValueError, match="provider"):
        resolve_market("ibm", None, None)


def test_shipped_zone_lookup(shipped_traces):
    path = shipped_trace("gcp", "us-central1-b", shipped_traces)
    assert path.name == "h100_probe_counts_wide.csv"
    with pytest.raises(ValueError, match="us-central1-b"):  # the error lists the known zones
        shipped_trace("gcp", "nowhere-1a", shipped_traces)


def test_cli_what_if_synthetic_provider_and_model_size(tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(SMALL))
    args = ["--resolution", "512", "--iterations", "2", "--cost", str(cost), "--json", "--provider", "aws",
            "--baselines", "vanilla,spotlight"]
    assert main([*args, "--params-b", "10"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert main([*args, "--params-b", "40"]) == 0
    large = json.loads(capsys.readouterr().out)
    assert small["what_if"]["market"] == "synthetic aws market" and small["trace"]["provider"] == "aws"
    assert small["what_if"]["params_b"] == 10.0 and small["kind"] == "simulated"
    ratio = large["baselines"]["vanilla"]["time_per_iteration_s"] / small["baselines"]["vanilla"]["time_per_iteration_s"]
    assert ratio > 1.2  # 4x the FLOPs per image; the smaller model's forwards sit near the floor


def test_cli_what_if_shipped_zone(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SPOTLIGHT_TRACES", raising=False)  # the traces shipped in the package
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps(SMALL))
    args = ["--resolution", "512", "--iterations", "1", "--cost", str(cost), "--provider", "gcp"]
    assert main([*args, "--json", "--zone", "us-central1-b", "--baselines", "spotlight",
                 "--spot", "2", "--ondemand", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["what_if"]["market"] == "shipped trace h100_probe_counts_wide.csv, zone us-central1-b"
    assert result["trace"]["provider"] == "gcp"
    assert main([*args, "--zone", "nowhere-1a"]) == 2
    assert "known gcp zones" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()  # --traces-root replaces the shipped traces
    assert main([*args, "--zone", "us-central1-b", "--traces-root", str(tmp_path / "empty")]) == 2
    assert "known gcp zones: []" in capsys.readouterr().err
    assert main([*args, "--zone", "us-central1-b", "--traces-root", str(tmp_path / "missing")]) == 2
    assert "--traces-root=" in capsys.readouterr().err
