"""Tier 1: `python -m benchmarks.emulate --max-batch`: the emulated runs and the simulator beside them
denoise the same way."""
import pytest

from benchmarks import emulate
from benchmarks.emulate import ROWS, EmulateBenchConfig, main, run_config, sim_rollout


def test_the_simulator_runs_the_emulated_workers_mode(monkeypatch, tmp_path):
    monkeypatch.setattr(emulate, "EMULATED_SERIAL", True)
    assert sim_rollout(EmulateBenchConfig(max_batch=4)) == {"serial_rollout": True}
    monkeypatch.setattr(emulate, "EMULATED_SERIAL", False)
    assert sim_rollout(EmulateBenchConfig()) == {"max_batch": 16}          # the 512 recipe's sampling.max_batch
    assert sim_rollout(EmulateBenchConfig(max_batch=1)) == {"max_batch": 1}
    prompts = tmp_path / "p"
    assert run_config(EmulateBenchConfig(max_batch=1), ROWS[0], "vanilla", prompts, 0.0).sampling.max_batch == 1
    assert run_config(EmulateBenchConfig(), ROWS[0], "vanilla", prompts, 0.0).sampling.max_batch == 16


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_max_batch_below_one_is_one_line_exit_2(capsys, value):
    assert main(["--max-batch", value]) == 2
    err = capsys.readouterr().err
    assert "--max-batch must be >= 1" in err and len(err.strip().splitlines()) == 1
