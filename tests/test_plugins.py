"""The one name resolver (roll_spotlight.plugins) and the entry points setup.py declares from it."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from roll_spotlight import plugins

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_GROUPS = set(plugins.GROUPS)


def _roll_present() -> bool:
    from roll_spotlight.roll.environment import roll_available

    return roll_available()


def test_builtin_names_resolve_without_pip_metadata():
    from roll_spotlight.dispatch.queue import RequestQueue
    from roll_spotlight.roll.strategy import DiffusersTrainStrategy

    assert plugins.resolve("roll_spotlight.strategies", "diffusers_train") is DiffusersTrainStrategy
    assert plugins.resolve("schedulers", "pull_queue") is RequestQueue  # short group name


def test_reward_group_shares_the_reward_builtins():
    from roll_spotlight.rewards.jpeg import MeanBrightness

    assert plugins.resolve("rewards", "brightness") is MeanBrightness
    assert "shapes" in plugins.known_names("rewards")


@pytest.mark.parametrize("path", ["roll_spotlight.dispatch.queue.RequestQueue",
                                  "roll_spotlight.dispatch.queue:RequestQueue"])
def test_dotted_paths_in_both_styles(path):
    from roll_spotlight.dispatch.queue import RequestQueue

    assert plugins.resolve("schedulers", path) is RequestQueue


def test_dotted_path_to_a_nested_attribute():
    from roll_spotlight.dispatch.queue import RequestState

    assert plugins.load_dotted("roll_spotlight.dispatch.queue.RequestState.PENDING") is RequestState.PENDING
    assert plugins.load_dotted("roll_spotlight.dispatch.queue:RequestState.PENDING") is RequestState.PENDING


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as err:
        plugins.resolve("strategies", "diffusers_trian")
    message = str(err.value)
    assert "diffusers_trian" in message and "diffusers_train" in message and "diffusers_rollout" in message


def test_unknown_group_is_rejected():
    with pytest.raises(ValueError, match="known groups"):
        plugins.resolve("optimizers", "adam")


@pytest.mark.parametrize("path, fragment", [
    ("roll_spotlight.dispatch.queue.NoSuchClass", "NoSuchClass"),
    ("roll_spotlight.no_such_module:Thing", "roll_spotlight.no_such_module"),
    ("no_such_package_xyz.mod.Class", "no_such_package_xyz"),
    ("roll_spotlight.dispatch.queue:", "not a dotted path"),
])
def test_bad_dotted_paths_fail_with_the_cause(path, fragment):
    with pytest.raises(ValueError) as err:
        plugins.resolve("workers", path)
    assert fragment in str(err.value)


def test_register_and_conflicts():
    class A:
        pass

    class B:
        pass

    try:
        plugins.register("workers", "test_worker_a", A)
        plugins.register("workers", "test_worker_a", A)  # same object: no-op
        assert plugins.resolve("workers", "test_worker_a") is A
        assert "test_worker_a" in plugins.known_names("workers")
        with pytest.raises(ValueError, match="already registered"):
            plugins.register("workers", "test_worker_a", B)
        with pytest.raises(ValueError, match="without"):
            plugins.register("workers", "pkg.mod", B)
    finally:
        plugins.unregister("workers", "test_worker_a")
    with pytest.raises(ValueError):
        plugins.resolve("workers", "test_worker_a")


@pytest.mark.skipif(_roll_present(), reason="checks the message shown when ROLL is missing")
def test_roll_only_target_without_roll_names_the_missing_module():
    with pytest.raises(ValueError) as err:
        plugins.resolve("workers", "dit_trainer")
    assert "roll_spotlight.roll.workers" in str(err.value) and "roll" in str(err.value)


def _module_file_exists(module: str) -> bool:
    parts = module.split(".")
    package_dir = {"roll_spotlight.patches": ROOT / "patches"}
    for prefix, folder in package_dir.items():
        if module.startswith(prefix):
            rest = module[len(prefix):].strip(".").split(".") if module != prefix else []
            return (folder.joinpath(*rest).with_suffix(".py")).is_file() or (folder.joinpath(*rest) / "__init__.py").is_file()
    return (ROOT.joinpath(*parts).with_suffix(".py")).is_file() or (ROOT.joinpath(*parts) / "__init__.py").is_file()


def _installed_entry_points(group: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)
            if ep.dist is None or ep.dist.name.replace("-", "_") == "roll_spotlight"}


def test_installed_entry_points_are_the_builtins():
    """setup.py declares BUILTINS (read with ast) as the entry points: the plugin list has one home.
    A stale install (`pip install -e .` before plugins.py changed) fails here: reinstall."""
    for group in plugins.GROUPS:
        assert _installed_entry_points(group) == plugins.builtins(group), group


def test_installed_entry_points_point_at_objects():
    roll_only = ("roll_spotlight.roll.workers", "roll_spotlight.roll.pipeline", "roll_spotlight.roll.spotlight_config")
    checked = 0
    for group in plugins.GROUPS:
        for name, target in _installed_entry_points(group).items():
            module = target.partition(":")[0]
            assert _module_file_exists(module), f"{group} {name}: no module file for {module}"
            if module in roll_only and not _roll_present():
                continue
            if module == "roll_spotlight.rewards.ocr" and importlib.util.find_spec("rapidocr_onnxruntime") is None:
                continue
            assert plugins.load_dotted(target) is not None
            checked += 1
    assert checked >= 3


def test_builtin_tables_point_at_existing_modules():
    for group in plugins.GROUPS:
        for name, target in plugins.builtins(group).items():
            module = target.partition(":")[0]
            assert _module_file_exists(module), f"{group} {name}: {target}"


def _setup_install_requires() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [ast.literal_eval(elt) for elt in node.value.elts]
    raise AssertionError("setup.py has no install_requires")


def test_packages_of_user_commands_are_install_requirements_not_dev_extras() -> None:
    """`make quickstart` installs only the `ocr` extra: what `spotlight quickstart`/`report`
    (matplotlib), `spotlight train --emulate` (psutil) and the real-model path (transformers) import must
    come with the package itself."""
    names = {req.split(">")[0].split("=")[0].split("<")[0].strip() for req in _setup_install_requires()}
    assert {"matplotlib", "psutil", "transformers"} <= names, names
