"""FSDP1's memory passes over a unit's gradients, as torch's ``FullyShardedDataParallel`` code
makes them (``zero3_implementation: torch_fsdp``; FSDP2's are :mod:`.fsdp2_passes`).

Per unit (a block, the root) of ``P`` parameters on the rank, sharded over ``N`` ranks of the
``W`` data-parallel ranks (``N`` times HSDP's replicas), with ``d`` bytes per element of the
autograd gradient (``param_dtype``), ``g`` per reduced element (``reduce_dtype``) and fp32
sharded parameters (:data:`.fsdp2_passes.SHARD_BYTES`), each backward runs:

* **the flat gradient's assembly**, on the compute stream once the unit's backward has run:
  FSDP1 hands the modules their parameters as views of the unit's flat parameter,
  ``torch.split(flat_param, numels)`` then ``.view(shape)`` (``torch/distributed/fsdp/
  _flat_param.py`` ``_get_unflat_views_unaligned``; ``_aligned`` under ``use_orig_params``),
  so autograd's ``SplitWithSizesBackward0`` builds the flat gradient by concatenating the
  views' gradients (``split_with_sizes_backward``: ``at::cat``), read and written, ``2d·P``,
  before ``AccumulateGrad`` hands it to the post-backward hook (:func:`grad_cat_op`);
* **before the reduce-scatter**, on the post-backward stream (``_runtime_utils.py``
  ``_post_backward_hook``, ``_reduce_grad``): the cast to ``reduce_dtype`` where it is not
  ``d`` (``flat_param.grad.to(handle._reduce_dtype)``, ``(d + g)·P``) and the pre-division
  ``padded_unsharded_grad.div_(f)`` (``2g·P``) when ``f > 1``, ``f`` =
  :func:`predivide_factor` of ``W`` (``_init_utils.py`` ``_init_process_group_state``: the
  data-parallel world size, times the replicas under HYBRID_SHARD);
* **after it**: the post-division of the shard by ``W / f`` when above 1 (``2g·P/N``), its cast
  to fp32 (``_cast_grad_to_param_dtype``, ``(g + 4)·P/N`` when ``g < 4``) and, from the
  second of ``m`` micro-batches, ``_saved_grad_shard += sharded_grad`` (``3·4·P/N``, counted
  as ``(m − 1)/m`` of it on every micro-batch, as FSDP2's add).

Read at torch 2.13; the older copies of ``_reduce_grad`` in the code index (2023-2024, with
``reduce_scatter_tensor`` for 2.13's ``reduce_scatter_single``) run the same passes. Not counted: ``F.pad`` of a gradient whose ``P`` is not a multiple of
``N`` (``_get_reduce_scatter_tensors``; ``use_orig_params`` pads the flat parameter to avoid
it, and Llama 2's blocks and roots divide by 8 and 128 exactly); a shard group of one rank,
where FSDP1 runs NO_SHARD and its all-reduce, charges the same passes over the whole ``P``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ..trace import Compute, Kernel
from .fsdp2_passes import SHARD_BYTES

__all__ = ["GradPasses", "grad_passes", "grad_cat_op", "predivide_factor", "add_grad_passes",
           "POST_BACKWARD_STREAM"]

#: FSDP1's post-backward stream, beside the compute and the collectives: the passes before and
#: after each reduce-scatter run on it (``_post_backward_hook``: ``with
#: state._device_handle.stream(state._post_backward_stream)``), apart from the all-gathers
#: (``_unshard_stream``); the compute stream waits for it once the backward has run
#: (``_post_backward_final_callback``: ``current_stream.wait_stream(root_state.
#: _post_backward_stream)``), before the optimizer step
POST_BACKWARD_STREAM = "fsdp_post_backward"


class GradPasses(NamedTuple):
    """Bytes of one backward's passes over a unit's gradients: ``cat`` on the compute stream
    after the unit's backward, ``before`` on the reduce-scatter stream before the
    reduce-scatter, ``after`` after it."""

    cat: float
    before: float
    after: float


def predivide_factor(world: int) -> int:
    """FSDP1's gradient pre-divide factor over ``world`` data-parallel ranks: the factor
    doubles from 1 while ``world`` divides by it and ``world / factor`` exceeds it (torch
    ``torch/distributed/algorithms/_comm_hooks/default_hooks.py``
    ``DefaultState._get_gradient_predivide_factor``): 16 at 128 ranks, 4 at 8, 1 at one."""
    factor = 1
    while world % factor == 0 and world / factor > factor:
        factor *= 2
    return factor


def grad_passes(params: float, shards: int, world: int, dt: float, gdt: float,
                microbatches: int) -> GradPasses:
    """FSDP1's passes over one backward's gradients of a unit (module docstring).

    Parameters
    ----------
    params : float
        Parameters of the unit on this rank, unsharded (``P``).
    shards : int
        Ranks of the unit's reduce-scatter group (``N``).
    world : int
        Data-parallel ranks in all (``W``: ``N`` times HSDP's replicas).
    dt, gdt : float
        Bytes per element of the autograd gradient and of ``reduce_dtype`` (B).
    microbatches : int
        Micro-batches of the step (``m``).

    Returns
    -------
    GradPasses
        Bytes of each pass (B).
    """
    pre = predivide_factor(world)
    shard = params / shards
    before = params * (dt + gdt) if gdt != dt else 0.0
    before += 2 * gdt * params if pre > 1 else 0.0
    after = 2 * gdt * shard if world / pre > 1 else 0.0
    after += shard * (gdt + SHARD_BYTES) if gdt < SHARD_BYTES else 0.0
    after += 3 * SHARD_BYTES * shard * (microbatches - 1) / microbatches
    return GradPasses(2 * dt * params, before, after)


def grad_cat_op(nbytes: float, dtype: str) -> Compute:
    """The flat gradient's assembly (``SplitWithSizesBackward0``'s ``cat``) of ``nbytes`` bytes
    read and written, as an op: one memory kernel at the device's streaming bandwidth."""
    return Compute("zero3.grad_cat", 0.0, nbytes, kind="elementwise", dtype=dtype,
                   kernels=(Kernel("memory", bytes=nbytes, dtype=dtype),))


def add_grad_passes(b: Any, unit: Any, shards: list, size: Callable[[str], int]) -> None:
    """Add FSDP1's passes over a backward unit's gradients (:class:`.zero3._Unit`, in place):
    for each of its ``shards`` ((group, 16-bit bytes) on the rank, ``size(group)`` ranks), the
    flat gradient's ``cat`` after its ops on the compute stream, the passes before its
    reduce-scatters (``reduce_passes``) and after them (``after_reduce``), which
    :mod:`.zero3_pass` lays on :data:`POST_BACKWARD_STREAM`. ``b``: the stage's builder (data
    types, shard group size and HSDP's replicas, micro-batches)."""
    world = b.gdp * max(1, b.plan.hsdp_replicas)
    for g, x in shards:
        grads = grad_passes(x / b.dt, size(g), world, b.dt, b.gdt, b.plan.microbatches)
        unit.ops = [*unit.ops, grad_cat_op(grads.cat, b.dtype)]
        unit.reduce_passes += grads.before
        unit.after_reduce += grads.after
