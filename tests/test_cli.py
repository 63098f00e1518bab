"""The `spotlight` command: cheap import, clear start-up errors, a full tiny run with a report."""
import json
import subprocess
import sys

import pytest

from roll_spotlight.cli import main
from tests.runtime_helpers import TINY_OVERRIDES, REPO


def test_import_is_cheap():
    code = "import sys, roll_spotlight, roll_spotlight.cli, roll_spotlight.config.run; " \
           "print(sorted(m for m in ('torch', 'ray', 'diffusers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("override, key", [
    ("train.group_sise=4", "train.group_sise"),
    ("train.group_size=1", "train.group_size"),
    ("sampling.noise_level=fast", "sampling.noise_level"),
    ("model.axes_dims_rope=[8,8,8]", "model.axes_dims_rope"),
])
def test_bad_config_fails_at_start_naming_the_key(tmp_path, capsys, override, key):
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(REPO / "configs" / "tiny_shapes.yaml"), "-o", override,
                 "--run-dir", str(run_dir)])
    assert code == 2
    assert key in capsys.readouterr().err
    assert not run_dir.exists(), "a failed start must not leave a run directory behind"


@pytest.mark.parametrize("flags, message", [
    (["--sp-degree", "3", "--ray"], "--sp-degree=3 must divide model.num_attention_heads=4"),
    (["--sp-degree", "2"], "--sp-degree 2: SP rollout groups need Ray workers"),
    (["--sp-degree", "2", "--ray", "--workers", "3"], "--sp-degree=2 must divide --workers=3"),
])
def test_a_bad_sp_degree_fails_before_anything_is_built(tmp_path, capsys, monkeypatch, flags, message):
    import roll_spotlight.startup as loop

    monkeypatch.setattr(loop, "starting_policy", lambda *a, **k: pytest.fail("the base was built first"))
    run_dir = tmp_path / "run"
    code = main(["train", "--config", str(REPO / "configs" / "tiny_shapes.yaml"), "--run-dir", str(run_dir), *flags])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def test_missing_config_and_resume(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "config.yaml" in capsys.readouterr().err


def test_train_report_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    args = ["train", "--config", str(REPO / "configs" / "tiny_shapes.yaml"), "--run-dir", str(run_dir),
            "--no-progress", "--threads", "1", "-o", "pretrain.steps=3", "-o", "pretrain.eval_samples=4",
            "-o", "save_steps=1", *[x for o in TINY_OVERRIDES for x in ("-o", o)]]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary) >= {"base", "final", "paired"}
    assert (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints" / "iter-000002").is_dir()
    assert main(["report", str(run_dir)]) == 0
    report = (run_dir / "report.md").read_text()
    assert "Paired gain" in report and (run_dir / "curves.png").stat().st_size > 0
    assert (run_dir / "timeline.png").is_file()
    import numpy as np

    base, final = (np.load(run_dir / "samples" / f"{n}.npz") for n in ("base", "final"))
    assert base["images"].shape == final["images"].shape and base["images"].dtype == np.uint8
    assert list(base["prompts"]) == list(final["prompts"]) and list(base["seeds"]) == list(final["seeds"])
    assert "## Validation samples" in report and (run_dir / "samples.png").stat().st_size > 0
    assert main(["train", "--resume", str(run_dir), "--no-progress", "-o", "max_steps=3"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


class _Ran:
    def summary(self) -> dict:
        return {}


def test_quickstart_says_what_it_does_before_it_does_it(tmp_path, monkeypatch, capsys):
    """The first lines name the phase and, for the shipped config, its measured minutes; the base is
    pretrained (first run only) before Ray starts."""
    import roll_spotlight.cli as cli
    import roll_spotlight.run_report as report
    from roll_spotlight.training.pretrain import base_path

    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(report, "write_report", lambda run_dir: run_dir / "report.md")
    started = []
    monkeypatch.setattr(cli, "_train", lambda cfg, *a: started.append(base_path(cfg).is_file()) or _Ran())
    small = ["pretrain.steps=3", "pretrain.batch_size=4", "pretrain.eval_samples=4", "model.num_layers=1",
             "task.train_prompts=16", "task.val_prompts=8"]
    args = ["quickstart", "--config", str(REPO / "configs" / "quickstart.yaml"), "--run-dir", str(tmp_path / "run"),
            "--no-progress", "--threads", "1", *[x for o in small for x in ("-o", o)]]
    assert main(args) == 0
    first = capsys.readouterr().err.splitlines()
    assert first[0].startswith("spotlight quickstart: pretraining the tiny base (3 steps, first run only; cached in")
    assert "20 iterations of Flow-GRPO" in first[1] and "8 prompt/seed pairs" in first[1] and "min" not in first[1]
    assert main(args) == 0  # cached: straight to Ray
    assert "pretraining" not in capsys.readouterr().err and started == [True, True]


def test_the_shipped_quickstart_names_its_measured_minutes(monkeypatch, capsys):
    import roll_spotlight.cli as cli
    import roll_spotlight.run_report as report
    import roll_spotlight.training.pretrain as pretrain

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(report, "write_report", lambda run_dir: run_dir / "report.md")
    monkeypatch.setattr(pretrain, "base_path", lambda cfg: REPO / "no-such-base.pt")
    monkeypatch.setattr(pretrain, "load_or_pretrain", lambda cfg, progress: None)
    monkeypatch.setattr(cli, "_train", lambda *a: _Ran())
    assert main(["quickstart", "--run-dir", "unused", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"first run only, about {cli.QUICKSTART_MINUTES['pretrain']} min on 2 cores" in err
    assert f"with spot workers, about {cli.QUICKSTART_MINUTES['run']} min on 2 cores" in err


def test_traces_without_a_folder_summarises_the_shipped_ones(capsys, monkeypatch):
    monkeypatch.delenv("SPOTLIGHT_TRACES", raising=False)
    assert main(["traces"]) == 0
    names = {t["trace"] for t in json.loads(capsys.readouterr().out)}
    assert "bamboo-spot-traces/aws/p3-trace.csv" in names and len(names) >= 4
