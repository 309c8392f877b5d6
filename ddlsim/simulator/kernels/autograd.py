"""The gradient sums autograd adds where one tensor feeds several modules (docs/compute.md,
"Separate projections").

A stack whose model keeps the projections that read one input as separate modules
(``software.kernels.separate_projections``: torchtitan's Llama ``Attention.wq``, ``wk``,
``wv`` all read the normed ``x``; ``FeedForward.w1`` and ``w3`` both read the normed ``h``)
runs one GEMM per module, each reading the input again, and in the backward each module's
data-gradient GEMM writes its own gradient of that input. Autograd sums them before the
gradient flows on: PyTorch's ``InputBuffer::accumulate``
(torch/csrc/autograd/input_buffer.cpp) adds each further gradient into the first, one
``add`` kernel each, reading two tensors and writing one. Megatron-Core's fused
``linear_qkv`` and gated ``linear_fc1`` run one GEMM and have no such sum.

Under ``torch.compile`` the block's backward is one traced graph and Inductor fuses the sum's
point-wise adds into one generated kernel (Ansel et al., "PyTorch 2", ASPLOS 2024, sec. 5:
horizontal and vertical fusion of point-wise ops): it reads the ``n`` gradients and writes
their sum once. Where the sum feeds a point-wise op of the same block (the norm's backward,
no sequence-parallel reduce-scatter in between) Inductor may fuse it further into that op:
then only the ``n - 1`` extra reads remain, so the compiled figure is an upper bound there.
"""

from __future__ import annotations

from ...workloads.trace import Kernel

__all__ = ["input_grad_sum_kernels"]


def input_grad_sum_kernels(consumers: int, elements: float, dtype_bytes: int, dtype: str,
                           compiled: bool) -> tuple[Kernel, ...]:
    """The memory kernels that sum the input gradients of ``consumers`` modules reading one
    input of ``elements`` elements.

    Parameters
    ----------
    consumers : int
        modules that read the input (3 for ``wq``, ``wk``, ``wv``; 2 for ``w1``, ``w3``).
    elements : float
        elements of the input, and of each gradient of it.
    dtype_bytes : int
        bytes per element of the gradients (the 16-bit compute dtype: 2).
    dtype : str
        the kernels' dtype name.
    compiled : bool
        the block runs under ``torch.compile`` (one fused kernel) rather than eager
        (one ``add`` per further gradient).

    Returns
    -------
    tuple of Kernel
        eager: ``consumers - 1`` kernels of ``3 · elements · dtype_bytes`` bytes each (read
        two, write one); compiled: one kernel of ``(consumers + 1) · elements · dtype_bytes``
        bytes (read all, write one); none for a single consumer.

    References
    ----------
    PyTorch torch/csrc/autograd/input_buffer.cpp, ``InputBuffer::accumulate`` (the sum of a
    tensor's gradients from its several uses); J. Ansel et al., "PyTorch 2: Faster Machine
    Learning Through Dynamic Python Bytecode Transformation and Graph Compilation",
    ASPLOS 2024, sec. 5 (Inductor's point-wise fusion).
    """
    if consumers < 2:
        return ()
    size = elements * dtype_bytes
    if compiled:
        return (Kernel("memory", bytes=(consumers + 1) * size, dtype=dtype),)
    return tuple(Kernel("memory", bytes=3 * size, dtype=dtype) for _ in range(consumers - 1))
