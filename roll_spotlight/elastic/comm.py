"""Thin collective helpers over an explicit ``torch.distributed`` process group object.

Why not ``torch.distributed.all_to_all_single(..., group=pg)``: elastic regroups build groups as raw
``ProcessGroupGloo`` / ``ProcessGroupNCCL`` objects on the survivors (``new_group`` with partial
groups hangs under gloo, see the environment notes), and the module-level API rejects groups it did
not register. The ``ProcessGroup`` methods work on registered and raw groups alike, so every helper
here calls them on the group it is given. Rank and size are read from that group on every call;
nothing is cached across a regroup.

Generation prefixes: every group is built on ``PrefixStore(f"gen{generation}/{name}", store)`` so a
re-formed group never meets keys of an older one.
"""
from __future__ import annotations

import pickle
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "all_gather_cat",
    "all_to_all_chunks",
    "any_true",
    "broadcast_",
    "broadcast_object",
    "generation_prefix",
    "make_process_group",
    "sum_to",
]


def generation_prefix(generation: int, name: str) -> str:
    """Store prefix of one group in one regroup generation."""
    assert generation >= 0, generation
    return f"gen{generation}/{name}"


def make_process_group(
    store: dist.Store, prefix: str, rank: int, size: int, *, backend: str, timeout_s: float = 30.0,
    loopback: bool = False,
) -> dist.ProcessGroup:
    """Build a raw process group of ``size`` members under ``prefix``; blocks until all joined.

    ``backend`` is ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors, one device per process).
    ``loopback``: all members are on this host; gloo listens on 127.0.0.1 only (by default it
    binds to the address the host name resolves to).
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank={rank} must be in [0, size={size})")
    scoped = dist.PrefixStore(prefix, store)
    if backend == "gloo":
        if not loopback:
            return dist.ProcessGroupGloo(scoped, rank, size, timedelta(seconds=timeout_s))
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        options._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupGloo(scoped, rank, size, options)
    if backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise ValueError("backend='nccl' needs a CUDA build of torch")
        options = nccl.Options()
        options._timeout = timedelta(seconds=timeout_s)
        return nccl(scoped, rank, size, options)
    raise ValueError(f"backend={backend!r} must be 'gloo' or 'nccl'")


def all_to_all_chunks(chunks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Exchange equal chunks along dim 0: chunk ``s`` goes to rank ``s``; the result's chunk ``s``
    came from rank ``s``. ``chunks.shape[0]`` must equal the group size."""
    assert chunks.shape[0] == group.size(), (chunks.shape, group.size())
    if group.size() == 1:
        return chunks
    send = chunks.contiguous()
    out = torch.empty_like(send)
    group.alltoall_base(out, send, [], []).wait()
    return out


def all_gather_cat(x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape everywhere) along ``dim`` in rank order."""
    if group.size() == 1:
        return x
    send = x.contiguous()
    parts = [torch.empty_like(send) for _ in range(group.size())]
    group.allgather([parts], [send]).wait()
    return torch.cat(parts, dim=dim)


def broadcast_(tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> torch.Tensor:
    """In-place broadcast of a contiguous tensor from group rank ``src``."""
    assert tensor.is_contiguous(), "broadcast_ needs a contiguous tensor"
    if group.size() > 1:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        group.broadcast([tensor], opts).wait()
    return tensor


def sum_to(tensor: torch.Tensor, dst: int, group: dist.ProcessGroup) -> torch.Tensor:
    """In-place sum-reduce of a contiguous tensor onto group rank ``dst`` (the other ranks'
    tensors are scratch afterwards)."""
    assert tensor.is_contiguous(), "sum_to needs a contiguous tensor"
    if group.size() > 1:
        opts = dist.ReduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        opts.rootRank = dst
        group.reduce([tensor], opts).wait()
    return tensor


def any_true(flag: bool, group: dist.ProcessGroup, device: torch.device | str = "cpu") -> bool:
    """True on every rank when ``flag`` is true on at least one (an all-reduce MAX of one int)."""
    value = torch.tensor([int(bool(flag))], dtype=torch.int32, device=device)
    if group.size() > 1:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        group.allreduce([value], opts).wait()
    return bool(value.item())


def broadcast_object(obj, src: int, group: dist.ProcessGroup, device: torch.device | str = "cpu"):
    """``obj`` of rank ``src`` on every rank (pickled; two broadcasts: the length, then the bytes).
    Other ranks pass anything (it is ignored). Objects come from this project's own ranks only."""
    if group.size() == 1:
        return obj
    mine = group.rank() == src
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if mine else b""
    length = broadcast_(torch.tensor([len(payload)], dtype=torch.int64, device=device), src, group)
    if mine:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    broadcast_(data, src, group)
    return obj if mine else pickle.loads(data.cpu().numpy().tobytes())
