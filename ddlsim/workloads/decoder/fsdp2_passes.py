"""FSDP2's memory passes around its collectives, as torch's ``fully_shard`` code makes them.

Per unit (a block, the root, an edge unit) of ``P`` parameters on the rank (TP-sharded),
sharded over ``N`` ranks, with ``d`` bytes per 16-bit parameter (``param_dtype``), ``g`` bytes
per reduced gradient element (``reduce_dtype``) and fp32 sharded parameters and gradients
(:data:`SHARD_BYTES`):

* each unshard at ``N > 1``: the cast of the shard to ``d`` (``FSDPParam.all_gather_inputs``:
  ``_to_dtype_if_needed``, ``(4 + d)·P/N``) and its copy into the all-gather input
  (``all_gather_copy_in``: ``_foreach_copy_``, ``2d·P/N``) on the all-gather copy-in stream
  (:data:`.zero3_pass.COPY_IN_STREAM`) before the all-gather; after it, the copy-out
  (``foreach_all_gather_copy_out``: ``split_with_sizes_copy``, ``2d·P``) on the compute stream;
* each unshard at ``N = 1`` (``wait_for_unshard``'s ``world_size == 1`` branch: no
  collective): the cast (``all_gather_inputs[0]``, ``(4 + d)·P``) and the copy
  (``tensor.copy_``, ``2d·P``), both on the compute stream;
* each backward: the ``chunk_cat`` of the 16-bit gradients into the reduce-scatter input, cast
  to ``reduce_dtype`` (``foreach_reduce_scatter_copy_in``, ``(d + g)·P``, kernel class
  :data:`CHUNK_CAT`), on the compute stream; then on the reduce-scatter stream the
  reduce-scatter, or at ``N = 1`` the copy of its input into its output
  (``reduce_output.copy_``, ``2g·P``); when ``g ≠ 4`` the cast of the reduced shard to fp32
  (``_to_dtype_if_needed(reduce_output, orig_dtype)``, ``(g + 4)·P/N``); from the second of
  ``m`` micro-batches the add into the sharded fp32 gradient
  (``sharded_param.grad._local_tensor += ...``, ``3·4·P/N``), counted as ``(m − 1)/m`` of it on
  every micro-batch's block (the block is the same for every micro-batch).

The copy-in, the copy-out and the ``chunk_cat`` are one kernel each of class :data:`COPY_IN`,
:data:`COPY_OUT` and :data:`CHUNK_CAT`, which a device may time at their own achieved bandwidth
(``device.elementwise_efficiency``; the torch loop measures them on its CPU,
``ddlsim/reference/fsdp_copies.py``); one without their figures runs them at its streaming rate.

No other pass touches the gradients: autograd writes each micro-batch's 16-bit unsharded
gradient once (the weight-gradient GEMM's output), FSDP2 reduce-scatters it at every
micro-batch (torchtitan leaves ``set_requires_gradient_sync`` on) and frees it, so no
unsharded accumulation pass runs (``FSDP::post_backward_accumulate`` launches no kernel
unless gradient sync is off: :func:`.fsdp.reduces_every_microbatch`).

The unit's float8 weights (``enable_fsdp_float8_all_gather``) cast in their own
``fsdp_pre_all_gather`` (:mod:`.fsdp_float8`); their copy-in is not counted.

Measured: the H200 Kineto trace of torch 2.11's one-rank step
(``benchmarks/data/device_h200_2026-11-30/run1/llama/llama_step_trace.json.gz``, read by
``benchmarks/kineto_vs_ddlsim.py``) has per parameter and unshard one ``aten::to`` and one
``aten::copy_`` (a device-to-device memcpy) on the compute stream, per unit and backward one
``chunk_cat_cuda_kernel`` on the compute stream and one device-to-device memcpy on the
reduce-scatter stream, and nothing else: the ``N = 1`` items above.

FSDP2's host time (its hooks, ``_chunk_cat``'s metadata, the optimizer step over DTensors) is
:mod:`.fsdp2_host`'s.

References
----------
pytorch/pytorch ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``
(010ae4a8): ``foreach_all_gather``, ``_get_param_all_gather_inputs``, ``all_gather_copy_in``,
``foreach_all_gather_copy_out``, ``foreach_reduce`` (the ``world_size > 1`` reduce-scatter
or the ``reduce_output.copy_``, the cast to ``orig_dtype``, the ``+=`` into an existing
sharded gradient); ``_fsdp_param_group.py`` ``FSDPParamGroup.unshard`` (returns early at
``world_size == 1``) and ``wait_for_unshard`` (its ``world_size == 1`` branch, ``tensor.copy_
(all_gather_input)``, ``all_gather_input = fsdp_param.all_gather_inputs[0]``).
"""

from __future__ import annotations

from typing import NamedTuple

from ..trace import Compute, Kernel

__all__ = ["SHARD_BYTES", "CHUNK_CAT", "COPY_IN", "COPY_OUT", "UnshardPasses", "ReducePasses",
           "unshard_passes", "reduce_passes", "chunk_cat_op"]

#: bytes per element of FSDP2's sharded parameters and gradients: fp32 (torchtitan builds
#: the model in fp32 and shards it with ``MixedPrecisionPolicy(param_dtype=bf16,
#: reduce_dtype=fp32)``: ``torchtitan/models/llama3/infra/parallelize.py`` ``apply_fsdp``; the
#: sharded parameter keeps its original dtype, ``_fsdp_param.py`` ``FSDPParam.init_dtype_attrs``)
SHARD_BYTES = 4

#: the kernel class of ``torch._chunk_cat`` (``device.elementwise_efficiency``)
CHUNK_CAT = "chunk_cat"
#: the kernel classes of the unshard's copy-in (``all_gather_copy_in``'s ``_foreach_copy_``,
#: with the cast to ``param_dtype``) and copy-out (``split_with_sizes_copy``; at one rank
#: ``tensor.copy_``): a device without their figures runs them at its streaming bandwidth
COPY_IN, COPY_OUT = "fsdp_copy_in", "fsdp_copy_out"


class UnshardPasses(NamedTuple):
    """Bytes of one unshard's passes: ``copy_in`` (the shard's cast and copy into the
    all-gather input) on the all-gather copy-in stream before the all-gather; at one rank
    ``cast``, then ``copy_out`` on the compute stream before the unit computes."""

    copy_in: float
    cast: float
    copy_out: float


class ReducePasses(NamedTuple):
    """Bytes of one backward's passes over a unit's gradients: ``chunk_cat`` on the compute
    stream after the unit's backward, ``after`` on the reduce-scatter stream after the
    reduce-scatter (or in its place at one rank)."""

    chunk_cat: float
    after: float


def unshard_passes(params: float, shards: int, dt: float) -> UnshardPasses:
    """FSDP2's passes of one unshard of ``params`` parameters sharded over ``shards`` ranks
    (module table).

    Parameters
    ----------
    params : float
        Parameters of the unit on this rank, unsharded (after TP).
    shards : int
        Ranks of the unit's all-gather group (``N``).
    dt : float
        Bytes per element of the gathered parameters (``param_dtype``).

    Returns
    -------
    UnshardPasses
        Bytes of each pass.
    """
    cast = SHARD_BYTES + dt if dt < SHARD_BYTES else 0.0
    if shards == 1:
        return UnshardPasses(0.0, params * cast, params * 2 * dt)
    return UnshardPasses(params / shards * (cast + 2 * dt), 0.0, params * 2 * dt)


def reduce_passes(params: float, shards: int, dt: float, gdt: float,
                  microbatches: int) -> ReducePasses:
    """FSDP2's passes over one backward's gradients of ``params`` parameters sharded over
    ``shards`` ranks (module table).

    Parameters
    ----------
    params : float
        Parameters of the unit on this rank, unsharded.
    shards : int
        Ranks of the unit's reduce-scatter group (``N``).
    dt, gdt : float
        Bytes per element of the autograd gradient and of ``reduce_dtype``.
    microbatches : int
        Micro-batches of the step (``m``).

    Returns
    -------
    ReducePasses
        Bytes of each pass.
    """
    shard = params / shards
    after = 2 * gdt * params if shards == 1 else 0.0
    if gdt != SHARD_BYTES:
        after += shard * (gdt + SHARD_BYTES)
    after += 3 * SHARD_BYTES * shard * (microbatches - 1) / microbatches
    return ReducePasses(params * (dt + gdt), after)


def chunk_cat_op(nbytes: float, dtype: str) -> Compute:
    """The ``chunk_cat`` of ``nbytes`` bytes (read and written) as an op: one memory kernel
    of class :data:`CHUNK_CAT`, which a device may time at its own achieved bandwidth
    (``device.elementwise_efficiency``)."""
    return Compute("zero3.chunk_cat", 0.0, nbytes, kind="elementwise", dtype=dtype,
                   kernels=(Kernel("memory", bytes=nbytes, dtype=dtype, variant=CHUNK_CAT),))
