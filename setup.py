"""Packaging for roll_spotlight.

Dependency ranges are chosen to install next to ROLL v0.3.0's ``requirements_common.txt``
(ray==2.48.0, numpy<2). torch is deliberately left unpinned: ROLL users bring their own build.
"""
import ast
from pathlib import Path

from setuptools import find_packages, setup

TEST_REQUIRES = ["pytest>=7.4", "hypothesis>=6.80", "scipy>=1.10"]


def plugin_entry_points() -> dict[str, list[str]]:
    """The plugin groups as entry points, from their one home: ``BUILTINS`` of roll_spotlight/plugins.py.

    The table is read with ``ast``, not imported: torch, ray and ROLL need not be importable when
    the package is built.
    """
    plugins = Path(__file__).resolve().parent / "roll_spotlight" / "plugins.py"
    tree = ast.parse(plugins.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "BUILTINS":
            table = ast.literal_eval(node.value.args[0])  # MappingProxyType({group: {name: target}})
            return {group: [f"{name} = {target}" for name, target in names.items()]
                    for group, names in table.items()}
    raise RuntimeError("roll_spotlight/plugins.py defines no BUILTINS table")


ENTRY_POINTS = {
    "console_scripts": [
        "spotlight = roll_spotlight.cli:main",
        "spotlight-roll = roll_spotlight.launch:main",
    ],
    **plugin_entry_points(),
}

setup(
    name="roll_spotlight",
    version="0.1.0",
    description="Spot-GPU harvesting for Flow-GRPO post-training of Diffusion Transformers on ROLL",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["roll_spotlight", "roll_spotlight.*"])
    + ["roll_spotlight.patches"],
    package_dir={"roll_spotlight.patches": "patches"},
    # the public spot traces (data files with their SOURCE.md, LICENSE, NOTICE), so a wheel carries them
    package_data={"roll_spotlight": ["py.typed"], "roll_spotlight.spot": ["data/**/*"]},
    install_requires=[
        "torch>=2.6",
        # LoRA adapters (train.lora); diffusers' Qwen-Image needs peft >= 0.18.1
        "peft>=0.18.1,<0.22",
        "diffusers>=0.35",
        "omegaconf>=2.3,<2.4",
        "hydra-core>=1.3",
        "ray>=2.48",
        "numpy>=1.24",
        "pillow>=9.0",
        "tqdm>=4.60",
        # user commands, not just tests: `spotlight quickstart`/`report` plot with matplotlib,
        # `spotlight train --emulate` sizes its local raylets with psutil, the real Qwen-Image path's
        # text encoder comes from transformers
        "matplotlib>=3.7",
        "psutil>=5.9",
        "transformers>=4.51",
    ],
    extras_require={
        # opencv-python < 4.12: 4.12 and later (5.x) need NumPy 2, which breaks ROLL's numpy<2 pin
        # when installed beside ROLL; 4.11 imports with NumPy 1 and 2 alike.
        "ocr": ["rapidocr-onnxruntime>=1.3", "opencv-python>=4.8,<4.12"],
        # transformers' Mask2Former builds its training loss even for inference, which needs scipy
        "geneval": ["scipy>=1.10"],
        # model.attention_backend: flash (through diffusers' attention dispatcher)
        "gpu": ["flash-attn>=2.6.3"],
        # Next to ROLL (installed from its repository): its dacite, and NumPy below 2 as it pins.
        "roll": ["dacite>=1.8", "numpy<2"],  # numpy<2: ROLL v0.3.0's pin
        # What the test suite imports (every module is collected, so the `roll` tier needs it too);
        # scipy: the tiny Mask2Former of the GenEval and Qwen-Image tests (see `geneval`).
        "test": TEST_REQUIRES,
        "dev": [*TEST_REQUIRES, "pytest-mock>=3.10", "accelerate>=0.30", "tensorboard>=2.14"],
    },
    entry_points=ENTRY_POINTS,
)
