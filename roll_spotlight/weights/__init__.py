"""Weight store: versioned model weights shared through Ray's object store.

``WeightVersions`` (pure bookkeeping) is exported eagerly. The torch and Ray parts
(``state_dict_to_numpy``, ``numpy_to_state_dict``, ``NumpyStateDict``, ``WeightStore``,
``WeightStoreActor``) load on first attribute access, so importing this package stays cheap.
"""
from __future__ import annotations

from roll_spotlight.lazy import lazy_exports
from roll_spotlight.weights.versions import WeightVersions

_LAZY = {
    "NumpyStateDict": "roll_spotlight.weights.packed",
    "state_dict_to_numpy": "roll_spotlight.weights.codec",
    "numpy_to_state_dict": "roll_spotlight.weights.codec",
    "WeightStoreActor": "roll_spotlight.weights.store_actor",
    "WeightStoreServer": "roll_spotlight.weights.store_actor",
    "WeightStore": "roll_spotlight.weights.store",
}

__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = ["WeightVersions", *_LAZY]
