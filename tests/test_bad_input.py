"""Bad input fails at start-up with a message naming the key, file or line, and leaves no
half-written run directory behind. One test per case.

`spotlight train` validates and builds everything (config, model directory, reward) before it
creates the run directory; these cases all fail before any pretraining or rollout.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from roll_spotlight.cli import main
from roll_spotlight.config.strict import ConfigError, load_yaml
from tests.runtime_helpers import REPO

CONFIG = REPO / "configs" / "tiny_shapes.yaml"


def _train(tmp_path: Path, capsys, config: Path = CONFIG, *overrides: str) -> str:
    """Run `spotlight train`; assert exit 2 and no run directory; return stderr."""
    run_dir = tmp_path / "run"
    args = ["train", "--config", str(config), "--run-dir", str(run_dir), "--no-progress"]
    code = main(args + [x for o in overrides for x in ("-o", o)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not run_dir.exists(), "a failed start must not leave a run directory behind"
    assert not list(tmp_path.glob("runs*")), "nor anything under the default output_dir"
    return err


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_malformed_yaml_names_the_file_and_line(tmp_path, capsys):
    path = _yaml(tmp_path, "exp_name: x\ntrain:\n  group_size: 4\n   learning_rate: 1.0e-4\n")
    err = _train(tmp_path, capsys, path)
    assert str(path) in err and "line 4" in err


def test_unclosed_flow_mapping_names_the_file_and_line(tmp_path, capsys):
    path = _yaml(tmp_path, "exp_name: x\ntrain: {group_size: 4\n")
    err = _train(tmp_path, capsys, path)
    assert str(path) in err and "line 2" in err


def test_unknown_key_in_a_file_names_the_key_and_the_file(tmp_path, capsys):
    path = _yaml(tmp_path, CONFIG.read_text().replace("  clip_range:", "  clip_rnage:"))
    err = _train(tmp_path, capsys, path)
    assert "train.clip_rnage" in err and str(path) in err


def test_wrong_type_names_the_key(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "sampling.num_steps=ten")
    assert "sampling.num_steps" in err and "ten" in err


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "four"])
def test_max_batch_not_a_positive_integer_names_the_key(tmp_path, capsys, value):
    err = _train(tmp_path, capsys, CONFIG, f"sampling.max_batch={value}")
    assert "sampling.max_batch" in err and value in err and len(err.strip().splitlines()) == 1, err


def test_max_batch_in_a_roll_recipe_names_the_key_and_the_file():
    from roll_spotlight.roll.sections import validate_recipe

    path = REPO / "configs" / "roll" / "tiny_shapes_roll.yaml"
    with pytest.raises(ConfigError) as info:
        validate_recipe(load_yaml(path, ["sampling.max_batch=0"]), source=str(path))
    assert "sampling.max_batch" in str(info.value) and str(path) in str(info.value)


def test_a_batch_the_gpu_cannot_hold_names_the_key_and_what_fits(tmp_path, capsys):
    recipe = REPO / "configs" / "qwen_image_geneval_1280.yaml"     # model.gpu_memory_gb: 80
    err = _train(tmp_path, capsys, recipe, "sampling.max_batch=64")
    assert "sampling.max_batch=16" in err and "model.gpu_memory_gb=80" in err and len(err.strip().splitlines()) == 1
    code = main(["train", "--config", str(REPO / "configs" / "qwen_image_ocr_512.yaml"), "--run-dir",
                 str(tmp_path / "run"), "--emulate", "h100", "-o", "sampling.max_batch=200"])
    err = capsys.readouterr().err
    assert code == 2 and "--emulate h100" in err and "sampling.max_batch=" in err and not (tmp_path / "run").exists()


def test_check_prints_the_largest_batch_that_fits(tmp_path, capsys):
    main(["train", "--config", str(REPO / "configs" / "qwen_image_ocr_512.yaml"), "--check"])
    out = capsys.readouterr().out
    assert "sampling.max_batch=16; the largest that fits model.gpu_memory_gb=80: " in out


def test_group_size_below_two_names_the_key(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "train.group_size=1")
    assert "train.group_size" in err


def test_negative_exploration_budget_names_the_key(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "exploration.mode=stale", "exploration.seeds_per_prompt=-8")
    assert "exploration.seeds_per_prompt" in err and "-8" in err


def test_dispatch_keys_the_standalone_host_cannot_run_name_the_key(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "dispatch.mode=static")
    assert "dispatch.mode='static'" in err and "pull" in err and str(CONFIG) in err
    err = _train(tmp_path, capsys, CONFIG, "dispatch.scheduler=fifo")
    assert "fifo" in err and "pull_queue" in err


def test_sp_degree_not_dividing_the_heads_names_both_keys_and_the_file():
    """The SP degree lives in the ROLL recipe's `elastic` section (parsed without ROLL)."""
    from roll_spotlight.roll.sections import validate_recipe

    path = REPO / "configs" / "roll" / "tiny_shapes_roll.yaml"
    data = load_yaml(path, ["elastic.sp_degree=3"])
    with pytest.raises(ConfigError) as info:
        validate_recipe(data, source=str(path))
    message = str(info.value)
    assert "elastic.sp_degree=3" in message and "model.num_attention_heads" in message and str(path) in message


def test_spot_nodes_that_sp_groups_cannot_tile_fail_at_start_up_naming_both_keys(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(CONFIG), "--run-dir", str(run_dir), "--no-progress", "--ray",
                 "--sp-degree", "2", "-o", "spot.enabled=true", "-o", "spot.gpus_per_node=3"])
    err = capsys.readouterr().err
    assert code == 2 and "spot.gpus_per_node=3 does not fit --sp-degree=2" in err, err
    assert not run_dir.exists()


def test_missing_model_directory_names_the_key_and_the_path(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    err = _train(tmp_path, capsys, CONFIG, "model.preset=qwen_image", f"model.path={missing}", "model.image_size=32")
    assert "model.path" in err and str(missing) in err


def test_unknown_reward_name_lists_the_known_ones(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "reward.name=no_such_reward")
    assert "no_such_reward" in err and "shapes" in err


def test_reward_kwargs_the_reward_does_not_take_name_the_key(tmp_path, capsys):
    err = _train(tmp_path, capsys, CONFIG, "reward.kwargs.colour=1")
    assert "reward.kwargs" in err and "colour" in err


def test_reward_section_that_is_not_a_mapping_names_the_key_and_file(tmp_path, capsys):
    text, replaced = re.subn(r"reward:\n  name: shapes\n  kwargs: \{mode: \w+\}\n", "reward: shapes\n",
                             CONFIG.read_text())
    assert replaced == 1, "the test config's reward section changed shape"
    path = _yaml(tmp_path, text)
    err = _train(tmp_path, capsys, path)
    assert "reward" in err and "mapping" in err and str(path) in err


def test_missing_config_file_is_named(tmp_path, capsys):
    err = _train(tmp_path, capsys, tmp_path / "nope.yaml")
    assert "nope.yaml" in err


def test_malformed_trace_names_the_file_and_line(tmp_path, capsys):
    from benchmarks.soak import main as soak_main

    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,n1\n0,add,n2\n12x,remove,n1\n")
    assert soak_main(["--trace", str(trace), "--minutes", "0.01"]) == 2
    assert f"{trace}:3" in capsys.readouterr().err


def test_malformed_trace_for_training_names_the_file_and_line(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,n1\n5,add,n2\n3,remove,n1\n")  # time goes backwards on line 3
    err = _train(tmp_path, capsys, CONFIG, f"spot.trace={trace}", "spot.enabled=true")
    assert f"{trace}:3" in err


def test_missing_trace_file_is_named(tmp_path, capsys):
    from benchmarks.soak import main as soak_main

    assert soak_main(["--trace", str(tmp_path / "gone.csv"), "--minutes", "0.01"]) == 2
    assert "gone.csv" in capsys.readouterr().err


def test_negative_soak_minutes_names_the_option(capsys):
    from benchmarks.soak import main as soak_main

    assert soak_main(["--minutes", "-1"]) == 2
    assert "--minutes" in capsys.readouterr().err
