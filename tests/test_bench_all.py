"""`python -m benchmarks.suite`: the CI-sized smoke run end to end, and the pure parts (headline, convergence
bookkeeping, report helpers) on hand-made inputs."""
import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from benchmarks.convergence import (RunRecord, choose_target, curve_from_metrics, estimate,
                                    iterations_to_target, records_from_json, run_with_timeout)
from benchmarks.headline import Ratio, headline, iterations_ratio, time_and_cost_to_target
from benchmarks.plots import merge_intervals, plot_convergence
from benchmarks.suite import parse_last_json

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ smoke (CI-sized)
@pytest.mark.slow
def test_smoke_run_writes_labelled_report(tmp_path, monkeypatch):
    from benchmarks.suite import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPOTLIGHT_THREADS", "1")
    out = tmp_path / "results"
    assert main(["--smoke", "--out", str(out)]) == 0
    verdict = (out / "REPORT.md").read_text()
    report = (out / "APPENDIX.md").read_text()
    assert "SMOKE RUN" in verdict and "## Verdict" in verdict and len(verdict.splitlines()) <= 150
    for shape in ("today: 2 + 2 spot", "paper: 1 + 2 spot", "spot-heavy: 1 + 3 spot"):
        for res in (512, 1280):
            assert f"| {shape} | {res}x{res} | **" in verdict, (shape, res)
    for label in ("MEASURED", "SIMULATED", "PAPER"):
        assert label in report, label
    systems = ("naive spot (rollouts only)", "Spotlight today (explore during training)",
               "Spotlight with spot training")
    for shape in ("today: 2 on-demand + 2 spot", "paper: 1 reserved + 2 spot", "spot-heavy: 1 on-demand + 3 spot"):
        for res in (512, 1280):
            for system in systems:
                for against in ("vanilla, equal on-demand GPUs", "vanilla, equal cost"):
                    assert f"| {shape} | {res}x{res} | time | {system} | {against} | 4x | >= 4x |" in report, (
                        shape, res, system, against)
        assert f"| {shape} | 1280x1280 | cost | {systems[2]} | vanilla, equal cost | 1.4-6.4x | >= 6x |" in report
    assert "## Spot-training targets" in report and "| time per iteration, Spotlight with spot training |" in report
    for res in (512, 1280):
        assert (out / f"utilisation_{res}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("time_to_target.png", "cost_to_target.png", "convergence.png"):
        assert (out / name).stat().st_size > 1000, name
        assert f"]({name})" in report, name
    assert (out / "verdict.png").stat().st_size > 1000 and "](verdict.png)" in verdict
    result = json.loads((out / "bench_all.json").read_text())
    assert [s["status"] for s in result["stages"]] == ["ok"] * 4, result["stages"]
    runs = result["convergence"]["runs"]
    assert {r["setting"] for r in runs} == {"vanilla", "fresh", "spotlight"}
    assert all(r["horizon"] == 2 and r["curve"][0]["iteration"] == 0 for r in runs)
    sim = result["simulator"]["by_resolution"]["1280"]["baselines"]
    assert "timeline" not in sim["spotlight"] and sim["spotlight"]["kind"] == "simulated"
    paper = result["simulator"]["other_shapes"][0]["by_resolution"]["512"]
    assert paper["cluster"]["ondemand_gpus"] == 1 and "vanilla_fair_cost" in paper["baselines"]


# ------------------------------------------------------------------------------ headline
def _sim(v_time, s_time, v_cost, s_cost, train_s=50.0):
    def base(t, c):
        return {"time_per_iteration_s": t, "cost_per_iteration_usd": c}
    return {"phases": {"train_s": train_s, "publish_s": 2.0},
            "cluster": {"ondemand_gpus": 8}, "prices_usd_per_gpu_hour": {"ondemand": 10.0, "spot": 2.5},
            "baselines": {"vanilla": base(v_time, v_cost), "explore_critical": base(2 * v_time, 2 * v_cost),
                          "naive_spot": base(s_time, s_cost), "spotlight": base(s_time, s_cost)}}


def _est(value, bound="exact"):
    return {"value": value, "bound": bound}


def test_iterations_ratio_keeps_bounds():
    assert iterations_ratio(_est(30), _est(10)) == Ratio(3.0, "exact")
    assert iterations_ratio(_est(30, "lower"), _est(10)) == Ratio(3.0, "lower")
    assert iterations_ratio(_est(30), _est(10, "lower")) == Ratio(3.0, "upper")
    assert iterations_ratio(_est(30, "lower"), _est(10, "lower")).bound == "unknown"
    assert iterations_ratio(None, _est(10)).value is None
    assert Ratio(2.5, "lower").text() == ">= 2.50x" and Ratio(None, "unknown").text() == "not measured"


def test_exploration_rows_take_the_measured_ratio_and_name_the_regime(tmp_path):
    from benchmarks.headline import exploration_ratio
    from benchmarks.report import _exploration_section
    from benchmarks.suite import exploration_regime

    def runs(its):
        return {str(s): {"iterations": i, "reached": True, "all_equal": 0.5} for s, i in enumerate(its)}
    vanilla, adaptive = {"runs": runs([6, 4]), "seeds": [0, 1]}, {
        "runs": runs([2, 2]), "seeds": [0, 1], "iterations_ratio_per_seed": [3.0, 2.0],
        "iterations_ratio_geomean": 6 ** 0.5, "p_one_sided": 0.07}
    summary = {"target": 0.5156, "settings": {"vanilla": vanilla, "adaptive": adaptive}}
    assert exploration_ratio(summary, "adaptive") == Ratio(6 ** 0.5, "exact")
    vanilla["runs"]["0"]["reached"] = False      # vanilla censored at the horizon: at least
    assert exploration_ratio(summary, "adaptive").bound == "lower"
    adaptive["runs"]["1"]["reached"] = False     # both sides censored: unknown
    assert exploration_ratio(summary, "adaptive").value is None
    vanilla["runs"]["0"]["reached"] = adaptive["runs"]["1"]["reached"] = True
    path = tmp_path / "explore.json"
    path.write_text(json.dumps({"config": str(REPO / "configs/tiny_shapes.yaml"), "summary": summary,
                                "overrides": ["reward.kwargs.mode=strict", "train.group_size=4", "max_steps=6"]}))
    sim = _sim(200.0, 100.0, 10.0, 8.0)
    sim["cluster"]["spot_gpus"] = 8
    text = _exploration_section({"exploration": exploration_regime(path), "simulator": {"by_resolution": {"512": sim}}})
    assert "Regime: **tiny shapes, strict reward, groups of 4, 6 iterations**" in text
    assert "**2.45x** MEASURED" in text and "one-sided p 0.070" in text
    # 2.45 x the SIMULATED per-iteration 2.00 (time) and 1.25 (cost)
    assert "| today: 8 on-demand + 8 spot | 512x512 | **4.90x** | **3.06x** | 2.00x / 1.25x |" in text
    assert _exploration_section({}) == "" and exploration_regime(tmp_path / "absent.json") is None


def test_headline_products_targets_and_shortfall():
    sims = {512: _sim(200.0, 100.0, 10.0, 8.0), 1280: _sim(200.0, 100.0, 10.0, 8.0)}
    rows = {(r.resolution, r.metric): r for r in headline({"vanilla": _est(30), "spotlight": _est(10)}, sims)}
    time512 = rows[(512, "time")]
    assert time512.per_iteration == pytest.approx(2.0) and time512.total.value == pytest.approx(6.0)
    assert time512.met is True and time512.shortfall is None
    cost1280 = rows[(1280, "cost")]          # 3 x 1.25 = 3.75 < 6: missed by 1.6x
    assert cost1280.total.value == pytest.approx(3.75) and cost1280.met is False
    assert cost1280.shortfall == pytest.approx(6.0 / 3.75)
    assert cost1280.needed_iterations_ratio == pytest.approx(6.0 / 1.25)
    assert "1.25x" in cost1280.why and "3.00x" in cost1280.why
    # a lower bound below the target decides nothing; an upper bound below it is a miss
    lower = headline({"vanilla": _est(12, "lower"), "spotlight": _est(10)}, {512: sims[512]})
    assert [r.met for r in lower] == [None, None]
    upper = headline({"vanilla": _est(12), "spotlight": _est(10, "lower")}, {512: sims[512]})
    assert [r.met for r in upper] == [False, False]
    missing = headline({}, {512: sims[512]})
    assert all(r.total.value is None and r.met is None and "not measured" in r.why for r in missing)


def test_spot_training_rows_take_vanillas_iterations_and_spot_training_goals():
    from benchmarks.headline import SPOT_TRAINING_GOALS, SYSTEMS, goal_rows

    def with_train(sim, t_time, t_cost, fair_time, fair_cost):
        sim["baselines"]["spotlight_train"] = {"time_per_iteration_s": t_time, "cost_per_iteration_usd": t_cost,
                                               "mean_train_phase_s": 20.0, "train": {"spot_share": 0.6}}
        sim["baselines"]["vanilla_fair_cost:spotlight_train"] = {"time_per_iteration_s": fair_time,
                                                                 "cost_per_iteration_usd": fair_cost,
                                                                 "ondemand_gpus": 9}
        sim["baselines"]["vanilla"]["mean_train_phase_s"] = 50.0
        sim["cluster"]["spot_gpus"] = 8
        return sim
    sims = {512: with_train(_sim(200.0, 100.0, 10.0, 8.0), 80.0, 4.0, 180.0, 9.0)}
    censored = {"vanilla": _est(10, "lower"), "spotlight": _est(10, "lower")}
    rows = headline(censored, sims, systems=SYSTEMS)
    train = {(r.metric, r.baseline): r for r in rows if r.system == "spotlight_train"}
    assert train[("time", "vanilla")].iterations == Ratio(1.0, "exact")      # by construction, though censored
    assert train[("time", "vanilla")].total.value == pytest.approx(2.5)
    assert train[("cost", "vanilla_fair_cost")].total.value == pytest.approx(9.0 / 4.0)
    assert "by construction" in train[("time", "vanilla")].why and "60%" in train[("time", "vanilla")].why
    assert all(r.total.value is None for r in rows if r.system == "spotlight")
    shapes = {"today": sims, "paper": {512: with_train(_sim(200.0, 100.0, 10.0, 8.0), 50.0, 4.0, 150.0, 7.0)}}
    goals = {(g.goal.shape, g.goal.resolution, g.goal.baseline): g for g in goal_rows(censored, shapes)}
    assert len(goals) == len(SPOT_TRAINING_GOALS) == 9
    per_iter = goals[("today", 512, "vanilla")]
    assert per_iter.value.value == pytest.approx(2.5) and per_iter.met is True       # >= 1.8
    assert goals[("paper", 512, "vanilla")].value.value == pytest.approx(2.5) and goals[("paper", 512, "vanilla")].met
    fair = goals[("paper", 512, "vanilla_fair_cost")]
    assert fair.value.value == pytest.approx(7.0 / 4.0) and fair.met is False
    missing = goals[("spot-heavy", 1280, "vanilla")]
    assert not missing.found and missing.met is None


def test_time_and_cost_to_target_maps_baselines_to_settings():
    table = time_and_cost_to_target({"vanilla": _est(30), "fresh": _est(20, "lower"), "spotlight": _est(10)},
                                    _sim(200.0, 100.0, 10.0, 8.0))
    assert table["naive_spot"]["iterations"] == 30 and table["naive_spot"]["time_to_target_s"] == 3000.0
    assert table["explore_critical"]["bound"] == "lower"
    assert table["spotlight"]["cost_to_target_usd"] == pytest.approx(80.0)
    sim = _sim(200.0, 100.0, 10.0, 8.0)
    sim["baselines"]["spotlight_train"] = sim["baselines"]["spotlight"]
    sim["baselines"]["vanilla_fair_cost:spotlight_train"] = sim["baselines"]["vanilla"]
    table = time_and_cost_to_target({"vanilla": _est(30), "spotlight": _est(10)}, sim)
    assert table["spotlight_train"]["iterations"] == 30 == table["vanilla_fair_cost:spotlight_train"]["iterations"]


# ------------------------------------------------------------------------------ convergence bookkeeping
def _record(setting, points, seed=0):
    return RunRecord(setting, seed, "finished", 1.0, [{"iteration": i, "val_reward": v} for i, v in points])


def test_iterations_to_target_ignores_the_base_evaluation():
    curve = [{"iteration": 0, "val_reward": 0.9}, {"iteration": 5, "val_reward": 0.4},
             {"iteration": 10, "val_reward": 0.7}]
    assert iterations_to_target(curve, 0.6) == 10
    assert iterations_to_target(curve, 0.8) is None


def test_estimate_censors_runs_that_miss_the_target():
    records = [_record("spotlight", [(0, 0.3), (5, 0.5), (10, 0.6)], 0),
               _record("spotlight", [(0, 0.3), (5, 0.4)], 1),
               _record("vanilla", [(0, 0.3), (10, 0.55)], 0)]
    est = estimate("spotlight", records, 0.5)
    assert est.per_run == (5, None) and est.horizons == (10, 5)
    assert est.bound == "lower" and est.value == 5.0 and est.reached == 1
    assert estimate("vanilla", records, 0.5).bound == "exact"
    assert estimate("fresh", records, 0.5).value is None


def _reached_at(setting, seed, hit, horizon=10):
    """A run evaluated at 0, 2, ..., horizon that first reaches 0.5 at ``hit`` (None: never)."""
    return _record(setting, [(i, 0.6 if hit is not None and i >= hit else 0.4) for i in range(0, horizon + 1, 2)],
                   seed)


def test_estimate_is_exact_when_enough_runs_reach_before_the_first_censored_horizon():
    # the saved data's vanilla: 6, 10, 10, 10 and two runs censored at 10 -> the median is exactly 10
    records = [_reached_at("vanilla", seed, hit) for seed, hit in enumerate([6, 10, 10, 10, None, None])]
    est = estimate("vanilla", records, 0.5)
    assert est.per_run == (6, 10, 10, 10, None, None) and est.reached == 4
    assert est.value == 10.0 and est.bound == "exact"
    # odd n: 3 of 5 below the censored horizon suffice
    odd = [_reached_at("vanilla", seed, hit) for seed, hit in enumerate([2, 4, 6, None, None])]
    assert estimate("vanilla", odd, 0.5).bound == "exact" and estimate("vanilla", odd, 0.5).value == 6.0


def test_estimate_is_a_lower_bound_when_censored_runs_reach_the_median():
    # the saved data's Spotlight: 6, 6, 10 and three censored at 10 -> median >= 10
    records = [_reached_at("spotlight", seed, hit) for seed, hit in enumerate([6, 6, 10, None, None, None])]
    est = estimate("spotlight", records, 0.5)
    assert est.value == 10.0 and est.bound == "lower" and est.reached == 3
    # enough runs reached, but one was stopped at iteration 4, before two of them reached: not exact
    early_stop = [_reached_at("spotlight", 0, 2), _reached_at("spotlight", 1, 6), _reached_at("spotlight", 2, 8),
                  _reached_at("spotlight", 3, None, horizon=4)]
    assert estimate("spotlight", early_stop, 0.5).bound == "lower"


def test_exact_over_lower_bound_median_is_an_upper_bound_and_a_miss():
    from benchmarks.appendix import _met_text, _shortfall_text

    vanilla = [_reached_at("vanilla", seed, hit) for seed, hit in enumerate([6, 10, 10, 10, None, None])]
    spotlight = [_reached_at("spotlight", seed, hit) for seed, hit in enumerate([6, 6, 10, None, None, None])]
    estimates = {name: asdict(estimate(name, vanilla + spotlight, 0.5)) for name in ("vanilla", "spotlight")}
    assert iterations_ratio(estimates["vanilla"], estimates["spotlight"]) == Ratio(1.0, "upper")
    rows = {r.metric: r for r in headline(estimates, {512: _sim(200.0, 100.0, 10.0, 8.0)})}
    time = rows["time"]                          # <= 1.00 x 2.00 = <= 2.00 against 4: missed by >= 2x
    assert time.total == Ratio(pytest.approx(2.0), "upper") and time.met is False
    assert time.shortfall == pytest.approx(2.0)
    assert _met_text(time) == "**no**" and _shortfall_text(time).startswith(">= 2.00x (reached at most 50%")
    # an upper bound that is not below the target decides nothing
    high = {"vanilla": _est(50), "spotlight": _est(10, "lower")}
    assert [r.met for r in headline(high, {512: _sim(200.0, 100.0, 10.0, 8.0)})] == [None, None]


def test_choose_target_rejects_no_learning():
    learned = [_record("vanilla", [(0, 0.3), (10, 0.5)]), _record("vanilla", [(0, 0.3), (10, 0.6)], 1)]
    target, rule = choose_target(learned, None)
    assert target == pytest.approx(0.55) and "vanilla" in rule
    flat = [_record("vanilla", [(0, 0.3), (10, 0.29)])]
    assert choose_target(flat, None)[0] is None
    assert choose_target(flat, 0.7) == (0.7, "given: 0.7000")


def test_curve_from_metrics_skips_a_torn_last_line(tmp_path):
    rows = [{"step": 0, "val_reward": 0.3}, {"step": 1, "iteration_s": 2.0, "rank_spearman": 0.8},
            {"step": 2, "iteration_s": 4.0, "val_reward": 0.4, "val_reward_se": 0.01}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "val')
    curve, its, ranks = curve_from_metrics(tmp_path)
    assert [p["iteration"] for p in curve] == [0, 2] and its == [2.0, 4.0] and ranks == [0.8]
    assert curve_from_metrics(tmp_path / "absent") == ([], [], [])


def test_run_with_timeout_stops_a_long_run_and_keeps_its_metrics(tmp_path):
    script = ("import json, time, sys\n"
              f"f = open({str(tmp_path / 'metrics.jsonl')!r}, 'a')\n"
              "for i in range(3):\n"
              "    f.write(json.dumps({'step': i, 'val_reward': 0.1 * i}) + '\\n'); f.flush()\n"
              "time.sleep(60)\n")
    status, wall_s, error = run_with_timeout([sys.executable, "-c", script], timeout_s=3.0)
    assert status == "stopped" and wall_s < 30 and error is None
    assert [p["iteration"] for p in curve_from_metrics(tmp_path)[0]] == [0, 1, 2]
    status, _, error = run_with_timeout([sys.executable, "-c", "raise SystemExit('boom')"], timeout_s=30)
    assert status == "failed" and "boom" in error


def test_records_from_convergence_script_output():
    payload = {"runs": {"vanilla": {"0": {"curve": [{"iteration": 0, "val_reward": 0.3}], "rank_spearman": []}},
                        "spotlight": {"1": {"curve": [{"iteration": 0, "val_reward": 0.3},
                                                      {"iteration": 10, "val_reward": 0.5}],
                                            "rank_spearman": [0.7]}}}}
    records = records_from_json(payload)
    assert {(r.setting, r.seed, r.horizon) for r in records} == {("vanilla", 0, 0), ("spotlight", 1, 10)}


# ------------------------------------------------------------------------------ helpers
def test_parse_last_json_takes_the_last_object():
    text = 'log line {not json}\n{"a": 1}\nmore\n{\n  "b": {"c": 2}\n}\n'
    assert parse_last_json(text) == {"b": {"c": 2}}
    with pytest.raises(ValueError):
        parse_last_json("no json here")


def test_merge_intervals_joins_touching_spans_and_clips():
    timeline = [("g0", 0.0, 1.0, "rollout"), ("g0", 1.0, 2.0, "rollout"), ("g0", 2.0, 3.0, "train"),
                ("g0", 3.0, 9.0, "rollout"), ("g1", 7.0, 8.0, "idle")]
    merged = merge_intervals(timeline, horizon=5.0)
    assert merged == {"g0": {"rollout": [(0.0, 2.0), (3.0, 2.0)], "train": [(2.0, 1.0)]}}


def test_convergence_figure_adds_a_rank_panel_only_for_runs_that_explored(tmp_path):
    from PIL import Image

    curve = [{"iteration": 0, "val_reward": 0.60}, {"iteration": 2, "val_reward": 0.62}]
    vanilla = {"setting": "vanilla", "seed": 0, "curve": curve, "rank_spearman": []}
    stale = {"setting": "spotlight", "seed": 0, "curve": curve, "rank_spearman": [0.6, 0.7]}
    one = plot_convergence([vanilla], 0.61, tmp_path / "one.png")
    two = plot_convergence([vanilla, stale], 0.61, tmp_path / "two.png")
    assert Image.open(one).size == (700, 400)
    assert Image.open(two).size == (1200, 400)
    titled = plot_convergence([vanilla, stale], 0.61, tmp_path / "titled.png", subtitle="64 seeds explored")
    assert Image.open(titled).size == (1200, 400)
    assert np.asarray(Image.open(titled)).tobytes() != np.asarray(Image.open(two)).tobytes()


def test_training_runs_share_one_deadline(tmp_path, monkeypatch):
    """Each run gets what is left of the convergence budget; past the deadline a run is not started."""
    import time

    from benchmarks import convergence

    seen = []
    monkeypatch.setattr(convergence, "run_with_timeout",
                        lambda cmd, timeout_s, env=None: (seen.append(timeout_s), ("finished", 0.1, None))[1])
    cfg = convergence.ConvergenceConfig(seeds=(0,), budget_s=100.0)
    live = convergence._run_subprocess(cfg, "vanilla", 0, tmp_path, time.monotonic() + 50.0)
    assert live.status == "finished" and 49.0 < seen[0] <= 50.0
    late = convergence._run_subprocess(cfg, "fresh", 0, tmp_path, time.monotonic() - 1.0)
    assert late.status == "stopped" and late.curve == [] and len(seen) == 1


# ------------------------------------------------------------------------------ regroup figures
def test_regroup_summary_reports_the_time_lost_without_the_shared_step():
    from benchmarks.regroup import _summary, layers_for, transformer_mb

    assert layers_for(256.0) == 2 and abs(transformer_mb(2) - 315.5) < 1.0  # the bench's 316 MB transformer
    parts = {"leave_s": 0.02, "transfer_s": 0.01, "regroup_s": 0.02}
    warm = [parts | {"total_s": t, "step_s": t - 0.05, "steady_step_s": s, "lost_s": t - s, "diff": 0.0,
                     "source": ["same_node_peer"]} for t, s in ((0.20, 0.10), (0.16, 0.09), (0.30, 0.11))]
    cold = [{"total_s": t, "regroup_s": 1.0, "step_s": 0.2, "steady_step_s": s, "lost_s": t - s, "diff": d}
            for t, s, d in ((5.0, 0.12, 0.0), (6.0, 0.10, 1e-7), (4.0, 0.08, 0.0))]
    out = _summary({"layers": 2, "model_mb": transformer_mb(2), "publish_s": 0.5}, warm, cold)
    assert out["warm_regroup_median_s"] == pytest.approx(0.10)   # median of 0.10, 0.07, 0.19
    assert out["cold_restart_median_s"] == pytest.approx(4.88)   # median of 4.88, 5.90, 3.92
    assert out["speedup"] == pytest.approx(48.8)
    assert out["warm_total_median_s"] == 0.20 and out["cold_total_median_s"] == 5.0
    assert out["speedup_including_step"] == pytest.approx(25.0)
    assert out["steady_step_median_s"] == 0.10 and out["cold_steady_step_median_s"] == 0.10
    assert out["warm_samples_s"] == pytest.approx([0.10, 0.07, 0.19])
    assert out["sp_max_abs_diff"] == pytest.approx(1e-7)
    assert out["warm_parts_median_s"]["regroup_s"] == 0.02 and out["newcomer_weight_sources"] == ["same_node_peer"]


def test_report_lists_the_regroup_speedup_with_and_without_the_step():
    from benchmarks.appendix import _mechanism_section

    regroup = {"warm_regroup_median_s": 0.078, "cold_restart_median_s": 5.07, "speedup": 65.0,
               "sp_max_abs_diff": 4.8e-7, "speedup_including_step": 29.8, "definition": "time lost"}
    text = _mechanism_section({"mechanisms": {"regroup": regroup}}, {})
    assert "| regroup | speedup (time lost) | 65.0x | >= 50 | - |" in text
    assert "| regroup | speedup with the first denoising step included | 29.8x | - | - |" in text
    older = {k: v for k, v in regroup.items() if k not in ("speedup_including_step", "definition")}
    older_text = _mechanism_section({"mechanisms": {"regroup": older}}, {})
    assert "| regroup | speedup | 65.0x | >= 50 | - |" in older_text and "included" not in older_text


def test_report_lists_the_planner_budget_and_ablation():
    from benchmarks.appendix import _mechanism_section

    planner = {"planner_over_uniform": 1.292, "planner_over_uniform_with_abandon": 1.127, "planner_over_oracle": 0.930,
               "planner_unscreened_over_oracle": 0.884, "decision_time_ms_per_pull": 0.269,
               "setup": {"n_prompts": 64, "group_size": 8, "seeds_per_pull": 4, "budget_pulls": 102}}
    text = _mechanism_section({"mechanisms": {"planner": planner}}, {})
    assert "| planner | planner_over_oracle | 0.930 | >= 0.95 | - |" in text
    assert "no screening) | 0.884 |" in text
    assert "| planner | budget: explored seeds per prompt (groups of 8; the simulator's cost model at 512x512) | 6.38 |" in text
    older = {k: v for k, v in planner.items() if k not in ("planner_unscreened_over_oracle", "setup")}
    older_text = _mechanism_section({"mechanisms": {"planner": older}}, {})
    assert "screening" not in older_text and "budget" not in older_text
    swept = planner | {"budget_sweep": [{"seeds_per_prompt": 4.0, "planner_over_oracle": 0.9098, "planner_over_uniform": 1.21},
                                        {"seeds_per_prompt": 6.375, "planner_over_oracle": 0.9626,
                                         "planner_over_uniform": 1.34}]}
    swept_text = _mechanism_section({"mechanisms": {"planner": swept}}, {})
    assert ("| planner | planner_over_oracle across budgets (explored seeds per prompt: ratio) | 4: 0.910; "
            "6.375: 0.963 | >= 0.95 at every budget | - |") in swept_text
    assert "planner_over_uniform across budgets" in swept_text and "across budgets" not in text


def test_report_mean_rank_skips_undefined_correlations():
    from benchmarks.appendix import _mean_rank

    assert _mean_rank([]) == "-"
    assert _mean_rank([0.5, 0.7]) == "0.6000"
    assert _mean_rank([0.5, float("nan"), 0.7]) == "0.6000 (2 of 3 defined)"
    assert _mean_rank([float("nan")]) == "undefined in all 1"


def test_cli_picks_convergence_settings_and_seeds():
    from benchmarks.suite import build_parser, config_from_args

    args = build_parser().parse_args(["--convergence-settings", "vanilla", "spotlight", "vanilla",
                                      "--convergence-seeds", "3", "4"])
    conv = config_from_args(args).convergence
    assert conv.settings == ("vanilla", "spotlight")
    assert conv.runs == [("vanilla", 3), ("spotlight", 3), ("vanilla", 4), ("spotlight", 4)]
    assert config_from_args(build_parser().parse_args([])).convergence.settings == ("vanilla", "fresh", "spotlight")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--convergence-settings", "greedy"])


def _saved(setting_seeds, overrides=("max_steps=10",)):
    runs = [{"setting": s, "seed": seed, "status": "finished", "wall_s": 1.0,
             "curve": [{"iteration": 0, "val_reward": 0.5}, {"iteration": 2, "val_reward": 0.6 + 0.01 * seed}]}
            for s, seed in setting_seeds]
    return {"kind": "measured", "budget": {"overrides": list(overrides)}, "runs": runs}


def test_saved_convergence_results_merge_into_one_study(tmp_path):
    from benchmarks.suite import SuiteConfig, _convergence, build_parser, config_from_args

    a, b = tmp_path / "seeds012.json", tmp_path / "seeds3.json"
    a.write_text(json.dumps(_saved([("vanilla", 0), ("spotlight", 0), ("vanilla", 1), ("spotlight", 1)])))
    b.write_text(json.dumps(_saved([("vanilla", 3), ("spotlight", 3)])))
    cfg = config_from_args(build_parser().parse_args(["--convergence-json", str(a), str(b)]))
    assert cfg.convergence_json == (a, b)
    result = _convergence(cfg)
    assert sorted((r["setting"], r["seed"]) for r in result["runs"]) == [
        ("spotlight", 0), ("spotlight", 1), ("spotlight", 3), ("vanilla", 0), ("vanilla", 1), ("vanilla", 3)]
    assert result["summary"]["estimates"]["vanilla"]["runs"] == 3
    assert result["summary"]["target"] == pytest.approx((0.60 + 0.61 + 0.63) / 3)
    assert str(a) in result["source"] and str(b) in result["source"]
    assert SuiteConfig().convergence_json == ()


def test_merging_refuses_repeated_runs_and_other_overrides(tmp_path):
    from benchmarks.suite import merge_saved_runs

    one = _saved([("vanilla", 0)])
    with pytest.raises(ValueError, match="vanilla seed 0 is in both a.json and b.json"):
        merge_saved_runs([Path("a.json"), Path("b.json")], [one, _saved([("vanilla", 0)])])
    with pytest.raises(ValueError, match="a.json trained with overrides"):
        merge_saved_runs([Path("a.json"), Path("b.json")],
                         [one, _saved([("vanilla", 1)], overrides=("exploration.seeds_per_prompt=64",))])
    no_budget = {"runs": _saved([("vanilla", 2)])["runs"]}  # benchmarks/convergence.py output keeps none
    assert len(merge_saved_runs([Path("a.json"), Path("c.json")], [one, no_budget])) == 2


def test_paired_gain_uses_common_validations_of_the_same_seeds():
    from benchmarks.convergence import paired_gain, summarize

    def rec(setting, seed, values, step=2):
        return RunRecord(setting, seed, "finished", 1.0,
                         [{"iteration": i * step, "val_reward": v} for i, v in enumerate(values)])

    records = [rec("vanilla", 0, [0.5, 0.52, 0.54, 0.56]), rec("spotlight", 0, [0.5, 0.55, 0.56, 0.60]),
               rec("vanilla", 1, [0.5, 0.50, 0.52, 0.58]), rec("spotlight", 1, [0.5, 0.51, 0.50]),  # stopped early
               rec("spotlight", 7, [0.5, 0.9])]                                                   # no vanilla twin
    g = paired_gain(records, "spotlight")
    assert g["seeds"] == [0, 1]
    # seed 0: (0.03 + 0.02 + 0.04) / 3; seed 1 over iterations 2 and 4 only: (0.01 - 0.02) / 2
    assert g["curve"]["per_seed"] == pytest.approx([0.03, -0.005])
    assert g["final"]["per_seed"] == pytest.approx([0.04, -0.02])
    assert g["curve"]["mean"] == pytest.approx(0.0125)
    assert g["curve"]["se"] == pytest.approx(np.std([0.03, -0.005], ddof=1) / np.sqrt(2))
    assert paired_gain(records, "fresh") is None
    assert paired_gain([rec("vanilla", 0, [0.5]), rec("spotlight", 0, [0.5])], "spotlight") is None
    summary = summarize(records, 0.55, "given")
    assert summary["final_mean"]["spotlight"] == pytest.approx((0.60 + 0.50 + 0.9) / 3)
    assert set(summary["paired_vs_vanilla"]) == {"spotlight"}


def test_report_shows_the_paired_differences():
    from benchmarks.convergence import summarize
    from benchmarks.appendix import _convergence_section

    records = [RunRecord(s, seed, "finished", 1.0, [{"iteration": 0, "val_reward": 0.5},
                                                    {"iteration": 2, "val_reward": v}])
               for s, seed, v in [("vanilla", 0, 0.55), ("spotlight", 0, 0.57), ("vanilla", 1, 0.53),
                                  ("spotlight", 1, 0.54)]]
    conv = {"summary": summarize(records, None, "given"), "runs": []}
    text = _convergence_section({"convergence": conv}, {})
    assert "| spotlight | 2 | 0.5550 | +0.0150 +- 0.0050 | +0.0150 +- 0.0050 |" in text


# ------------------------------------------------------------------------------ shapes, fair cost, reuse
def _fair_sim(ondemand, spot, v_time, s_time, f_time, cost=10.0):
    sim = _sim(v_time, s_time, cost, cost * 0.9)
    sim["cluster"] = {"ondemand_gpus": ondemand, "spot_gpus": spot}
    sim["baselines"]["vanilla_fair_cost"] = {"time_per_iteration_s": f_time, "cost_per_iteration_usd": cost,
                                             "ondemand_gpus": ondemand + 1}
    return sim


def test_headline_has_both_vanillas_and_keeps_censored_medians_apart():
    from benchmarks.headline import iterations_note

    sims = {512: _fair_sim(4, 8, 300.0, 150.0, 240.0)}
    exact = headline({"vanilla": _est(30), "spotlight": _est(10)}, sims, shape="paper")
    assert [(r.shape, r.metric, r.baseline) for r in exact] == [
        ("paper", "time", "vanilla"), ("paper", "time", "vanilla_fair_cost"),
        ("paper", "cost", "vanilla"), ("paper", "cost", "vanilla_fair_cost")]
    fair_time = exact[1]
    assert fair_time.per_iteration == pytest.approx(1.6) and fair_time.total.value == pytest.approx(4.8)
    assert fair_time.met is True and fair_time.at_medians is None and "5 on-demand GPUs" in fair_time.why
    # both medians censored: no total, no verdict, the medians' ratio only as a labelled reference
    censored = {"vanilla": _est(10, "lower") | {"reached": 4, "runs": 6},
                "spotlight": _est(10, "lower") | {"reached": 3, "runs": 6}}
    rows = headline(censored, sims)
    assert all(r.total.value is None and r.met is None for r in rows)
    assert rows[0].at_medians == pytest.approx(2.0) and "undetermined" in rows[0].why
    note = iterations_note(censored)
    assert note.startswith("undetermined") and "lower bounds" in note and "1.00" in note
    assert iterations_note({"vanilla": _est(10), "spotlight": _est(10)}).startswith("exactly 1.00")
    assert iterations_note({"vanilla": _est(20, "lower"), "spotlight": _est(10)}).startswith(">= 2.00x, a lower bound")
    assert iterations_note({}).startswith("not measured")
    # a simulation without the fair-cost vanilla gives equal-on-demand rows only
    assert {r.baseline for r in headline({}, {512: _sim(200.0, 100.0, 10.0, 8.0)})} == {"vanilla"}


def test_report_lists_both_shapes_both_vanillas_and_the_budget():
    from roll_spotlight.sim.api import simulate
    from benchmarks.appendix import _budget_section, _headline_section, _to_target_section
    from benchmarks.report import _shapes

    tiny = {"prompts_per_iteration": 4, "group_size": 4}

    def sim(od, spot):
        return simulate(None, resolution=512, ondemand=od, spot=spot, iterations=1, cost_model=tiny,
                        baselines=("vanilla", "naive_spot", "spotlight", "spotlight_train"), fair_cost=True)
    result = {"simulator": {"by_resolution": {"512": sim(8, 8)},
                            "other_shapes": [{"name": "paper", "ondemand": 4, "spot": 8,
                                              "by_resolution": {"512": sim(4, 8)}}]},
              "cheap_exploration": {"command": "rank", "rows": [
                  {"kind": "sde", "num_steps": 2, "spearman": 0.01, "spearman_se": 0.04},
                  {"kind": "sde", "num_steps": 10, "spearman": 0.78, "spearman_se": 0.06}]}}
    shapes = _shapes(result)
    assert [label for label, _ in shapes] == ["today: 8 on-demand + 8 spot", "paper: 4 reserved + 8 spot"]
    estimates = {"vanilla": _est(10, "lower") | {"reached": 4, "runs": 6},
                 "spotlight": _est(10, "lower") | {"reached": 3, "runs": 6}}
    text = _headline_section(estimates, shapes, result)
    today = "Spotlight today (explore during training)"
    for label, _ in shapes:
        for against in ("vanilla, equal on-demand GPUs", "vanilla, equal cost"):
            assert f"| {label} | 512x512 | time | {today} | {against} | 4x | >= 4x | **undetermined** |" in text
            # spot training and naive spot take vanilla's iterations: the ratio is known although censored
            for system in ("naive spot (rollouts only)", "Spotlight with spot training"):
                row = next(line for line in text.splitlines()
                           if line.startswith(f"| {label} | 512x512 | time | {system} | {against} |"))
                assert "| 1.00x (by construction) |" in row and "undetermined" not in row
    assert "cluster (SIMULATED)" in text and "neither known nor bounded" in text
    budget = _budget_section(result, shapes)
    assert "| paper: 4 reserved + 8 spot | 512x512 |" in budget and "(vs 4)" in budget and "(vs 8)" in budget
    assert "SDE 10 steps +0.78 +- 0.06" in budget and "full rollout" in budget and "N_fair" in budget
    table = _to_target_section(estimates, shapes, {})
    paper_fair = shapes[1][1][512]["fair_cost"]["ondemand_gpus"]
    assert paper_fair == 4 + int(8 * 2.372376 / 10.315679245)      # the default H100 prices: 5
    assert f"| vanilla_fair_cost | {paper_fair} + 0 |" in table and "| spotlight | 4 + 8 |" in table
    assert "| spotlight_train | 4 + 8 |" in table and "| vanilla_fair_cost:spotlight_train |" in table
    assert shapes[1][1][512]["fair_cost"]["by_baseline"]["spotlight_train"]["ondemand_gpus"] >= 4


def test_saved_studies_merge_seed_files_and_mark_the_headline(tmp_path):
    from benchmarks.suite import saved_studies

    (tmp_path / "convergence.json").write_text(json.dumps(_saved([("vanilla", 0), ("spotlight", 0)])))
    (tmp_path / "convergence_seeds12.json").write_text(json.dumps(_saved([("vanilla", 1), ("spotlight", 1)])))
    (tmp_path / "convergence_other.json").write_text(json.dumps(_saved([("vanilla", 0), ("vanilla", 0)])))
    studies = {s["study"]: s for s in saved_studies(tmp_path, [tmp_path / "convergence.json",
                                                               tmp_path / "convergence_seeds12.json"])}
    main = studies["convergence"]
    assert main["headline"] and len(main["files"]) == 2 and main["estimates"]["vanilla"]["runs"] == 2
    assert main["overrides"] == ["max_steps=10"] and main["note"] and main["ratio"]["bound"] in (
        "exact", "lower", "upper", "unknown")
    assert "error" in studies["convergence_other"] and not studies["convergence_other"]["headline"]


def test_mechanism_results_are_reused_and_named(tmp_path):
    from benchmarks.suite import build_parser, config_from_args, saved_mechanisms

    saved = tmp_path / "bench_all.json"
    saved.write_text(json.dumps({"mechanisms": {"planner": {"planner_over_oracle": 0.93},
                                                "regroup": {"error": "boom"},
                                                "queue": {"x": 1, "reused_from": "older.json"}}}))
    mech = saved_mechanisms(saved)
    assert set(mech) == {"planner", "queue"}        # a failed result is measured again, not reused
    assert mech["planner"]["reused_from"] == str(saved) and mech["queue"]["reused_from"] == "older.json"
    cfg = config_from_args(build_parser().parse_args(["--mechanisms-json", str(saved), "--paper-shape", "2", "6"]))
    assert cfg.mechanisms_json == saved and cfg.other_shapes == (("paper", 2, 6), ("spot-heavy", 2, 14))
    heavy = config_from_args(build_parser().parse_args(["--spot-heavy-shape", "1", "15"]))
    assert heavy.other_shapes == (("paper", 4, 8), ("spot-heavy", 1, 15))
    assert config_from_args(build_parser().parse_args([])).other_shapes == (("paper", 4, 8), ("spot-heavy", 2, 14))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="mechanisms"):
        saved_mechanisms(tmp_path / "bad.json")


def test_report_puts_the_verdict_first_and_the_rest_in_the_appendix(tmp_path, monkeypatch):
    from benchmarks import appendix
    from benchmarks.report import APPENDIX, write_report
    from roll_spotlight.sim.api import simulate

    tiny = {"prompts_per_iteration": 4, "group_size": 4}

    def sim(od, spot):
        return simulate(None, resolution=512, ondemand=od, spot=spot, iterations=1, cost_model=tiny,
                        baselines=("vanilla", "naive_spot", "spotlight", "spotlight_train"), fair_cost=True)
    today, paper = sim(8, 8), sim(4, 8)
    vanilla_s, train_s = today["baselines"]["vanilla"], today["baselines"]["spotlight_train"]
    emulated = [{"row": {"ondemand": 8, "spot": 8, "resolution": 512, "time_scale": 30.0}, "system": system,
                 "emulated": {"time_per_iteration_s": s, "cost_per_iteration_usd": usd}}
                for system, s, usd in (("vanilla", 300.0, 6.0), ("spotlight_train", 100.0, 4.0))]
    result = {"command": "bench", "simulator": {"by_resolution": {"512": today}, "other_shapes": [
        {"name": "paper", "ondemand": 4, "spot": 8, "by_resolution": {"512": paper}}]},
        "emulated": {"rows": emulated}}
    monkeypatch.setattr(appendix, "_emulated_section", lambda result: "")  # its rows need the whole emulate JSON
    text = write_report(result, tmp_path).read_text()
    lines = text.splitlines()
    assert len(lines) <= 150 and (tmp_path / APPENDIX).is_file() and (tmp_path / "verdict.png").is_file()
    head = "\n".join(lines[:40])
    simulated = vanilla_s["time_per_iteration_s"] / train_s["time_per_iteration_s"]
    row = next(line for line in lines[:40] if line.startswith("| today: 8 + 8 spot | 512x512 |"))
    # no convergence study: spot training still takes vanilla's iterations (1.00 by construction)
    assert f"| **{simulated:.2f}x** | 3.00x | 4x | >= 4x | MISSED / MISSED |" in row
    assert "| **" in row and "| 1.50x | 1.4-6.4x | >= 2x |" in row
    paper_row = next(line for line in lines[:40] if line.startswith("| paper: 4 + 8 spot | 512x512 |"))
    assert paper_row.count("| - |") == 2  # not emulated: no EMULATED figure, no verdict of that kind
    assert "## Verdict" in head and "EMULATED: 3.00x better than vanilla on demand across 1 cluster shape;" in head
    assert "## Headline" not in text and "## Headline" in (tmp_path / APPENDIX).read_text()


def test_report_quotes_batched_rows_beside_batch_1_and_the_calibration():
    from benchmarks.report import _batching_section

    def systems(vanilla_s, spot_s):
        row = lambda t: {"time_per_iteration_s": t, "cost_per_iteration_usd": t / 100}
        return {"vanilla": row(vanilla_s), "spotlight_train": row(spot_s), "managed_spot": row(2 * vanilla_s)}

    batching = {
        "shapes": [{"shape": "8+8", "resolution": 512, "mode": "batched", "max_batch": 16, "systems": systems(100.0, 50.0)},
                   {"shape": "8+8", "resolution": 512, "mode": "batch 1", "max_batch": 1, "systems": systems(160.0, 90.0)}],
        "vanilla_rollout": {"512": {"max_batch": 16, "rollout_speedup": 2.1, "iteration_speedup": 1.5,
                                    "wall_s": {"batched": {"rollout": 54.0}, "batch 1": {"rollout": 113.0}}}},
        "calibration": {"rows": [{"run": "LoRA 4 x H800", "published_s": 420.0, "simulated_s": 441.0,
                                  "gap": 0.05}]}}
    text = _batching_section({"batching": batching})
    assert "| 8+8 | 512 | batched (16) | 100.0 | 50.0 (2.00x) | 200.0 |" in text
    assert "| 8+8 | 512 | batch 1 (1) | 160.0 | 90.0 (1.78x) | 320.0 |" in text
    assert "113.0 s at batch 1, 54.0 s at batch 16 (2.10x" in text
    assert "| LoRA 4 x H800 | 420 | 441.0 | +5.0% |" in text
    assert _batching_section({}) == ""


def test_report_shows_emulated_batched_beside_max_batch_1():
    from benchmarks.report import _emulated_batching_rows

    def run(vanilla_s, spot_s):
        shape = {"name": "8+8 512", "time_scale": 10.0}
        row = lambda system, t: {"system": system, "row": shape, "emulated": {"time_per_iteration_s": t},
                                 "simulated": {"time_per_iteration_s": t / 2}}
        return {"rows": [row("vanilla", vanilla_s), row("spotlight_train", spot_s)]}

    lines = _emulated_batching_rows({"batched": run(120.0, 60.0), "max_batch 1": None})
    assert "| 8+8 512 | batched | 10 | 120.0 (60.0) | 60.0 (30.0) | 2.00x (2.00x) |" in lines
    assert not any("max_batch 1" in line for line in lines)
    assert _emulated_batching_rows({}) == []
