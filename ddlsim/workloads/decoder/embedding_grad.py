"""The input embedding's backward on the first pipeline stage: the dense weight gradient torch
builds for a lookup, and the stack's accumulation of it.

Every stack here looks tokens up with ``F.embedding`` (Megatron's ``VocabParallelEmbedding``,
torchtitan's ``nn.Embedding``, HF's), whose backward is not sparse: ``embedding_dense_backward``
returns a whole ``V_local × h`` gradient, a zero-filled buffer into which the ``n`` token rows
of the output gradient are summed. On the GPU (PyTorch ``aten/src/ATen/native/cuda/
Embedding.cu`` ``embedding_dense_backward_cuda``): with at most 3,072 indices one kernel sums
the rows into ``at::zeros({num_weights, h})``; above it the indices are radix-sorted and
``EmbeddingBackwardKernel.cu`` ``embedding_backward_cuda_kernel`` fills
``at::zeros({num_weights, h})``, sums each segment of equal indices into an fp32
``grad_weight_per_segment`` (``compute_grad_weight``) and writes the segments' sums into the
rows (``sum_and_scatter``). Counted here, per micro-batch and rank:

=======================  ===========================================================
kernel                   bytes
=======================  ===========================================================
zero fill                ``V_local·h·d`` (written)
rows, ≤ 3,072 tokens     ``3·n·h·d``: each token's gradient row read, its weight row
                         read and written
rows, > 3,072 tokens     ``n·h·(d + 4)`` (rows read, fp32 partial sums written), then
                         ``n·h·(4 + d)`` (partial sums read, rows written)
vocab mask (TP > 1)      ``(3 − 1/t)·n·h·d``: the backward of Megatron's
                         ``output_parallel[input_mask, :] = 0.0`` (a clone of the output
                         gradient, then its other shards' rows zeroed)
=======================  ===========================================================

``d`` the 16-bit dtype's bytes, ``n`` the rank's tokens, and every token taken as its own
segment and row (an upper bound: text repeats tokens, which shrinks the rows' writes); the
sort and segment-offset kernels (on ``n`` int64 indices, tens of kB) are not counted.

The accumulation of that gradient (the embedding is no linear, so
``gradient_accumulation_fusion`` never reaches it): the stack's hook adds it into the
gradient buffer, :func:`.wgrad.hook_accumulate_bytes` less the fresh write counted above
(Megatron-Core core_r0.8.0 baf94af3 ``megatron/core/distributed/distributed_data_parallel.py``
line 224, ``param.main_grad.add_(param.grad.data)``: read ``d``, read and write the fp32
``main_grad``); none where FSDP2 reduce-scatters every micro-batch's gradient straight from
autograd's (:func:`.fsdp.reduces_every_microbatch`; its passes are :mod:`.fsdp2_passes`'s).
With tied embeddings on a rank that also holds the output layer (PP = 1,
``share_embeddings_and_output_weights``), both gradients reach one parameter: autograd sums
them before its hook (one ``V_local·h`` add, ``3·d`` bytes an element), and

* without the fusion the head's own accumulation op adds the sum into ``main_grad``
  (:meth:`.edges.EdgeOps._head_backward`), so nothing more is added here;
* with it, the head's weight-gradient GEMM has added into ``main_grad`` already and hands
  autograd a zero-filled dummy (core_r0.8.0 ``megatron/core/tensor_parallel/layers.py``
  lines 503-522, ``torch.zeros`` because ``language_module.py`` line 67 sets
  ``zero_out_wgrad`` on a weight shared on one stage), which is summed with the embedding's
  gradient and added into ``main_grad`` by the hook (``zero_out_wgrad`` lets it through):
  the dummy's fill (``V_local·h·d``), the sum and the hook's add are counted here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ..trace import Compute, Kernel
from .wgrad import hook_accumulate_bytes

__all__ = ["SMALL_LOOKUP_TOKENS", "embedding_backward_op"]

#: indices up to which torch sums the rows in one kernel without sorting them (PyTorch
#: ``aten/src/ATen/native/cuda/Embedding.cu``, ``embedding_dense_backward_cuda``:
#: ``if (num_indices <= 3072 && !scale_grad_by_freq)``)
SMALL_LOOKUP_TOKENS = 3072

#: bytes of the fp32 accumulation type of the segment sums (``acc_type<scalar_t, true>``)
_ACC_BYTES = 4


@lru_cache(maxsize=256, typed=True)
def embedding_backward_op(tokens: float, rows: float, hidden: int, dt: int, gdt: int,
                          dtype: str, sw: Any, vocab_shards: int, tied_head: bool,
                          accumulates: bool = True) -> Compute:
    """The input embedding's backward on one rank (module docstring): ``bwd.embedding``,
    one memory kernel per pass.

    Parameters
    ----------
    tokens : float
        ``n``, token rows of the lookup's output gradient on the rank (``b·s``; ``/cp``).
    rows : float
        ``V_local``, vocabulary rows of the rank's embedding weight.
    hidden : int
        ``h``, the embedding width.
    dt, gdt : int
        bytes per element of the 16-bit training dtype and of the gradient buffer.
    dtype : str
        the kernels' dtype (bf16 under FP8).
    sw : Software
        the resolved stack (``gradient_accumulation_fusion``, its accumulation:
        :func:`.wgrad.hook_accumulate_bytes`).
    vocab_shards : int
        ranks the vocabulary is split over with Megatron's mask (TP), 1 for none.
    tied_head : bool
        whether the same rank's output layer shares the weight (tied, PP = 1).
    accumulates : bool
        whether the stack adds the gradient into a buffer; not where FSDP2 reduce-scatters
        every micro-batch's gradient from autograd's own (:func:`.fsdp.reduces_every_microbatch`).

    Returns
    -------
    Compute
        an ``elementwise`` op whose bytes are its kernels'.
    """
    row = hidden * dt
    passes = [rows * row]                               # at::zeros
    if tokens <= SMALL_LOOKUP_TOKENS:
        passes.append(3 * tokens * row)
    else:
        acc = tokens * hidden * _ACC_BYTES
        passes += [tokens * row + acc, acc + tokens * row]
    if vocab_shards > 1:
        passes += [2 * tokens * row, (1 - 1 / vocab_shards) * tokens * row]
    fused = bool(sw.gradient_accumulation_fusion)
    if tied_head:
        if fused:
            passes.append(rows * row)                   # the head's zero-filled dummy
        passes.append(3 * rows * row)                   # autograd sums the two gradients
    if accumulates and (fused or not tied_head):
        passes.append(rows * hidden * (hook_accumulate_bytes(sw, dt, gdt) - dt))
    kernels = tuple(Kernel("memory", bytes=float(x), dtype=dtype) for x in passes)
    return Compute("bwd.embedding", 0.0, float(sum(passes)), kind="elementwise", dtype=dtype,
                   kernels=kernels)
