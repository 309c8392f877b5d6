"""Weight-gradient GEMMs that accumulate into the gradient buffer (``main_grad``).

With Megatron's ``gradient_accumulation_fusion`` a linear layer's weight-gradient GEMM does
not write a fresh 16-bit gradient that a hook then adds into ``main_grad``: it adds into
``main_grad`` itself, ``D = Aᵀ·dC + main_grad`` with ``β = 1`` and ``main_grad`` as its ``C``
and ``D`` operands, in the buffer's dtype (fp32 under Megatron's ``grad_reduce_dtype``). The
GEMM then reads and writes ``2 × 4`` bytes per weight element where a plain GEMM writes 2
(:func:`~ddlsim.simulator.kernels.gemm.gemm_bytes`), which a weight gradient over few tokens
(an expert's hundreds) pays in full: its ``K`` (the tokens) is short, so its bytes, not its
FLOPs, bound it. The separate accumulation pass is then gone
(:meth:`.stage.StageBase.grad_accumulate_bytes`).

Which GEMMs accumulate: the linears that Megatron-Core builds as Transformer Engine modules
(``TELinear``, ``TELayerNormColumnParallelLinear``, ``TEGroupedLinear``: dense layers, shared
experts, routed experts under ``TEGroupedMLP`` or ``SequentialMLP``) and its own
``ColumnParallelLinear`` (the output head, through apex's ``fused_weight_gradient_mlp_cuda``).
Not the router (its own autograd function) nor the legacy ``GroupedMLP`` (one
``grouped_gemm`` launch writing ``param.grad``).

Not modelled: under Transformer Engine the first micro-batch of a step overwrites
``main_grad`` (``accumulate = fuse_wgrad_accumulation and not is_first_microbatch``: ``β = 0``,
no read of ``C``); every micro-batch is timed here as one that reads it.

References
----------
NVIDIA/Megatron-LM d98e8a64dd ``megatron/core/extensions/transformer_engine.py`` line 1293
(``TELinear``: ``fuse_wgrad_accumulation=self.config.gradient_accumulation_fusion``) and
line 2527 (``TEGroupedLinear``, the same); ``megatron/core/tensor_parallel/layers.py``
lines 713-731 (``LinearWithGradAccumulationAndAsyncCommunication.backward``:
``wgrad_gemm_accum_fp32`` into an fp32 ``main_grad``, ``wgrad_gemm_accum_fp16`` into a
16-bit one). NVIDIA/apex 9082484b ``csrc/megatron/fused_weight_gradient_dense_cuda.cu``
``wgrad_gemm_accum_fp32_cuda`` (``alpha = 1.0; beta = 1.0``, ``C`` = the fp32 ``d_weight``).
NVIDIA/TransformerEngine d0067d0d ``transformer_engine/pytorch/module/linear.py``
lines 1231-1262 (the wgrad GEMM's ``out = main_grad``, ``out_dtype = main_grad.dtype``,
``accumulate``), ``module/grouped_linear.py`` lines 1152-1157 and 1165-1177 (the same per
expert), ``common/gemm/cublaslt_gemm.cu`` line 820 (``beta = accumulate ? 1 : 0``).
Megatron-LM 900f1b76 ``megatron/core/transformer/moe/experts.py`` lines 165-171
(``GroupedMLP``: ``gg.ops.gmm``, no ``main_grad``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...config import DTYPE_BYTES
from ...simulator.kernels.gemm import gemm_bytes
from ...software import grad_dtype_bytes
from ..trace import Kernel

__all__ = ["main_grad_bytes", "into_main_grad", "accumulating", "accumulate_pass_bytes", "hook_accumulate_bytes"]


def main_grad_bytes(sw: Any, train_dtype: str) -> int:
    """Bytes per element of the buffer a fused weight-gradient GEMM accumulates into: the
    stack's gradient-buffer dtype (``grad_reduce_dtype`` applied to the 16-bit parameters;
    4 with Megatron's fp32 ``main_grad``) under ``gradient_accumulation_fusion``, else 0 (the
    GEMM writes a fresh gradient).

    Parameters
    ----------
    sw : Software
        the resolved software stack.
    train_dtype : str
        ``train.dtype`` (FP8 runs keep bf16 parameters).

    Returns
    -------
    int : bytes per element, 0 without the fusion.
    """
    if not sw.gradient_accumulation_fusion:
        return 0
    return grad_dtype_bytes(sw.grad_reduce_dtype, "bf16" if train_dtype == "fp8" else train_dtype)


def into_main_grad(pair: tuple[Kernel, ...], main_grad: int) -> tuple[Kernel, ...]:
    """The backward GEMMs of one linear, ``(data gradient, weight gradient)`` as
    :func:`~ddlsim.simulator.kernels.gemm.gemm_kernels_backward` orders them, with the weight
    gradient accumulating into a ``main_grad`` of ``main_grad`` bytes per element: its
    ``bytes`` set to :func:`~ddlsim.simulator.kernels.gemm.gemm_bytes` with that buffer
    (``A`` and ``B`` in the kernel's dtype, ``C`` read and written) and its
    ``accumulate_bytes`` to ``main_grad`` (the epilogue's extra bytes, which a device with a
    serialized epilogue pays per wave: :mod:`ddlsim.simulator.kernels.gemm`); ``pair``
    itself when ``main_grad`` is 0.

    Parameters
    ----------
    pair : tuple of Kernel
        the two ``gemm`` kernels.
    main_grad : int
        :func:`main_grad_bytes`.

    Returns
    -------
    tuple of Kernel
    """
    if not main_grad:
        return pair
    dgrad, wgrad = pair
    return dgrad, accumulating(wgrad, main_grad)


def accumulating(wgrad: Kernel, main_grad: int) -> Kernel:
    """The weight-gradient GEMM ``wgrad`` accumulating into a ``main_grad`` of ``main_grad``
    bytes per element (:func:`into_main_grad`'s rule for one kernel): its ``bytes`` with that
    buffer read and written, its ``accumulate_bytes`` the buffer's; ``wgrad`` itself when
    ``main_grad`` is 0.

    Parameters
    ----------
    wgrad : Kernel
        A weight-gradient GEMM kernel (its ``shape``, ``batch`` and ``dtype``).
    main_grad : int
        Bytes per element of the gradient buffer it accumulates into (4: fp32); 0: none.

    Returns
    -------
    Kernel
        The GEMM with ``bytes`` (B) counting the buffer's read and write and
        ``accumulate_bytes`` = ``main_grad`` (B per element), or ``wgrad`` unchanged.
    """
    if not main_grad:
        return wgrad
    nbytes = gemm_bytes(*wgrad.shape, wgrad.batch, DTYPE_BYTES.get(wgrad.dtype, 2), main_grad)
    return replace(wgrad, bytes=float(nbytes), accumulate_bytes=float(main_grad))


def accumulate_pass_bytes(sw: Any, dt: float, gdt: float) -> float:
    """Bytes per parameter of the pass that adds one micro-batch's weight gradients into the
    accumulated ones: the GEMM writes them in the training dtype (``dt`` bytes), then they are
    read and added into the gradient buffer of the stack's ``grad_reduce_dtype`` (``gdt``
    bytes; fp32 under Megatron-LM's ``main_grad`` hook, ``param.main_grad.add_(param.grad)``,
    16-bit where autograd accumulates ``param.grad`` itself). None with
    ``gradient_accumulation_fusion`` (the weight-gradient GEMM accumulates into the buffer:
    :func:`main_grad_bytes`); under Megatron-FSDP each micro-batch overwrites the buffer
    (``main_grad.copy_(param.grad)``: :mod:`.megatron_fsdp`), no read of it.

    Parameters
    ----------
    sw : Software
        the resolved software stack.
    dt, gdt : float
        bytes per element of the training dtype and of the gradient buffer.

    Returns
    -------
    float
        bytes moved per parameter and micro-batch.
    """
    if sw.gradient_accumulation_fusion:
        return 0.0
    return hook_accumulate_bytes(sw, dt, gdt)


def hook_accumulate_bytes(sw: Any, dt: float, gdt: float) -> float:
    """:func:`accumulate_pass_bytes` of a weight whose gradient no GEMM accumulates: one that
    autograd hands to the stack's hook as a fresh 16-bit ``param.grad`` whatever
    ``gradient_accumulation_fusion`` says (the input embedding: :mod:`.embedding_grad`).

    Parameters
    ----------
    sw : Software
        the resolved software stack.
    dt, gdt : float
        bytes per element of the training dtype and of the gradient buffer.

    Returns
    -------
    float
        bytes moved per parameter and micro-batch, the fresh gradient's write included.
    """
    if sw.zero3_implementation == "megatron_fsdp":   # ZeRO-3 only (its check)
        return 2 * dt + gdt
    return 2 * dt + 2 * gdt
