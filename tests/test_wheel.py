"""The package as users install it: a wheel, in a fresh virtual environment, away from the source.

Editable installs (the Makefile's, CI's) import from the source tree and hide packaging mistakes
such as a package folder without ``__init__.py`` that ``find_packages`` skips. Here the wheel is
built, installed with ``--no-deps`` into a new venv that sees this venv's dependencies through a
path file (not this checkout), and run from a directory outside the checkout.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.runtime_helpers import REPO

pytestmark = pytest.mark.slow

IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import roll_spotlight
failed, skipped, done = {}, [], ["roll_spotlight"]
for mod in pkgutil.walk_packages(roll_spotlight.__path__, "roll_spotlight."):
    try:
        importlib.import_module(mod.name)
        done.append(mod.name)
    except ModuleNotFoundError as exc:
        if exc.name == "roll" or (exc.name or "").startswith("roll."):
            skipped.append(mod.name)   # ROLL-only modules import roll by design
        else:
            failed[mod.name] = repr(exc)
    except Exception as exc:
        failed[mod.name] = repr(exc)
print(json.dumps({"file": roll_spotlight.__file__, "imported": done, "skipped": skipped, "failed": failed}))
"""


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of the fresh venv, environment, working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    source = root / "source"  # setuptools writes build/ and *.egg-info beside the sources: not in the checkout
    for name in ("roll_spotlight", "patches"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"),
          str(source)], root, env)
    wheel = next((root / "dist").glob("roll_spotlight-*.whl"))
    _run([sys.executable, "-m", "venv", str(root / "venv")], root, env)
    python = root / "venv" / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q", str(wheel)], root, env)
    return python, env, root


def test_wheel_holds_every_package(installed):
    python, env, root = installed
    out = json.loads(_run([str(python), "-c", IMPORT_ALL], root, env).stdout.strip().splitlines()[-1])
    assert not out["failed"], out["failed"]
    assert str(root) in out["file"] and str(REPO) not in out["file"], out["file"]
    source = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
              for p in (REPO / "roll_spotlight").rglob("*.py")}
    missing = source - set(out["imported"]) - set(out["skipped"])
    assert not missing, f"modules of the source tree missing from the wheel: {sorted(missing)}"
    assert {"roll_spotlight.training.grpo", "roll_spotlight.config.run", "roll_spotlight.startup"} <= set(out["imported"])


def test_installed_cli_helps_and_checks_the_tiny_config(installed):
    python, env, root = installed
    entry = [str(python.parent / "spotlight")]
    assert "pretrain" in _run(entry + ["--help"], root, env).stdout
    out = _run(entry + ["train", "--check", "--config", str(REPO / "configs" / "tiny_shapes.yaml")], root, env)
    assert "memory plan" in out.stdout
    assert json.loads(out.stdout[out.stdout.rindex("\n{"):])["config"] == "ok"


ENTRY_POINTS = r"""
import importlib.metadata, json
from roll_spotlight import plugins
installed = {group: {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)} for group in plugins.GROUPS}
print(json.dumps({"file": plugins.__file__, "installed": installed}))
"""


def test_installed_entry_points_are_the_plugin_builtins(installed):
    """setup.py builds the plugin groups from plugins.BUILTINS; the wheel declares exactly those."""
    from roll_spotlight import plugins

    python, env, root = installed
    out = json.loads(_run([str(python), "-c", ENTRY_POINTS], root, env).stdout.strip().splitlines()[-1])
    assert str(root) in out["file"], out["file"]
    assert out["installed"] == {group: plugins.builtins(group) for group in plugins.GROUPS}


LOAD_TRACE = r"""
import json
from roll_spotlight.spot import load_trace, traces_root
root = traces_root()
trace = load_trace(root / "bamboo-spot-traces" / "aws" / "p3-trace.csv")
print(json.dumps({"root": str(root), "events": len(trace.zones["p3"].events),
                  "license": (root / "bamboo-spot-traces" / "LICENSE").is_file()}))
"""


def test_installed_package_carries_the_spot_traces(installed):
    python, env, root = installed
    env = {k: v for k, v in env.items() if k != "SPOTLIGHT_TRACES"}
    out = json.loads(_run([str(python), "-c", LOAD_TRACE], root, env).stdout.strip().splitlines()[-1])
    assert str(root) in out["root"] and str(REPO) not in out["root"], out["root"]
    assert out["events"] == 344 and out["license"]  # 177 joins, 167 preemptions; LICENSE beside the data
    entry = [str(python.parent / "spotlight"), "simulate", "--provider", "gcp", "--zone", "us-central1-b",
             "--resolution", "512", "--iterations", "1", "--spot", "2", "--ondemand", "2", "--json"]
    result = json.loads(_run(entry, root, env).stdout)
    assert result["what_if"]["market"] == "shipped trace h100_probe_counts_wide.csv, zone us-central1-b"
    assert result["trace"]["provider"] == "gcp" and result["kind"] == "simulated"
