"""Patch ``loud_safe_import``: a dotted class path that does not import fails loudly, at once.

ROLL's ``safe_import_class`` logs and returns None when a path does not import; ``Cluster`` then
calls ``ray.remote(None)`` and the run dies later with an unrelated message. The patch rebinds the
name in the modules that resolve user-supplied paths (``Cluster`` always; the schedulers when they
are already imported) to `roll_spotlight.plugins.load_dotted`, which raises a ValueError naming the
path and the import error. ``roll.utils.import_utils`` itself is left alone: ROLL's vLLM glue uses
it to probe optional modules and relies on the None. See LEDGER.md.
"""
from __future__ import annotations

import importlib
import inspect
import sys

from roll_spotlight.patches import Patch

TARGET = "roll.utils.import_utils.safe_import_class (bound in roll.distributed.executor.cluster)"
ALWAYS = ("roll.distributed.executor.cluster",)
IF_IMPORTED = ("roll.distributed.scheduler.generate_scheduler", "roll.distributed.scheduler.rollout_scheduler")


def fingerprint() -> str:
    from roll.utils import import_utils

    return inspect.getsource(import_utils.safe_import_class) + inspect.getsource(import_utils.can_import_class)


def loud_import_class(class_path: str):
    """ROLL's safe_import_class signature, raising instead of returning None."""
    from roll_spotlight.plugins import load_dotted

    return load_dotted(class_path, what="ROLL class path")


def apply():
    modules = [importlib.import_module(name) for name in ALWAYS]
    modules += [sys.modules[name] for name in IF_IMPORTED if name in sys.modules]
    originals = {module: module.safe_import_class for module in modules}
    for module in modules:
        module.safe_import_class = loud_import_class

    def undo() -> None:
        for module, original in originals.items():
            module.safe_import_class = original

    return undo


PATCH = Patch(
    name="loud_safe_import",
    target=TARGET,
    fingerprint_sha256="f447b6b552afd85d22627853eba1efe0c9096a69af776fc67594e88d86af25cc",
    fingerprint=fingerprint,
    apply=apply,
)
