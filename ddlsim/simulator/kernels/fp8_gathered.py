"""The FP8 cast passes of a tensor a linear all-gathers under sequence parallelism, quantized on
the rank's sequence shard and gathered in FP8 (``Fp8Recipe.sp_gather``,
:func:`.fp8recipe.fp8_cast_kernels`' ``gathered``): Transformer Engine's
(:func:`te_gathered_passes`) and torchao's tensorwise recipe under torchtitan's float8 tensor
parallelism (:func:`torchao_gathered_passes`). Each takes the recipe's passes, ``(tensor,
bytes)`` in launch order (:class:`.fp8recipe.Fp8Recipe`), and gives them for the gathered
tensor.
"""

from __future__ import annotations

__all__ = ["te_gathered_passes", "torchao_gathered_passes"]


def te_gathered_passes(passes: tuple, tensor: str, n: float, shards: int,
                       backward: bool) -> tuple:
    """``passes`` with the casts of ``tensor`` (``n`` elements, gathered from ``shards``
    sequence shards in FP8) as Transformer Engine runs them
    (:func:`.fp8recipe.fp8_cast_kernels`): its amax read and its cast, row-wise (3 bytes per
    element), over the rank's shard; in the backward the gathered tensor's transpose (2 bytes
    per element) before the GEMMs."""
    out = []
    for role, b in passes:
        if role == f"{tensor}.amax":
            b = b / shards
        elif role.rstrip("T") == tensor:
            role, b = tensor, 3 * n / shards
        out.append((role, b))
    if not backward:
        return tuple(out)
    if tensor == "x":   # the input gathered again for the weight gradient: its FP8 shard
        return tuple(out) + ((f"{tensor}T", 2 * n),)
    at = next(i for i, (r, _) in enumerate(out) if r == tensor) + 1
    return tuple(out[:at]) + ((f"{tensor}T", 2 * n),) + tuple(out[at:])


def torchao_gathered_passes(passes: tuple, tensor: str, n: float, shards: int,
                            backward: bool) -> tuple:
    """``passes`` of torchao's tensorwise recipe with ``tensor`` (``n`` elements) gathered in
    FP8 from ``shards`` sequence shards, as torchtitan's float8 tensor parallelism runs it
    (docs/compute.md, "Sequence-parallel layout copies and float8 all-gathers").

    torchtitan 9dec370 ``parallelize_llama.py`` lines 147-192 (every float8 run) and 07c00d9
    ``models/llama3/infra/parallelize.py`` lines 60-69, 163-214 (``enable_float8_tensorwise_tp``:
    tensorwise only, "For rowwise recipes, we use regular TP and all-gather happens in high
    precision") swap ``PrepareModuleInput``/``ColwiseParallel``/``RowwiseParallel`` for
    torchao's ``PrepareFloat8ModuleInput``/``Float8ColwiseParallel``/``Float8RowwiseParallel``
    (``torchao/float8/float8_tensor_parallel.py``; eab345c and 6243040 alike):

    * the input ``x`` of ``attention`` and ``feed_forward`` is cast once, on the rank's
      sequence shard, before the ``Shard(1) → Replicate`` redistribute (6243040 lines 218-240,
      ``hp_tensor_to_float8_dynamic`` then ``redistribute``: "the float8 cast happens before
      the all-gather ... we perform fp8 allgather only once"): its amax read (2 bytes per
      element, fused with the norm before it when compiled, as without TP) and its cast
      (read 2, write 1) cover ``1/shards`` of it; ``wq``/``wk``/``wv`` (``w1``/``w3``) take the
      gathered ``Float8Tensor`` as it is (``tensor_already_casted_to_fp8``), so no module casts
      it again, eager or compiled. The weight-gradient GEMM then needs it column-major:
      ``preprocess_addmm`` copies it (``b_data.t().contiguous().t()``, 6243040
      ``float8_ops.py`` line 332: read 1, write 1 byte per element of the whole gathered
      tensor), in each module's backward;
    * the output gradient ``g`` of ``wo``/``w2`` is cast to float8 on its shard by
      ``NoopFwToFloat8BwDynamic`` (``Float8RowwiseParallel._prepare_output_fn``, lines
      138-153, after the ``Partial → Shard(1)`` redistribute, so before that redistribute's
      backward all-gather): amax and cast over ``1/shards``; the grad-weight GEMM's
      ``grad_output.t()`` is not row-major and is copied (``a_data.contiguous()``, line 330:
      read 1, write 1 over the whole tensor).

    The scale is the whole tensor's: ``tensor_to_amax`` takes ``torch.max(torch.abs(x))`` of
    the ``Shard(1)`` DTensor (``float8_utils.py`` line 65), a ``Partial(max)`` placement that
    DTensor all-reduces over the TP group before the scale is used (one 4-byte all-reduce,
    ``Fp8Recipe.sp_amax_allreduce``). The gathered ``Float8Tensor``'s layout copy is taken
    in FP8 (``float8_ops.py`` implements ``aten.split`` and ``aten.cat``, lines 233 and 252):
    :mod:`.dtensor`. The backward's reduce-scatters stay 16-bit (no cast before them)."""
    out = []
    for role, b in passes:
        if role == tensor:                    # its amax read, over the rank's shard
            out.append((role, b / shards))
        elif role == f"{tensor}T":            # its cast of the shard, one layout
            out.append((tensor, 3 * n / shards))
            if backward:                      # the gathered tensor copied column-major
                out.append((role, 2 * n))
        else:
            out.append((role, b))
    if backward and tensor == "x":            # the saved gathered input, copied column-major
        out.append(("xT", 2 * n))
    return tuple(out)
