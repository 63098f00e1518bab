"""The object-store form of a state dict (numpy only, so the store actor never imports torch)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NumpyStateDict:
    """``arrays[name]`` holds the bits of tensor ``name``; ``dtypes[name]`` its torch dtype name
    (for bfloat16 and float8 the array is a same-width integer view of those bits)."""

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]

    def __post_init__(self) -> None:
        if self.arrays.keys() != self.dtypes.keys():
            raise ValueError(
                f"NumpyStateDict: arrays and dtypes must have the same keys, got "
                f"{sorted(self.arrays.keys() ^ self.dtypes.keys())} in only one of them"
            )

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())
