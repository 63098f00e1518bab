"""GPU types the cost model knows: the datasheet figures a compute or transfer time depends on.

A :class:`GpuSpec` holds the dense BF16 peak (what an MFU multiplies), the memory (what a memory
plan must fit, read as GiB like ``model.gpu_memory_gb``) and the intra-node GPU-to-GPU bandwidth
(what a peer weight copy or an SP group's gradient sum crosses), each from the vendor's datasheet.
``CostModel.with_gpu(name)`` applies one; the MFUs stay the ones calibrated on H800
(``benchmarks.sim_reference``), which is an assumption for the other GPUs: the same software stack reaching
the same fraction of a different peak.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type: ``peak_bf16_tflops`` dense (no 2:4 sparsity), ``memory_gib``, ``nvlink_gb_s``
    (total NVLink bandwidth per GPU, both directions), and the datasheet they come from."""

    name: str
    peak_bf16_tflops: float
    memory_gib: float
    nvlink_gb_s: float
    source: str


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 SXM5", 989.0, 80.0, 900.0,
                    "NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity "
                    "(989 dense), 80 GB HBM3, NVLink 900 GB/s"),
    "h800": GpuSpec("H800 SXM5", 989.0, 80.0, 400.0,
                    "NVIDIA H800 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity "
                    "(989 dense), 80 GB HBM3, NVLink 400 GB/s"),
    "h200": GpuSpec("H200 SXM", 989.0, 141.0, 900.0,
                    "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity "
                    "(989 dense), 141 GB HBM3e, NVLink 900 GB/s"),
    "a100": GpuSpec("A100 SXM4 80GB", 312.0, 80.0, 600.0,
                    "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS dense "
                    "(624 with sparsity), 80 GB HBM2e, NVLink 600 GB/s"),
}


def gpu_spec(name: str) -> GpuSpec:
    """The spec of ``name`` (case-insensitive, e.g. "h100", "H800"); unknown names raise ValueError
    listing the known ones."""
    try:
        return GPUS[name.strip().lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {sorted(GPUS)}") from None
