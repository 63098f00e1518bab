import os

import pytest

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
