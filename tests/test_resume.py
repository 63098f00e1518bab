"""Whole-run resume: `spotlight train` killed mid-run (SIGKILL, no clean-up), then
`spotlight train --resume RUN_DIR`, ends with the same weights and metrics, bit for bit, as an
uninterrupted run.

The kill is injected deterministically in a child process: it patches the in-process backend to
SIGKILL itself at a chosen point (inside iteration 3 after its rollouts and rewards; or in the
middle of writing the checkpoint of iteration 2), then runs the real CLI.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from roll_spotlight.cli import main
from tests.runtime_helpers import REPO, TINY_OVERRIDES

OVERRIDES = [*TINY_OVERRIDES, "max_steps=3", "save_steps=1", "eval_steps=2", "pretrain.steps=3",
             "pretrain.eval_samples=4"]

KILLER = """
import os, signal, sys
from roll_spotlight.runtime.local import LocalBackend
point = sys.argv[1]
train, save = LocalBackend.start_train, LocalBackend.save_checkpoint
def start_train(self, *args):
    if point == "train" and self.core.weight_version == 2:   # iteration 3, mid-way
        os.kill(os.getpid(), signal.SIGKILL)
    return train(self, *args)
def save_checkpoint(self, path):
    save(self, path)
    if point == "save" and self.core.weight_version == 2:    # iter-000002.tmp written, not renamed
        os.kill(os.getpid(), signal.SIGKILL)
LocalBackend.start_train, LocalBackend.save_checkpoint = start_train, save_checkpoint
from roll_spotlight.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _train_args(run_dir: Path) -> list[str]:
    return ["train", "--config", str(REPO / "configs" / "tiny_shapes.yaml"), "--run-dir", str(run_dir),
            "--no-progress", "--threads", "1", *[x for o in OVERRIDES for x in ("-o", o)]]


def _final(run_dir: Path) -> dict:
    import torch

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    state = torch.load(run_dir / "checkpoints" / "iter-000003" / "backend.pt", weights_only=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"metrics": [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows],
            "state": state, "final_rewards": summary["final_rewards"], "curve": summary["curve"]}


def _assert_tensors_equal(a, b, where: str = "") -> None:
    import torch

    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_tensors_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("SPOTLIGHT_CACHE")
    os.environ["SPOTLIGHT_CACHE"] = str(cache)
    yield {"SPOTLIGHT_CACHE": str(cache), "SPOTLIGHT_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if old is None:
        os.environ.pop("SPOTLIGHT_CACHE")
    else:
        os.environ["SPOTLIGHT_CACHE"] = old


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory) -> dict:
    run_dir = tmp_path_factory.mktemp("full") / "run"
    assert main(_train_args(run_dir)) == 0
    return _final(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["train", "save"])
def test_killed_driver_resumes_to_the_same_weights_and_metrics(env, uninterrupted, tmp_path, point):
    run_dir = tmp_path / "run"
    child = subprocess.run([sys.executable, "-c", KILLER, point, *_train_args(run_dir)], cwd=REPO,
                           env=os.environ | env, capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts[-1] == ("iter-000002" if point == "train" else "iter-000002.tmp")
    assert not (run_dir / "summary.json").exists()
    assert main(["train", "--resume", str(run_dir), "--no-progress", "--threads", "1"]) == 0
    resumed = _final(run_dir)
    assert resumed["metrics"] == uninterrupted["metrics"]
    assert resumed["final_rewards"] == uninterrupted["final_rewards"]
    assert resumed["curve"] == uninterrupted["curve"]
    _assert_tensors_equal(resumed["state"], uninterrupted["state"], "backend.pt")
    assert [r["step"] for r in resumed["metrics"]] == [0, 1, 2, 3]
    assert not (run_dir / "checkpoints" / "iter-000002.tmp").exists(), "the half-written save was redone"
