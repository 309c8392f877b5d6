"""FSDP2's own copies around a unit's collectives as calibration samples of the torch loop
(:mod:`.torch_job`, step 2): torch's ops as ``fully_shard`` runs them on a CPU device, timed
against the bytes ddlsim's trace charges them (``zero3.copy_in``, ``zero3.copy_out``,
``zero3.chunk_cat``), so that the loop's system gives their kernel classes the rates they run
at on this machine (``device.elementwise_efficiency``). :func:`fsdp_kernels` needs the
``torch`` extra; :data:`FSDP_CLASSES` does not (the loop's system reads it).
"""

from __future__ import annotations

import math

__all__ = ["FSDP_CLASSES", "fsdp_kernels"]


#: FSDP2's copies :func:`fsdp_kernels` times, by kernel class
#: (:data:`~ddlsim.simulator.kernels.elementwise.ELEMENTWISE_CLASSES`)
FSDP_CLASSES = ("fsdp_copy_in", "fsdp_copy_out", "chunk_cat")


def fsdp_kernels(unit, world: int, rank: int) -> dict:
    """FSDP2's copies around one unit's collectives as torch runs them on a CPU device
    (``torch.ops.fsdp``, ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``), on
    the shapes of the unit's parameters (fp32, no ``param_dtype``: the torch loop's), with
    the bytes ddlsim counts for them (:func:`~ddlsim.workloads.decoder.fsdp2_passes.
    unshard_passes`, ``reduce_passes``; classes :data:`FSDP_CLASSES`):

    * ``fsdp_copy_in``: ``all_gather_copy_in``, the ``_foreach_copy_`` of the dim-0 shards
      into the all-gather input (``foreach_all_gather``; none at one rank);
    * ``fsdp_copy_out``: ``split_with_sizes_copy`` of the ``[world, ·]`` all-gather output
      into the unsharded parameters along dim 1 (``foreach_all_gather_copy_out``); at one
      rank ``wait_for_unshard``'s ``tensor.copy_`` per parameter;
    * ``chunk_cat``: ``chunk_cat`` of the unsharded gradients into the reduce-scatter input
      (``foreach_reduce_scatter_copy_in``).

    Each is timed after a flush of the last-level cache (:func:`.torch_samples._rates`): inside the
    iteration ``_chunk_cat`` on a block's gradients took 0.62 ms, 0.76 ms alone after a
    64 MiB flush and 0.24-0.37 ms alone hot (docs/validation.md, the torch loop, 2026-11-30
    06:15 UTC): the operands come from memory more than from cache.

    Parameters
    ----------
    unit : list of torch.Tensor
        The unit's parameters (a block's), unsharded.
    world, rank : int
        Ranks the unit is sharded over, and this one.

    Returns
    -------
    dict
        Class name → (a call, bytes ddlsim counts for it).
    """
    import torch
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401 (torch.ops.fsdp)
    from ..workloads.decoder.fsdp2_passes import reduce_passes, unshard_passes
    shapes = [tuple(p.shape) for p in unit]
    params = sum(math.prod(s) for s in shapes)
    sizes = [-(-s[0] // world) * math.prod(s[1:]) for s in shapes]    # padded dim-0 shards
    shards = [torch.randn(n) for n in sizes]
    gathered = torch.empty(world * sum(sizes))
    unsharded = [torch.empty(world * n).view(world, -1) for n in sizes]
    grads = [torch.randn(s) for s in shapes]
    scatter_input = torch.empty(world * sum(sizes)).view(world, -1)
    unshard, reduce = unshard_passes(params, world, 4), reduce_passes(params, world, 4, 4, 1)
    ops = torch.ops.fsdp
    calls = {"fsdp_copy_out": (
        (lambda: ops.split_with_sizes_copy(gathered.view(world, -1), sizes, dim=1,
                                           out=unsharded)) if world > 1
        else lambda: [u.view(-1).copy_(x) for u, x in zip(unsharded, shards)],
        unshard.copy_out),
        "chunk_cat": (lambda: ops.chunk_cat(grads, dim=0, num_chunks=world,
                                            out=scatter_input), reduce.chunk_cat)}
    if world > 1:
        calls["fsdp_copy_in"] = (lambda: ops.all_gather_copy_in(
            shards, gathered, sizes, sum(sizes), rank), unshard.copy_in)
    return calls
