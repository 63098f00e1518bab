"""roll_spotlight: spot-GPU harvesting for Flow-GRPO post-training of Diffusion Transformers.

Importing this package is cheap on purpose: it imports no torch, ray or diffusers. Subpackages
that need them import them themselves.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
