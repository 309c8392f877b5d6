"""The kernel-level compute model (docs/compute.md): how long one device kernel takes.

* :mod:`.gemm` — GEMMs by shape: tile and wave quantisation over the device's SMs, a roofline
  on the bytes a GEMM moves, and the device's maximum achievable matmul FLOP/s as ceiling.
* :mod:`.attention` — the attention core as the software stack runs it (FlashAttention-2/3,
  or QKᵀ/PV GEMMs with fused or unfused softmax passes over the ``s²`` scores).
* :mod:`.elementwise` — element-wise ops, fused or not, as memory passes; optimizer and loss.
* :mod:`.device` — the device facts the model needs, and :func:`.device.op_time`, the time of
  a :class:`~ddlsim.workloads.trace.Compute` op made of kernels.

Everything here is plain arithmetic on floats or numpy arrays, shared by the trace builders,
the cost model both engines use and the vectorised search tier.
"""

from .attention import (FLASH_BACKWARD_FACTOR, attention_kernels, causal_fraction,
                        flash_forward_flops, scores_activation_bytes)
from .device import KernelDevice, kernel_device, kernel_time, op_time
from .elementwise import layer_elementwise_kernels, optimizer_bytes_per_param
from .gemm import GEMM_TILE, gemm_kernels_backward, gemm_quantisation, gemm_time
# Transformer Engine's current scaling adds itself to fp8recipe.FP8_RECIPES on import: here,
# above both, so that any import of the recipes (which runs this package first) finds it
from . import fp8_current  # noqa: F401

__all__ = ["FLASH_BACKWARD_FACTOR", "attention_kernels", "causal_fraction",
           "flash_forward_flops", "scores_activation_bytes", "KernelDevice", "kernel_device",
           "kernel_time", "op_time", "layer_elementwise_kernels", "optimizer_bytes_per_param",
           "GEMM_TILE", "gemm_kernels_backward", "gemm_quantisation", "gemm_time"]
