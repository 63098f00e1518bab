"""`spotlight compare`: two synthetic run directories, the report files, target crossing, ledger and
spot counters, and the `--fail-if-worse` rule (paired and unpaired)."""
from __future__ import annotations

import json
import math

import pytest

from roll_spotlight import compare as C

TASK = {"name": "shapes", "val_prompts": 4}


def _run(path, means, *, iteration_s=2.0, final_rewards=None, task=TASK, cost=None, spot=None, se=0.01):
    """A run directory as the iteration loop writes it: validation rows, iteration_s, ledger, counters."""
    path.mkdir(parents=True)
    rows = []
    for step, mean in enumerate(means):
        row = {"step": step, "val_reward": mean, "val_reward_se": se, "val_strict": 0.0}
        if step:
            row |= {"reward_mean": mean, "iteration_s": iteration_s}
        if step == len(means) - 1:
            row |= {f"cost/{k}": v for k, v in (cost or {}).items()} | {f"spot/{k}": v for k, v in (spot or {}).items()}
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if final_rewards is not None:
        (path / "summary.json").write_text(json.dumps({"final_rewards": final_rewards,
                                                       "config": {"task": task, "reward": {"name": "shapes"}}}))
    return path


LEDGER = {"usd": 3.0, "gpu_s/ondemand": 7200.0, "usd/ondemand": 2.0, "gpu_s/spot/z": 3600.0, "usd/spot/z": 1.0,
          "all_ondemand_usd": 4.5, "bill_scale": 1.0}


def test_report_files_target_ledger_and_counters(tmp_path):
    a = _run(tmp_path / "spotlight", [0.5, 0.6, 0.7, 0.8], iteration_s=3.0, final_rewards=[0.8, 0.8, 0.9, 0.7],
             cost=LEDGER, spot={"preemptions": 2, "commits": 1})
    b = _run(tmp_path / "vanilla", [0.5, 0.55, 0.6, 0.7], final_rewards=[0.7, 0.7, 0.8, 0.6])
    out = tmp_path / "out"
    assert C.main([str(a), str(b), "--out", str(out), "--fail-if-worse"]) == 0
    result = json.loads((out / "compare.json").read_text())
    assert (out / "compare.png").stat().st_size > 0
    assert result["target"] == pytest.approx(0.7) and result["target_source"] == "RUN_B final validation mean"
    assert result["runs"]["a"]["to_target"] == {"iteration": 2, "wall_s": pytest.approx(6.0), "usd": None}
    assert result["runs"]["b"]["to_target"] == {"iteration": 3, "wall_s": pytest.approx(6.0), "usd": None}
    assert result["b_over_a_to_target"] == {"time": pytest.approx(1.0), "cost": None}
    ledger = result["runs"]["a"]["ledger"]
    assert ledger["gpu_hours"] == pytest.approx(3.0) and ledger["usd"] == 3.0 and ledger["all_ondemand_usd"] == 4.5
    assert result["runs"]["b"]["ledger"]["usd"] is None
    assert result["runs"]["a"]["spot"] == {"preemptions": 2.0, "commits": 1.0}
    diff = result["difference"]
    assert diff["kind"] == "paired" and diff["d"] == pytest.approx(0.1) and diff["se"] == pytest.approx(0.0)
    assert not result["worse"]
    text = (out / "compare.md").read_text()
    assert "| iterations to target | 2 | 3 |" in text and "no ledger" in text and "spot/preemptions" in text
    assert "A is not worse" in text


def test_paired_worse_run_fails_the_gate_only_with_the_flag(tmp_path):
    a = _run(tmp_path / "a", [0.5, 0.55], final_rewards=[0.5, 0.6, 0.5, 0.6])
    b = _run(tmp_path / "b", [0.5, 0.7], final_rewards=[0.7, 0.7, 0.7, 0.7])
    args = [str(a), str(b), "--out", str(tmp_path / "out")]
    assert C.main(args) == 0
    assert C.main(args + ["--fail-if-worse"]) == 1
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    d = result["difference"]
    se = math.sqrt(sum((x - (-0.15)) ** 2 for x in (-0.2, -0.1, -0.2, -0.1)) / 3 / 4)
    assert d["d"] == pytest.approx(-0.15) and d["se"] == pytest.approx(se)
    assert d["upper_bound"] == pytest.approx(-0.15 + 2 * se) and result["worse"]
    assert result["runs"]["a"]["to_target"] == {"iteration": None, "wall_s": None, "usd": None}
    # a tolerance wider than the bound's distance below zero passes the same runs
    assert C.main(args + ["--fail-if-worse", "--tolerance", str(0.16)]) == 0


def test_unpaired_when_validation_sets_differ_uses_both_standard_errors(tmp_path):
    a = _run(tmp_path / "a", [0.5, 0.62], se=0.03, final_rewards=[0.6] * 4, task=TASK | {"val_prompts": 8})
    b = _run(tmp_path / "b", [0.5, 0.7], se=0.04)  # unfinished: no summary.json
    result = C.compare(C.load_run(a), C.load_run(b))
    d = result["difference"]
    assert d["kind"] == "unpaired" and d["d"] == pytest.approx(-0.08) and d["se"] == pytest.approx(0.05)
    assert not result["worse"]  # -0.08 + 2 x 0.05 = +0.02 is not below -0.02
    assert C.compare(C.load_run(a), C.load_run(b), z=0.0)["worse"]
    assert any("not paired" in n for n in result["notes"])


def test_explicit_target_and_bad_input(tmp_path, capsys):
    a = _run(tmp_path / "a", [0.5, 0.6, 0.9])
    b = _run(tmp_path / "b", [0.5, 0.7, 0.8])
    result = C.compare(C.load_run(a), C.load_run(b), target=0.65)
    assert result["target_source"] == "--target"
    assert result["runs"]["a"]["to_target"]["iteration"] == 2 and result["runs"]["b"]["to_target"]["iteration"] == 1
    assert C.main([str(a), str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--tolerance"):
        C.compare(C.load_run(a), C.load_run(b), tolerance=-1)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no validation rows"):
        C.load_run(tmp_path / "empty")


def test_emulated_runs_compare_in_gpu_seconds_and_bill_a_run_without_a_pool(tmp_path):
    """Emulated runs: seconds are wall x time-scale; the ledger gives A's dollars at each iteration,
    B (no spot pool) is billed as its on-demand GPUs at the price emulation.json names."""
    a = _run(tmp_path / "spotlight", [0.5, 0.6, 0.7], iteration_s=1.0)
    rows = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    for step, row in enumerate(rows):
        row["cost/usd"] = 2.0 * step
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = _run(tmp_path / "vanilla", [0.5, 0.6, 0.7], iteration_s=1.5)
    for run, gpus in ((a, 8), (b, 8)):
        (run / "emulation.json").write_text(json.dumps({"gpu": "H100 SXM5", "time_scale": 30.0, "ondemand_gpus": gpus,
                                                        "ondemand_usd_per_gpu_hour": 3.0}))
    out = tmp_path / "out"
    assert C.main([str(a), str(b), "--out", str(out)]) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["runs"]["a"]["to_target"] == {"iteration": 2, "wall_s": pytest.approx(60.0),
                                                "usd": pytest.approx(4.0)}
    assert result["runs"]["b"]["to_target"] == {"iteration": 2, "wall_s": pytest.approx(90.0),
                                                "usd": pytest.approx(90.0 * 8 * 3.0 / 3600)}
    assert result["b_over_a_to_target"]["time"] == pytest.approx(1.5)
    assert result["b_over_a_to_target"]["cost"] == pytest.approx(0.6 / 4.0)
    text = (out / "compare.md").read_text()
    assert "| EMULATED H100 SXM5 GPU s to target | 60.0 | 90.0 |" in text and "time 1.50x, cost 0.15x" in text
