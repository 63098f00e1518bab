"""Start-up checks for running next to ROLL: the right `roll`, and package versions that coexist.

The decision recorded here (docs/roll.md, "Dependencies"): **with ROLL, roll_spotlight needs
peft >= 0.18.1**, relaxing ROLL v0.3.0's ``peft==0.12.0`` pin. diffusers imports its LoRA loaders
when peft is installed and does not declare a minimum; with peft 0.12.0 importing
``QwenImageTransformer2DModel`` fails. With peft 0.18.1 both that model and ROLL's fsdp2 strategy
import (checked in a ROLL v0.3.0 environment, see ``tests/test_roll_environment.py``); peft 0.17.1
breaks ROLL itself with transformers 5. The other choice, disabling diffusers' peft integration,
would rule out LoRA training of Qwen-Image, which is how it is usually post-trained.

More breaks are checked because they fail late and obscurely: PyPI's unrelated ``roll`` package
standing in for ROLL; NumPy 2 next to ROLL, whose ``numpy<2`` pin its own ``trl==0.9.6`` and
TransferQueue rely on (an unbounded ``opencv-python``, pulled by the OCR reward, upgrades NumPy: the
``ocr`` extra caps it, and a NumPy 1 with opencv-python >= 4.12 cannot import ``cv2``); and pyarrow
>= 26 (needs NumPy 2) next to ROLL's ``numpy<2``, which makes ``ray.init`` fail. Only importlib
metadata is read unless ``import_model`` is set.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass, field

PEFT_MIN = (0, 18, 1)
NUMPY_BELOW = (2,)           # ROLL v0.3.0: numpy<2.0a0,>=1.25 (requirements_common.txt)
OPENCV_BELOW = (4, 12)       # opencv-python 4.12 wants numpy>=2,<2.3; 5.x wants numpy>=2
ROLL_TESTED = "0.3.0"
ROLL_TESTED_COMMIT = "7f9d4d3873a87679c8d070085a4bd3bdeea7e589"  # tag v0.3.0
INSTALL_ROLL = (
    "Install ROLL from its repository (it is not on PyPI; the PyPI package 'roll' is unrelated):\n"
    "  pip install torch==2.13.0   (first and pinned; ROLL's requirements do not name torch)\n"
    "  git clone --branch v0.3.0 https://github.com/alibaba/ROLL.git && cd ROLL\n"
    "  pip install -r requirements_common.txt 'pyarrow<26' && pip install -e .\n"
    "then, from the roll_spotlight checkout: pip install -e '.[roll]'  (see docs/roll.md)"
)


class EnvironmentProblem(RuntimeError):
    """The installed packages cannot run roll_spotlight with ROLL; the message says how to fix it."""


@dataclass
class EnvironmentReport:
    """What was found. `problems` stop a run; `notes` are logged."""

    roll_version: str | None = None
    peft_version: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '0.18.1.dev0' -> (0, 18, 1)."""
    match = re.match(r"\d+(\.\d+)*", version)
    if match is None:
        raise ValueError(f"cannot read a release number from version {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def roll_available() -> bool:
    """True when alibaba/ROLL (not PyPI's unrelated 'roll') is importable."""
    try:
        return importlib.util.find_spec("roll") is not None and importlib.util.find_spec("roll.configs") is not None
    except (ImportError, ValueError):
        return False


def _check_roll(report: EnvironmentReport) -> None:
    if importlib.util.find_spec("roll") is None:
        report.problems.append("ROLL is not installed. " + INSTALL_ROLL)
        return
    if not roll_available():
        report.problems.append("the importable 'roll' is not alibaba/ROLL (it has no roll.configs); "
                               "uninstall it (pip uninstall roll). " + INSTALL_ROLL)
        return
    report.roll_version = _version("roll")
    if report.roll_version != ROLL_TESTED:
        report.notes.append(f"ROLL {report.roll_version} is installed; roll_spotlight was tested with "
                            f"ROLL v{ROLL_TESTED} ({ROLL_TESTED_COMMIT[:10]})")


def _check_peft(report: EnvironmentReport) -> None:
    report.peft_version = _version("peft")
    if report.peft_version is not None and release(report.peft_version) < PEFT_MIN:
        need = ".".join(map(str, PEFT_MIN))
        report.problems.append(
            f"peft {report.peft_version} is installed (ROLL pins peft==0.12.0), but diffusers' Qwen-Image "
            f"model does not import with it. roll_spotlight needs peft>={need} next to ROLL: run "
            f"pip install 'peft>={need}' (this relaxes ROLL's pin; ROLL's fsdp2 strategy works with it)")


def _check_numpy(report: EnvironmentReport) -> None:
    """ROLL's numpy<2 pin, and an opencv-python that imports with it (the OCR reward's cv2)."""
    numpy_version, opencv_version = _version("numpy"), _version("opencv-python")
    if numpy_version and release(numpy_version) >= NUMPY_BELOW:
        report.problems.append(
            f"numpy {numpy_version} is installed, but ROLL v{ROLL_TESTED} pins numpy<2 (trl==0.9.6 and "
            "TransferQueue need it); something upgraded it (often opencv-python 5 via the OCR reward): run "
            "pip install 'numpy<2' 'opencv-python<4.12', and install roll_spotlight with -c a constraint "
            "file holding numpy<2 (docs/roll.md)")
    elif numpy_version and opencv_version and release(opencv_version) >= OPENCV_BELOW:
        report.problems.append(
            f"opencv-python {opencv_version} needs NumPy 2 but numpy {numpy_version} is installed (ROLL pins "
            "numpy<2), so the OCR reward's cv2 does not import: pip install 'opencv-python<4.12'")


def _check_pyarrow(report: EnvironmentReport) -> None:
    numpy_version, pyarrow_version = _version("numpy"), _version("pyarrow")
    if numpy_version and pyarrow_version and release(numpy_version) < (2,) and release(pyarrow_version) >= (26,):
        report.problems.append(f"pyarrow {pyarrow_version} needs NumPy 2 but numpy {numpy_version} is installed "
                               "(ROLL pins numpy<2), which makes ray.init fail: pip install 'pyarrow<26'")


def _check_model_import(report: EnvironmentReport) -> None:
    try:
        importlib.import_module("diffusers").QwenImageTransformer2DModel  # noqa: B018 (lazy attribute import)
    except Exception as exc:  # any failure here is the thing being diagnosed; it is reported, not hidden
        report.problems.append(f"diffusers' QwenImageTransformer2DModel does not import: "
                               f"{type(exc).__name__}: {exc}")


def check_environment(*, import_model: bool = False, raise_on_problem: bool = True) -> EnvironmentReport:
    """Check that ROLL and roll_spotlight can run together; raise EnvironmentProblem listing fixes.

    ``import_model`` also imports diffusers' Qwen-Image transformer (seconds), which catches
    dependency breaks that version numbers do not show.
    """
    report = EnvironmentReport()
    _check_roll(report)
    _check_peft(report)
    _check_numpy(report)
    _check_pyarrow(report)
    if import_model:
        _check_model_import(report)
    if raise_on_problem and report.problems:
        raise EnvironmentProblem("roll_spotlight cannot run with ROLL here:\n- " + "\n- ".join(report.problems))
    return report
