"""Opt-in ROLL patches: the ledger matches the code; with ROLL, version guards and apply/revert."""
from __future__ import annotations

from pathlib import Path

import pytest

from roll_spotlight import patches

LEDGER = Path(__file__).resolve().parents[1] / "patches" / "LEDGER.md"


def test_every_patch_has_a_complete_ledger_entry():
    text = LEDGER.read_text()
    for name in patches.known_patches():
        patch = patches.get_patch(name)
        assert f"## {name}" in text, f"LEDGER.md has no entry for {name}"
        entry = text.split(f"## {name}", 1)[1].split("\n## ", 1)[0]
        for field in ("**Target**", "**Why**", "**How**", "**Removal**"):
            assert field in entry, f"LEDGER.md entry {name} lacks {field}"
        assert patch.fingerprint_sha256 in entry, f"LEDGER.md entry {name} records another hash"
        assert len(patch.fingerprint_sha256) == 64


def test_unknown_patch_is_rejected_before_anything_is_applied():
    with pytest.raises(ValueError, match="known patches"):
        patches.apply_patches(["strategy_literal", "no_such_patch"])
    assert patches.applied_patches() == []


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ROLL writes ./output/logs on import
    yield
    patches.revert_patches()


@pytest.mark.roll
@pytest.mark.parametrize("name", ["strategy_literal", "loud_safe_import"])
def test_version_guard_patched_symbol_is_unchanged(name, in_tmp):
    """Fails when ROLL changes the patched symbol: re-check the patch, then update LEDGER.md."""
    patch = patches.get_patch(name)
    assert patch.current_sha256() == patch.fingerprint_sha256, patch.target


@pytest.mark.roll
def test_changed_target_refuses_to_apply(in_tmp, monkeypatch):
    patch = patches.get_patch("strategy_literal")
    monkeypatch.setattr(patches, "_registry", lambda: {patch.name: patches.Patch(
        patch.name, patch.target, "0" * 64, patch.fingerprint, patch.apply)})
    with pytest.raises(patches.PatchTargetChanged, match="LEDGER"):
        patches.apply_patches(["strategy_literal"])
    assert patches.applied_patches() == []


def _parse_strategy(name: str):
    import dacite
    from roll.configs.worker_config import StrategyArguments

    return dacite.from_dict(StrategyArguments, {"strategy_name": name})


@pytest.mark.roll
def test_strategy_literal_applies_and_reverts(in_tmp):
    import dacite

    with pytest.raises(dacite.WrongTypeError):
        _parse_strategy("diffusers_train")
    assert patches.apply_patches(["strategy_literal"]) == ["strategy_literal"]
    assert patches.apply_patches(["strategy_literal"]) == []  # idempotent
    assert _parse_strategy("diffusers_train").strategy_name == "diffusers_train"
    assert _parse_strategy("fsdp2_train").strategy_name == "fsdp2_train"
    assert patches.revert_patches() == ["strategy_literal"]
    with pytest.raises(dacite.WrongTypeError):
        _parse_strategy("diffusers_train")


@pytest.mark.roll
def test_loud_safe_import_applies_and_reverts(in_tmp):
    from roll.distributed.executor import cluster

    assert cluster.safe_import_class("roll_spotlight.no_such_module.Worker") is None
    patches.apply_patches(["loud_safe_import"])
    with pytest.raises(ValueError, match="no_such_module"):
        cluster.safe_import_class("roll_spotlight.no_such_module.Worker")
    from roll_spotlight.dispatch.queue import RequestQueue

    assert cluster.safe_import_class("roll_spotlight.dispatch.queue.RequestQueue") is RequestQueue
    patches.revert_patches()
    assert cluster.safe_import_class("roll_spotlight.no_such_module.Worker") is None
