"""The ROLL launcher on emulated GPUs (tier 4, `-m roll`): ``--emulate GPU --time-scale S`` runs a
recipe with CPU-only ROLL workers whose compute waits its modelled duration, inside a local cluster
whose spot raylets a trace starts, notices and kills; bad emulation options stop the launch before
ROLL's ``init()`` with one line naming the option."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.roll, pytest.mark.ray]

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "roll"


def _launch(cwd: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The launcher as a user runs it, in its own process and directory (ROLL writes ./output)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "SPOTLIGHT_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "roll_spotlight.launch", "--config_path", str(RECIPES),
                           "--config_name", "tiny_shapes_roll", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_an_emulated_roll_run_follows_a_spot_raylet_through_notice_and_kill(tmp_path):
    """Eight iterations on emulated H100s at time-scale 4 with one spot node of one GPU that the trace
    notices 2 s ahead and kills 30 s in (wall time; long enough for its worker to start on a busy
    machine): ROLL joins the harness's cluster (and so stops no other),
    its workers sit on the head, the spot worker trains micro-batches and explores until the kill,
    and nothing is lost, repeated or mismatched. Batches of 2, as in the standalone twin
    (test_emulation): at the recipe's batch 1 the spot worker trained none of 8 updates' micro-batches
    (each update 1.1-1.7 s of wall time) in a run at load 2-5."""
    trace = tmp_path / "aws-trace.csv"
    trace.write_text("0,add,a\n120000,remove,a\n36000000,add,b\n")  # Bamboo's format: ms, event, node
    out = _launch(tmp_path, "--emulate", "h100", "--time-scale", "4", "max_steps=8", "eval_steps=4",
                  "spot.enabled=true", "+spot.max_workers=1", f"+spot.trace={trace}", "+spot.notice_s=2.0",
                  "+spot.training_phase=train", "+train.use_lora=true", "++task.val_prompts=16",
                  "++sampling.max_batch=2")
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "output" / "tiny_shapes_roll"
    emulation = json.loads((run / "emulation.json").read_text())
    assert emulation["gpu"].startswith("H100") and emulation["time_scale"] == 4.0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("iteration_s") is not None]
    last = steps[-1]
    assert len(steps) == 8 and all(r["emulated/mismatched_outputs"] == 0 for r in steps)
    assert last["spot/nodes_started"] == 1 and last["spot/preemptions"] == 1 and last["spot/notices"] == 1, last
    assert sum(r["train/micro_batches_spot"] for r in steps) > 0
    assert last["spot/duplicate_completions"] == 0 and last["spot/requests_failed"] == 0
    assert last["cost/bill_scale"] == 4.0 and last["cost/usd"] > 0
    raylets = json.loads((run / "spot_nodes.json").read_text())
    assert (raylets["joins"], raylets["kills_after_notice"], raylets["kills_without_notice"]) == (1, 1, 0), raylets
    report = (run / "report.md").read_text()
    assert "EMULATED: a dry run on H100" in report and "Memory plan on one H100" in report


@pytest.mark.parametrize("argv, named", [
    (("--emulate", "h900"), "--emulate"),
    (("--emulate", "h100", "--time-scale", "0"), "--time-scale"),
    (("--emulate", "h100", "spot.enabled=true", "+spot.source=cluster"), "spot.source=cluster"),
    (("--emulate", "h100", "actor_infer.world_size=400"), "ROLL workers"),  # each rank a ROLL process here
])
def test_bad_emulation_options_stop_the_launch_before_rolls_init(tmp_path, argv, named):
    out = _launch(tmp_path, *argv, timeout=120)
    errors = [line for line in out.stderr.splitlines() if line.startswith("python -m roll_spotlight.launch: error:")]
    assert out.returncode == 2 and len(errors) == 1 and named in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not (tmp_path / "output" / "tiny_shapes_roll").exists()
