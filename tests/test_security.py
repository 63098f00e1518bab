"""What docs/security.md promises and a test can check: torch.load is always weights_only,
pickle.load only where the doc says so, run directories are private."""
from __future__ import annotations

import ast
import os
import stat

from tests.runtime_helpers import REPO, tiny_config

PACKAGE = REPO / "roll_spotlight"
DOC = REPO / "docs" / "security.md"


def _calls(name: str):
    """(file, call) for every call `<module>.<name>(...)` in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name:
                yield path, node


def test_every_torch_load_passes_weights_only_true():
    found = [(p, c) for p, c in _calls("load") if isinstance(c.func.value, ast.Name) and c.func.value.id == "torch"]
    assert found, "the scan must see the package's torch.load calls"
    for path, call in found:
        kw = {k.arg: k.value for k in call.keywords}
        assert isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True, \
            f"{path.relative_to(REPO)}:{call.lineno}: torch.load without weights_only=True"


def test_pickle_loads_only_where_the_security_doc_lists_them():
    users = {p.relative_to(PACKAGE).with_suffix("").as_posix() for p, c in [*_calls("load"), *_calls("loads")]
             if isinstance(c.func.value, ast.Name) and c.func.value.id in ("pickle", "cloudpickle")}
    assert users == {"dispatch/journal", "elastic/comm"}, f"new pickle readers {users}: document them in docs/security.md"
    assert "request-queue journal" in DOC.read_text() and "SP rollout group leases" in DOC.read_text()


def test_run_directory_and_checkpoints_are_private(tmp_path):
    import torch

    from roll_spotlight.startup import write_run_config
    from roll_spotlight.runtime.coordinator import Coordinator
    from roll_spotlight.runtime.local import LocalBackend
    from tests.runtime_helpers import random_policy

    torch.set_num_threads(1)
    cfg = tiny_config("max_steps=1", "save_steps=1", "eval_steps=0")
    old = os.umask(0o022)
    try:
        run_dir = tmp_path / "run"
        write_run_config(cfg, run_dir)
        Coordinator(cfg, LocalBackend(cfg, random_policy(cfg)), run_dir, progress=False).train()
    finally:
        os.umask(old)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "checkpoints" / "iter-000001").stat().st_mode) == 0o700
    for path in run_dir.rglob("*"):
        mode = path.stat().st_mode
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), f"{path} is writable by others"
        assert path.stat().st_uid == os.getuid()


# The Ray check (a local cluster advertises 127.0.0.1 only) runs in tests/test_fault_matrix.py,
# which starts the same cluster anyway (a Ray start costs ~10 s on 2 busy cores).
