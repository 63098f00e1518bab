"""ROLL recipes in configs/roll: every recipe validates, vanilla twins differ only in Spotlight
components, and the adapter imports without ROLL. Tests marked `roll` also parse with ROLL."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from roll_spotlight.config.strict import ConfigError, load_yaml
from roll_spotlight.roll.sections import COMPONENT_KEYS, check_top_level_keys, validate_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "configs" / "roll").glob("*.yaml"))
TWINS = [p for p in RECIPES if (p.parent / f"{p.stem}_vanilla.yaml").is_file()]


def _flatten(data, prefix=""):
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            out |= _flatten(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): data}


def test_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"tiny_shapes_roll", "tiny_shapes_roll_vanilla", "qwen_image_ocr_512", "qwen_image_ocr_512_vanilla",
            "qwen_image_geneval_1280", "qwen_image_geneval_1280_vanilla", "qwen_image_pickscore_512",
            "qwen_image_pickscore_512_vanilla"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_without_roll(path):
    sections, run_cfg = validate_recipe(load_yaml(path), source=str(path))
    assert run_cfg.exp_name == path.stem
    assert run_cfg.max_steps >= 1


def test_1280_recipes_run_rollouts_in_sp_groups_of_4_that_tile_their_rollout_ranks():
    for name in ("qwen_image_geneval_1280", "qwen_image_geneval_1280_vanilla"):
        data = load_yaml(ROOT / f"configs/roll/{name}.yaml")
        sections, run_cfg = validate_recipe(data)
        assert run_cfg.model.image_size == 1280 and sections.elastic.sp_degree == 4
        assert run_cfg.model.preset == "qwen_image" and run_cfg.model.path
        assert "SP groups of 4" in sections.elastic.rollout_summary()
        ranks = eval(data["actor_infer"]["device_mapping"], {"range": range, "list": list})  # ROLL's own syntax
        assert len(ranks) % 4 == 0 and all(ranks[i] // 8 == ranks[i + 3] // 8 for i in range(0, len(ranks), 4)), \
            "each SP group of consecutive rollout ranks sits on one 8-GPU node"


def test_recipes_at_sp_1_have_no_sp_groups():
    for name in ("qwen_image_ocr_512", "tiny_shapes_roll"):
        sections, _ = validate_recipe(load_yaml(ROOT / f"configs/roll/{name}.yaml"))
        assert sections.elastic.sp_degree == 1 and sections.elastic.rollout_summary() is None, name


@pytest.mark.parametrize("path", TWINS, ids=lambda p: p.stem)
def test_vanilla_twin_differs_only_in_spotlight_components(path):
    spotlight = _flatten(load_yaml(path))
    vanilla = _flatten(load_yaml(path.parent / f"{path.stem}_vanilla.yaml"))
    changed = {k for k in spotlight.keys() | vanilla.keys() if spotlight.get(k, object()) != vanilla.get(k, object())}
    outside = {k for k in changed if k != "exp_name" and k.split(".")[0] not in COMPONENT_KEYS}
    assert not outside, f"the vanilla twin also changes {sorted(outside)}"
    assert "exploration.mode" in changed
    v_sections, _ = validate_recipe(load_yaml(path.parent / f"{path.stem}_vanilla.yaml"))
    assert v_sections.exploration.mode == "off" and not v_sections.spot.enabled
    assert v_sections.dispatch.mode == "static"


def test_shared_sections_are_the_standalone_hosts_classes():
    """A key means the same in a ROLL recipe and a `spotlight train` YAML: one class per section,
    and the recipe maps onto the run config's tree (only `elastic` is the ROLL host's own)."""
    from roll_spotlight.dispatch.queue import QueueConfig
    from roll_spotlight.roll.sections import ElasticConfig, SpotlightSections
    from roll_spotlight.config import run

    types = {f.name: f.type for f in dataclasses.fields(SpotlightSections)}
    assert types == {"model": run.ModelConfig, "base_pretrain": run.PretrainConfig, "task": run.TaskConfig,
                     "reward_fn": run.RewardConfig, "sampling": run.SamplingConfig, "train": run.GRPOConfig,
                     "exploration": run.ExplorationConfig, "spot": run.SpotConfig, "dispatch": run.DispatchConfig,
                     "elastic": ElasticConfig}
    data = load_yaml(ROOT / "configs/roll/tiny_shapes_roll.yaml")
    data["spot"] = {"enabled": True, "max_workers": 3, "compression": 10.0}
    data["dispatch"] = {"mode": "pull", "lease_s": 45.0}
    sections, run_cfg = validate_recipe(data)
    assert run_cfg.spot is sections.spot and run_cfg.spot == run.SpotConfig(enabled=True, max_workers=3,
                                                                            compression=10.0)
    assert run_cfg.exploration is sections.exploration and run_cfg.exploration.mode == "stale"
    assert run_cfg.dispatch is sections.dispatch and sections.dispatch.queue_config() == QueueConfig(lease_s=45.0)


@pytest.mark.parametrize("change, fragment", [
    ({"spot": {"max_wrokers": 3}}, "spot.max_wrokers"),
    ({"elastic": {"sp_degree": 3}}, "elastic.sp_degree"),
    ({"dispatch": {"mode": "push"}}, "dispatch.mode"),
    ({"spot": {"node_label": "spot"}}, "spot.node_label"),
    ({"actor_infer": {"strategy_args": {"strategy_name": "hf_infer"}}}, "actor_infer.strategy_args"),
    ({"trainer": {"world_size": 1}}, "'trainer'"),
    ({"explorer": {"world_size": 1}}, "'explorer'"),
    ({"exploration": {"enabled": True}}, "exploration.enabled"),
    ({"exploration": {"seeds_per_prompt": 4}}, "exploration.seeds_per_prompt"),
    ({"dispatch": {"lease_s": 0}}, "lease_s"),
    ({"spot": {"enabled": True}, "dispatch": {"mode": "static"}}, "dispatch.mode"),
    ({"spot": {"gpus_per_node": 0}}, "spot.gpus_per_node"),
    ({"spot": {"enabled": True, "gpus_per_node": 3}, "elastic": {"sp_degree": 2}},
     "spot.gpus_per_node=3 does not fit elastic.sp_degree=2"),
    ({"spot": {"enabled": True, "max_workers": 1}, "elastic": {"sp_degree": 4}}, "spot.max_workers=1"),
    ({"elastic": {"sp_degree": 4, "min_sp_degree": 3}}, "elastic.min_sp_degree"),
])
def test_bad_recipes_fail_naming_the_key(change, fragment):
    data = load_yaml(ROOT / "configs/roll/tiny_shapes_roll.yaml")
    for key, value in change.items():
        data[key] = (data.get(key) or {}) | value
    with pytest.raises(ConfigError) as err:
        validate_recipe(data, source="tiny_shapes_roll.yaml")
    assert fragment in str(err.value)


def test_an_unknown_top_level_key_is_named_with_the_recipe_and_a_close_match():
    known = ("pipeline_cls", "max_steps", "spot")
    check_top_level_keys({"max_steps": 3, "spot": {}}, known, source="r.yaml")
    with pytest.raises(ConfigError) as err:
        check_top_level_keys({"max_steps": 3, "pipline": {"foo": 1}}, known, source="r.yaml")
    assert "unknown top-level key 'pipline' in r.yaml" in str(err.value)
    assert "did you mean 'pipeline_cls'?" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="'zzz' in r.yaml: .*docs/roll.md"):
        check_top_level_keys({"zzz": 1}, known, source="r.yaml")


def test_missing_role_is_reported():
    data = load_yaml(ROOT / "configs/roll/tiny_shapes_roll.yaml")
    del data["actor_infer"]
    with pytest.raises(ConfigError, match="actor_infer"):
        validate_recipe(data)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipes_use_rolls_role_names_and_meaning_of_pretrain(path):
    """A ROLL user reads a recipe with ROLL's vocabulary: roles actor_train/actor_infer/reward,
    `pretrain` a model path (or absent: the tiny base is trained from `base_pretrain`), and no
    dummy keys that exist only to satisfy ROLL (sequence_length, strategy_args)."""
    data = load_yaml(path)
    assert {"actor_train", "actor_infer", "reward"} <= data.keys()
    assert not {"trainer", "rollout", "explorer", "sequence_length"} & data.keys()
    assert not any("strategy_args" in data[role] for role in ("actor_train", "actor_infer", "reward"))
    sections, run_cfg = validate_recipe(data)
    if run_cfg.model.preset == "tiny":
        assert "pretrain" not in data and isinstance(data["base_pretrain"], dict)
    else:
        assert isinstance(data["pretrain"], str) and run_cfg.model.path == data["pretrain"]
        assert "path" not in data["model"]


def test_pretrain_fills_model_path_and_conflicts_are_errors():
    data = load_yaml(ROOT / "configs/roll/qwen_image_ocr_512.yaml")
    data["pretrain"] = "/models/a"
    assert validate_recipe(data)[1].model.path == "/models/a"
    data["model"] = data["model"] | {"path": "/models/b"}
    with pytest.raises(ConfigError, match="pretrain.*model.path"):
        validate_recipe(data)
    tiny = load_yaml(ROOT / "configs/roll/tiny_shapes_roll.yaml")
    with pytest.raises(ConfigError, match="base_pretrain"):
        validate_recipe(tiny | {"pretrain": {"steps": 5}})   # the old section name
    with pytest.raises(ConfigError, match="tiny"):
        validate_recipe(tiny | {"pretrain": "/models/a"})


def test_importing_the_adapter_imports_no_roll_torch_or_ray():
    """The adapter and launcher import nothing heavy; recipe validation needs no ROLL and no Ray."""
    code = ("import sys\n"
            "seen = lambda: sorted(m for m in ('roll', 'torch', 'ray', 'diffusers') if m in sys.modules)\n"
            "import roll_spotlight.roll, roll_spotlight.plugins, roll_spotlight.launch\n"
            "print(seen())\n"
            "import roll_spotlight.roll.sections\n"
            "print(seen())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    adapter, sections = out.stdout.strip().splitlines()
    assert adapter == "[]"
    assert "'roll'" not in sections and "'ray'" not in sections


def test_launcher_without_roll_says_how_to_install(tmp_path):
    from roll_spotlight.roll.environment import roll_available

    if roll_available():
        pytest.skip("ROLL is installed here")
    out = subprocess.run([sys.executable, "-m", "roll_spotlight.launch", "--config_path", str(ROOT / "configs/roll"),
                          "--config_name", "tiny_shapes_roll"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    assert "ROLL is not installed" in out.stderr and "git clone" in out.stderr and "pip install roll" not in out.stderr


@pytest.mark.roll
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_into_spotlight_config_with_roll(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ROLL writes ./output/logs on import
    from roll_spotlight.roll.spotlight_config import compose_mapping, from_mapping

    cfg = from_mapping(compose_mapping(str(path.parent), path.stem))
    sections, run_cfg = validate_recipe(load_yaml(path))
    assert cfg.sections == sections
    assert cfg.to_run_config() == run_cfg
    assert [getattr(cfg, r).name for r in ("actor_train", "actor_infer", "reward")] == \
        ["actor_train", "actor_infer", "reward"]
    assert cfg.actor_infer.strategy_args is None  # ROLL asserts vLLM/SGLang when it is set


def test_kuberay_manifest_matches_the_recipes_spot_keys():
    """The spot resource, on-demand resource and node label the recipes name exist in the manifest."""
    import yaml

    manifest = yaml.safe_load((ROOT / "deploy/kuberay/raycluster.yaml").read_text())
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    spot, ondemand = groups["spot-gpu"]["rayStartParams"], groups["ondemand-gpu"]["rayStartParams"]
    sections, _ = validate_recipe(load_yaml(ROOT / "configs/roll/qwen_image_ocr_512.yaml"))
    key, value = sections.spot.label
    assert f'\\"{sections.spot.resource}\\"' in spot["resources"] and spot["num-gpus"] == "0"
    assert f'\\"{sections.spot.ondemand_resource}\\"' in ondemand["resources"] and int(ondemand["num-gpus"]) > 0
    assert spot["labels"] == f"{key}={value}"
    assert groups["spot-gpu"]["template"]["spec"]["nodeSelector"][key] == value


def test_missing_ray_command_is_found_and_explained(tmp_path):
    from roll_spotlight.launch import missing_ray_command

    message = missing_ray_command(path=str(tmp_path))
    assert message is not None and "'ray' command is not on PATH" in message and "ray start" in message
    ray = tmp_path / "ray"
    ray.write_text("#!/bin/sh\n")
    ray.chmod(0o755)
    assert missing_ray_command(path=str(tmp_path)) is None


@pytest.mark.roll
def test_launcher_without_ray_on_path_says_where_it_is(tmp_path):
    """ROLL's init() shells out to `ray`; a venv used without activating it lacks it on PATH."""
    import os

    env = dict(os.environ, PATH="/usr/bin:/bin")
    if any(os.access(os.path.join(d, "ray"), os.X_OK) for d in env["PATH"].split(":")):
        pytest.skip("a system-wide ray is on PATH")
    out = subprocess.run([sys.executable, "-m", "roll_spotlight.launch", "--config_path", str(ROOT / "configs/roll"),
                          "--config_name", "tiny_shapes_roll"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "'ray' command is not on PATH" in out.stderr
    assert f"export PATH={os.path.dirname(sys.executable)}:$PATH" in out.stderr


def test_recipe_key_names_what_a_recipe_says():
    from roll_spotlight.roll.sections import recipe_key

    assert recipe_key("model.path") == "pretrain"
    assert recipe_key("model.image_size") == "model.image_size"
    assert recipe_key("reward.kwargs.model_path") == "reward_fn.kwargs.model_path"
    assert recipe_key("pretrain.steps") == "base_pretrain.steps"
    assert recipe_key("rewards") == "rewards" and recipe_key("spot.trace") == "spot.trace"


def test_startup_check_names_recipe_keys_and_variables_on_one_line(monkeypatch):
    """`spotlight train --check`'s check on a ROLL recipe, in the recipe's names (no ROLL needed)."""
    from roll_spotlight.roll.sections import recipe_key
    from roll_spotlight.startup import check_startup

    for name in ("QWEN_IMAGE_DIR", "PICKSCORE_PROMPTS_DIR", "PICKSCORE_DIR", "PICKSCORE_PROCESSOR_DIR"):
        monkeypatch.delenv(name, raising=False)
    _, run_cfg = validate_recipe(load_yaml(ROOT / "configs/roll/qwen_image_pickscore_512.yaml"))
    with pytest.raises(ConfigError) as err:
        check_startup(run_cfg, key=recipe_key)
    message = str(err.value)
    assert "\n" not in message
    for fragment in ("pretrain=/missing/QWEN_IMAGE_DIR: no such directory (set $QWEN_IMAGE_DIR)",
                     "task.train_file=/missing/PICKSCORE_PROMPTS_DIR/train.txt: no such file",
                     "reward_fn.kwargs.model_path=/missing/PICKSCORE_DIR: no such directory (set $PICKSCORE_DIR)",
                     "(set $PICKSCORE_PROCESSOR_DIR)"):
        assert fragment in message
    assert "model.path" not in message and "reward.kwargs" not in message


def test_a_real_model_recipe_without_pretrain_names_pretrain():
    data = load_yaml(ROOT / "configs/roll/qwen_image_ocr_512.yaml")
    del data["pretrain"]
    with pytest.raises(ConfigError, match=r"pretrain in x.yaml must name the model's local diffusers directory"):
        validate_recipe(data, source="x.yaml")


def test_readme_docs_and_ci_install_the_package_with_one_line():
    """A ROLL user installs roll_spotlight beside ROLL with the same command wherever they read it."""
    import re

    pattern = re.compile(r"pip install [^'\n]*-e '\.\[([a-z,]+)\]'")  # the extras
    found = {name: set(pattern.findall((ROOT / name).read_text()))
             for name in ("README.md", "docs/roll.md", ".ci/roll-compare")}
    assert all(len(lines) == 1 for lines in found.values()), found
    assert len(set.union(*found.values())) == 1, found
    assert "test" in next(iter(found["docs/roll.md"])).split(",")  # the roll tier's imports (hypothesis, scipy)


# spot training (spot.training_phase) under ROLL: one actor_train rank adds every gradient sum

SPOT_LORA = {"spot": {"enabled": True}, "train": {"use_lora": True}}


def _tiny_recipe(**change):
    data = load_yaml(ROOT / "configs/roll/tiny_shapes_roll.yaml")
    for key, value in change.items():
        data[key] = (data.get(key) or {}) | value
    return data


@pytest.mark.parametrize("phase, trains", [("train", True), ("auto", True), ("explore", False)])
def test_the_spot_section_takes_training_phase_and_one_trainer_rank_trains_through_the_queue(phase, trains):
    data = _tiny_recipe(**SPOT_LORA | {"spot": {"enabled": True, "training_phase": phase}})
    _, run_cfg = validate_recipe(data, source="tiny_shapes_roll.yaml")
    assert run_cfg.spot.training_phase == phase and run_cfg.spot_trains() is trains


def test_spot_training_asked_for_with_several_trainer_ranks_fails_naming_both_keys():
    data = _tiny_recipe(**SPOT_LORA | {"spot": {"enabled": True, "training_phase": "train"},
                                       "actor_train": {"world_size": 2}})
    with pytest.raises(ConfigError) as err:
        validate_recipe(data, source="tiny_shapes_roll.yaml")
    assert "spot.training_phase=train needs actor_train.world_size=1, got 2" in str(err.value)
    assert "tiny_shapes_roll.yaml" in str(err.value)


def test_auto_with_several_trainer_ranks_explores_and_says_why():
    from roll_spotlight.roll.sections import one_rank_spot_training, parse_sections, run_config

    data = _tiny_recipe(**SPOT_LORA | {"actor_train": {"device_mapping": [0, 1]}})
    _, run_cfg = validate_recipe(data)
    assert run_cfg.spot.training_phase == "explore" and not run_cfg.spot_trains()
    one_rank = run_config(data, parse_sections(data))
    assert one_rank.spot_trains()
    kept, why = one_rank_spot_training(one_rank, 1)
    assert kept is one_rank and why is None
    _, why = one_rank_spot_training(one_rank, 2)
    assert "actor_train.world_size=2" in why and "explore" in why


@pytest.mark.parametrize("change, fragment", [
    ({"spot": {"enabled": True, "training_phase": "sometimes"}}, "spot.training_phase"),
    ({"spot": {"enabled": True, "training_phase": "train"}}, "train.use_lora is off"),
])
def test_bad_spot_training_in_a_recipe_fails_naming_the_key(change, fragment):
    with pytest.raises(ConfigError) as err:
        validate_recipe(_tiny_recipe(**change), source="tiny_shapes_roll.yaml")
    assert fragment in str(err.value) and "spot.training_phase" in str(err.value)
