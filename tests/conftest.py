"""Shared test set-up: Ray on loopback, and skipping the `roll` and `gpu` tiers where they cannot run.

``tests`` is a regular package (tests/__init__.py), so its modules import as ``tests.<name>``. This
directory is also appended to ``sys.path`` for test modules that import a helper by its bare name
(``from reward_model_helpers import ...``); appended, so it shadows nothing.
"""
import os
import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _roll_importable() -> bool:
    try:
        import roll  # noqa: F401
    except Exception:
        return False
    return True


def _cuda_available() -> bool:
    try:
        import torch
    except Exception:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def one_thread():
    """torch at one thread for a module's tests (they share 2 cores with Ray workers)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shipped_traces() -> Path:
    """The public spot traces shipped in the package: the tests check these files, so they ignore
    ``$SPOTLIGHT_TRACES`` (which ``traces_root`` honours)."""
    from roll_spotlight.spot.traces import PACKAGED_TRACES

    return PACKAGED_TRACES


def pytest_collection_modifyitems(config, items):
    skip_roll = pytest.mark.skip(reason="ROLL is not importable")
    skip_gpu = pytest.mark.skip(reason="CUDA is not available")
    has_roll = None
    has_gpu = None
    for item in items:
        if "roll" in item.keywords:
            has_roll = _roll_importable() if has_roll is None else has_roll
            if not has_roll:
                item.add_marker(skip_roll)
        if "gpu" in item.keywords:
            has_gpu = _cuda_available() if has_gpu is None else has_gpu
            if not has_gpu:
                item.add_marker(skip_gpu)
