"""benchmarks/gpu_check.py --tiny on CPU: the JSON has the schema the cost model's calibration reads."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")
pytest.importorskip("accelerate")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--device", "cpu",
           "--warmup", "1", "--repeats", "2", "--tests", "tests/test_gpu_check.py", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    return {"path": out, "data": json.loads(out.read_text())}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def test_json_schema(tiny_run):
    data = tiny_run["data"]
    assert data["schema"] == "roll_spotlight.gpu_check/1" and data["kind"] == "measured"
    assert data["device"]["type"] == "cpu" and data["device"]["total_memory_gib"] is None
    config = data["config"]
    assert config["tiny"] is True and config["dtype"] == "bfloat16" and config["attention_backend"] == "native"
    assert config["lora"]["params"] == config["lora"]["params_formula"] > 0
    assert config["lora"]["targets"] and config["lora"]["dtype"] == "float32"
    assert set(data["resolutions"]) == {"32", "64"}
    for res, entry in data["resolutions"].items():
        assert entry["image_tokens"] == (int(res) // 16) ** 2
        for phase in ("guided_step", "train_micro_step", "optimizer_step"):
            m = entry[phase]
            assert _is_number(m["median_s"]) and m["median_s"] > 0
            assert len(m["times_s"]) == 2 and min(m["times_s"]) <= m["median_s"] <= max(m["times_s"])
            assert m["peak_gib"] is None  # CPU: no CUDA allocator to ask
        for role in ("trainer", "rollout"):
            assert all(_is_number(v) and v >= 0 for v in entry["memory_plan_gib"][role].values())
        sweep = entry["batch_sweep"]
        assert list(sweep) == ["1", "2", "4"]        # --tiny's default batches
        for batch, m in sweep.items():
            assert m["oom"] is False and m["rows"] == 2 * int(batch) and len(m["times_s"]) == 2
            assert m["per_sample_s"] == pytest.approx(m["median_s"] / int(batch)) and m["peak_gib"] is None
    assert _is_number(data["load"]["build_s"]) and data["elapsed_s"] > 0


def test_gpu_tests_were_run_and_counted(tiny_run):
    tests = tiny_run["data"]["gpu_tests"]
    assert tests["ran"] and not tests["timed_out"] and tests["returncode"] == 0
    assert tests["failed"] == tests["errors"] == 0
    assert tests["passed"] + tests["skipped"] >= 1  # on CPU the gpu-marked test below is skipped
    assert tests["deselected"] >= 4  # this file's other tests


def test_the_cost_model_reads_the_tiny_run(tiny_run):
    from roll_spotlight.sim.costmodel import CostModel

    path = tiny_run["path"]
    with pytest.raises(ValueError, match="written with --tiny"):
        CostModel().with_calibration(path, 512)
    cost = CostModel().with_calibration(path, 64, allow_tiny=True)
    measured = tiny_run["data"]["resolutions"]["64"]
    assert cost.calibration == str(path)
    assert cost.step_s(64, serial=True) == pytest.approx(measured["guided_step"]["median_s"])
    assert cost.train_s(1, 64, 1) == pytest.approx(cost.trained_steps * measured["train_micro_step"]["median_s"])


def test_the_sweep_batches_by_resolution_and_flag():
    module = _module()
    assert module.sweep_batches(module.parse_args([]), 512) == [1, 2, 4, 8, 16, 32]
    assert module.sweep_batches(module.parse_args([]), 1280) == [1, 2, 4, 8]
    assert module.sweep_batches(module.parse_args(["--batches", "4,1,4"]), 1280) == [1, 4]
    assert module.sweep_batches(module.parse_args(["--batches", ""]), 512) == []
    for bad in ("0", "two"):
        with pytest.raises(SystemExit):
            module.parse_args(["--batches", bad])


def _module():
    spec = __import__("importlib.util").util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pytest_summary_parsing():
    module = _module()
    counts = module.parse_pytest_summary("....\n3 passed, 1 failed, 2 skipped, 40 deselected, 1 error in 9.1s\n")
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["deselected"], counts["errors"]) == (3, 1, 2, 40, 1)
    assert module.parse_pytest_summary("")["passed"] == 0


@pytest.mark.gpu
def test_tiny_check_on_cuda_reports_peak_memory(tmp_path):
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--device", "cuda",
           "--repeats", "2", "--tests", "", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["device"]["type"] == "cuda" and data["device"]["total_memory_gib"] > 0
    for entry in data["resolutions"].values():
        assert entry["train_micro_step"]["peak_gib"] >= entry["guided_step"]["peak_gib"] > 0
        peaks = [m["peak_gib"] for m in entry["batch_sweep"].values()]
        assert all(p > 0 for p in peaks) and peaks[-1] >= peaks[0]     # more rows, more activations
    assert data["gpu_tests"] == {"ran": False}
