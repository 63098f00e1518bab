"""State dict <-> numpy arrays, the form in which weights sit in Ray's object store.

Why numpy: Ray stores numpy arrays out of band (pickle protocol 5), and ``ray.get`` on the same
node returns arrays that *map* the node's shared-memory object store, with no copy and no disk.
Such arrays are read-only; ``torch.from_numpy`` wraps them without a copy too, so the tensors of
:func:`numpy_to_state_dict` are read-only views as well. Callers copy them into their own model
with ``model.load_state_dict(tensors)`` (which copies parameter by parameter); writing into the
views in place is not allowed.

Dtypes numpy lacks (bfloat16, float8) travel as same-width integer views; the torch dtype name of
every entry is recorded and restored on the way back, bit for bit.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch

from roll_spotlight.weights.packed import NumpyStateDict

# torch dtypes with no numpy counterpart -> the integer dtype of the same width to view them as.
_CARRIER_DTYPES: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def state_dict_to_numpy(state_dict: Mapping[str, torch.Tensor]) -> NumpyStateDict:
    """Detached, contiguous CPU numpy copies (or views, for CPU tensors) of every tensor."""
    arrays, dtypes = {}, {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"state_dict[{name!r}] must be a torch.Tensor, got {type(tensor).__name__}")
        flat = tensor.detach().cpu().contiguous()
        carrier = _CARRIER_DTYPES.get(flat.dtype)
        arrays[name] = (flat if carrier is None else flat.view(carrier)).numpy()
        dtypes[name] = str(flat.dtype).removeprefix("torch.")
    return NumpyStateDict(arrays, dtypes)


def numpy_to_state_dict(packed: NumpyStateDict, *, copy: bool = False) -> dict[str, torch.Tensor]:
    """Tensors over ``packed``'s arrays without copying (read-only when the arrays come from the
    object store), or writable copies with ``copy=True``."""
    tensors = {}
    with warnings.catch_warnings():
        # from_numpy warns on read-only arrays; read-only is the documented contract here.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, array in packed.arrays.items():
            tensor = torch.from_numpy(array.copy() if copy else array)
            tensors[name] = tensor.view(_torch_dtype(packed.dtypes[name]))
    return tensors


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r} in a packed state dict")
    return dtype
