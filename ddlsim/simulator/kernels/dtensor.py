"""The layout copies of PyTorch DTensor's sequence-parallel collectives
(``software.kernels.sp_layout_copy``; docs/compute.md, "Sequence-parallel layout copies and
float8 all-gathers").

Megatron keeps activations sequence-first, ``[s, b, h]``: its sequence-parallel all-gathers
and reduce-scatters work on the leading dimension, in place. torchtitan's tensor parallelism
is DTensor over batch-first ``[b, s, h]`` activations sharded on the sequence, ``Shard(1)``
(9dec370 ``parallelize_llama.py`` lines 174-192, 07c00d9 ``models/llama3/infra/
parallelize.py`` lines 189-207: ``SequenceParallel`` norms, ``PrepareModuleInput(Shard(1) →
Replicate())`` before ``attention`` and ``feed_forward``, ``RowwiseParallel(output_layouts=
Shard(1))`` for ``wo`` and ``w2``). DTensor's ``Shard._to_replicate_tensor`` and
``Shard._reduce_shard_tensor`` call ``funcol.all_gather_tensor(gather_dim=1)`` and
``funcol.reduce_scatter_tensor(scatter_dim=1)``; NCCL gathers and scatters the leading
dimension only, so ``torch/distributed/_functional_collectives.py`` re-lays them:

* ``all_gather_tensor``: ``if gather_dim != 0: res = torch.cat(torch.chunk(res,
  group_size, dim=0), dim=gather_dim)``: a copy of the gathered tensor (read and write once);
* ``reduce_scatter_tensor``: ``if scatter_dim != 0: self = torch.cat(torch.chunk(self,
  group_size, dim=scatter_dim))``: a copy of the whole input.

The view that replaces the all-gather's copy when every dimension before the gathered one
is 1 (``torch._utils._maybe_view_chunk_cat``, a local batch of 1) came with pytorch#169404
(opened 2025-12-02), after the nightlies torchtitan's published runs used (torch 1963fc8 of
2024-12-23, 38410cf9 of 2025-06-14: ``data/software.yaml``, ``gemm_library``'s source), so
both stacks copy at every local batch.

Under torch.compile the copies stay kernels of their own, but two cases: Inductor lowers the
``cat`` (``lowering.py`` ``cat``) into the kernel that computes its input when that input
is point-wise, so the reduce-scatter of the separate projections' summed input gradients
(:mod:`.autograd`, compiled: one Inductor kernel) is written in the scattered layout and
costs no copy; the ``cat`` of a collective's or a GEMM's output is copied (a ``ConcatKernel``
or a point-wise ``cat`` feeding a GEMM). With async TP (``tp_comm_overlap: torch_async``)
Inductor's ``micro_pipeline_tp`` pass matches the ``split``-and-``cat`` form of an
all-gather on a non-zero dimension (``non_zero_dim_all_gather_pattern``) and its
reduce-scatter counterpart and replaces them with the fused symmetric-memory kernels, which
read and write the shards in place: only the backward's re-gather of the saved input, which
no GEMM fuses (:mod:`ddlsim.workloads.decoder.torch_tp`), keeps its copy, and so does every
all-gather whose result is not the GEMMs' operand itself (:func:`all_gather_fused`: torchao's
rowwise recipe, gathered in bf16 and cast after).

Where torchao gathers a float8 tensor (:func:`~.fp8_gathered.torchao_gathered_passes`: the
tensorwise recipe), ``Float8Tensor``'s own ``aten.split`` and ``aten.cat`` copy its FP8 data:
one byte per element.
"""

from __future__ import annotations

from typing import Any

from ...workloads.trace import Kernel

__all__ = ["sp_layout_copies", "layout_copy", "regathers_input", "keeps_gathered_input",
           "all_gather_fused"]

#: part of :func:`~ddlsim.workloads.decoder.layerkernels.layer_kernels` → the layout copies
#: around its GEMMs: (tensor, where, collective), tensor ``x`` (the gathered input), ``g``
#: (the gathered output gradient) or ``y`` (a reduce-scatter's 16-bit input), ``where``
#: ``before`` or ``after`` the part's kernels, collective ``ag`` (fused under async TP),
#: ``ag.input`` (the backward's re-gather: never fused), ``ag.saved`` (the fused all-gather's
#: input kept for the weight gradient, copied to 2-D: :func:`sp_layout_copies`) or ``rs``
#: (fused under async TP; ``rs.sum``: its input the separate projections' gradient sum,
#: written in place compiled)
SP_COPIES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "attn.qkv": (("x", "before", "ag"),),
    "attn.proj": (("y", "after", "rs"),),
    "mlp.fc1": (("x", "before", "ag"),),
    "mlp.fc2": (("y", "after", "rs"),),
    "bwd.mlp.fc2": (("g", "before", "ag"),),
    "bwd.mlp.fc1": (("x", "before", "ag.input"), ("x", "before", "ag.saved"),
                    ("y", "after", "rs.sum")),
    "bwd.attn.proj": (("g", "before", "ag"),),
    "bwd.attn.qkv": (("x", "before", "ag.input"), ("x", "before", "ag.saved"),
                     ("y", "after", "rs.sum")),
}


def regathers_input(sw: Any, recompute: str) -> bool:
    """Whether the backward all-gathers a sequence-parallel column-parallel linear's input
    again for its weight gradient (``ag.input``).

    Megatron saves the sequence-sharded input and gathers it in every backward (Korthikanti
    et al. 2022 §4.2.2). Under DTensor TP (``sp_saves_gathered_input``: torchtitan) autograd
    saves the gathered input itself, so only op-level selective checkpointing, whose save
    list keeps the reduce-scatter but not the all-gather, gathers it again; full
    recomputation's forward gathers it once as part of the recomputed layer.

    Parameters
    ----------
    sw : Software
        the resolved software stack.
    recompute : str
        ``train.recompute``: ``none``, ``selective`` or ``full``.

    Returns
    -------
    bool
        True where the backward's re-gather runs.
    """
    return not sw.sp_saves_gathered_input or recompute == "selective"


def keeps_gathered_input(sw: Any, recompute: str) -> bool:
    """Whether a layer whose activations are kept whole (no recomputation, or the layer full
    recomputation rebuilds in its backward) holds its column-parallel linears' all-gathered
    inputs, ``b·s·h`` each, rather than their sequence shards: the memory side of
    :func:`regathers_input`, of which it is the negation (what is not gathered again was
    saved).

    Parameters
    ----------
    sw : Software
        the resolved software stack.
    recompute : str
        ``train.recompute``.

    Returns
    -------
    bool
        True under DTensor TP outside op-level selective checkpointing (torchtitan's
        ``ColwiseParallel``: autograd saves the ``aten.mm`` input, the redistributed
        ``Replicate`` tensor).
    """
    return not regathers_input(sw, recompute)


def all_gather_fused(sw: Any, fp8_linears: bool, fp8_gather: bool) -> bool:
    """Whether torch's async TP fuses a sequence-parallel all-gather with the GEMMs it feeds.

    Inductor's ``micro_pipeline_tp`` pass fuses an all-gather only with the matmuls that
    read its result directly (``_find_consumer_matmuls``: a ``mm``/``_scaled_mm`` user, or
    one between two reshapes). Under FP8 the gathered tensor is that operand only where it
    was cast before the gather (torchao's ``Float8ColwiseParallel``/
    ``PrepareFloat8ModuleInput``, the tensorwise recipe: ``fp8_gather``). torchtitan runs
    the rowwise recipe with the regular TP styles, "all-gather happens in high precision",
    and torchao's ``matmul_with_hp_or_float8_args`` casts the gathered input (and, in the
    backward, the gathered output gradient) to FP8 before its ``_scaled_mm``: the cast's
    kernels stand between, nothing is fused (pytorch issue #149990, 2025-03-25: "the
    all-gather-matmul patterns were NOT being fused" under rowwise scales, the
    matmul-reduce-scatters were).

    Parameters
    ----------
    sw : Software
        the resolved software stack (``tp_comm_overlap``).
    fp8_linears : bool
        the linears' GEMMs run in FP8 (``train.dtype: fp8``).
    fp8_gather : bool
        the all-gathers carry FP8 (:func:`~ddlsim.workloads.decoder.fp8linear.fp8_sp_gather`).

    Returns
    -------
    bool
        True under ``tp_comm_overlap: torch_async`` where the gathered tensor is the GEMMs'
        operand.

    References
    ----------
    pytorch ``torch/_inductor/fx_passes/micro_pipeline_tp.py`` (``fuse_all_gather_matmul``,
    ``_find_consumer_matmuls``; the code index's late-2024 and 2025 versions);
    torchtitan 820504e ``torchtitan/models/llama3/parallelize_llama.py`` lines 57-65
    (``enable_float8_tensorwise_tp`` off for rowwise); torchao 6243040
    ``torchao/float8/float8_linear.py`` lines 82-121 and 131-154 (cast, then reshape, then
    ``torch.mm``).
    """
    return sw.tp_comm_overlap == "torch_async" and (not fp8_linears or fp8_gather)


def layout_copy(elements: float, dtype_bytes: float, dtype: str) -> Kernel:
    """One layout copy of ``elements`` elements of ``dtype_bytes`` bytes each: a memory
    kernel reading and writing them once (``2 · elements · dtype_bytes`` bytes).

    References
    ----------
    PyTorch ``torch/distributed/_functional_collectives.py``: ``all_gather_tensor``
    (``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)`` for ``gather_dim !=
    0``) and ``reduce_scatter_tensor`` (``torch.cat(torch.chunk(self, group_size,
    dim=scatter_dim))`` for ``scatter_dim != 0``).
    """
    return Kernel("memory", bytes=2 * elements * dtype_bytes, dtype=dtype)


def sp_layout_copies(sw: Any, t: int, sp: bool, elements: float, dt: int, dtype: str,
                     fp8_gather: bool, summed: dict[str, bool], regather: bool = True,
                     fp8_linears: bool = False) -> dict[str, tuple[tuple, tuple]]:
    """The layout copies of one dense layer's sequence-parallel collectives (module
    docstring), by part of :func:`~ddlsim.workloads.decoder.layerkernels.layer_kernels`.

    Under async TP a fused all-gather hands its result back in the order it gathered it,
    ``[s, b, h]`` seen as ``[b, s, h]`` (``_fused_all_gather_matmul_impl``'s ``unflatten``:
    ``view(...).flatten(0, 1).movedim(0, gather_dim)``, pytorch
    ``torch/distributed/_symmetric_memory/__init__.py``, 2025). A 16-bit weight gradient
    reads it through ``reshape(-1, h)``, which cannot view it for a local batch above one
    and copies it: the gathered output gradient keeps its copy in the backward, and the
    gathered input, saved or recomputed, is copied once there (``ag.saved``) unless the
    backward gathers it again. Under FP8 torchao copies both into the layouts
    ``_scaled_mm`` takes anyway (:mod:`.fp8recipe`, ``xT``/``gT``): no copy is added.

    Parameters
    ----------
    sw : Software
        the resolved software stack (``sp_layout_copy``, ``compile``, ``tp_comm_overlap``).
    t : int
        tensor-parallel ranks.
    sp : bool
        sequence parallelism.
    elements : float
        elements of one gathered activation, ``b·s·h``.
    dt : int
        bytes per element of the 16-bit activations.
    dtype : str
        the copies' dtype name.
    fp8_gather : bool
        the inputs and output gradients are gathered in FP8 (one byte per element:
        :func:`~ddlsim.workloads.decoder.fp8linear.fp8_sp_gather`).
    summed : dict
        part → whether its reduce-scatter's input is the sum of separate projections' input
        gradients (:mod:`.autograd`), which a compiled block writes in the scattered layout.
    regather : bool
        the backward gathers the linears' inputs again (:func:`regathers_input`); without
        it the ``ag.input`` copies go with their collective.
    fp8_linears : bool
        the linears' GEMMs run in FP8: under async TP an all-gather not in FP8 keeps its
        copy (:func:`all_gather_fused`).

    Returns
    -------
    dict
        part → (kernels before its own, kernels after them); empty without copies (a stack
        whose activations are sequence-first, one TP rank or no sequence parallelism).
    """
    if not (sw.sp_layout_copy and t > 1 and sp):
        return {}
    ag = all_gather_fused(sw, fp8_linears, fp8_gather)
    rs = sw.tp_comm_overlap == "torch_async"
    reshaped = ag and not fp8_linears          # the 16-bit weight gradient copies it
    out = {}
    for part, copies in SP_COPIES.items():
        in_place = summed.get(part, False) and bool(sw.compile)
        kept = {"ag": lambda x: not ag or (reshaped and x == "g"), "ag.input": lambda x: regather,
                "ag.saved": lambda x: reshaped and not regather, "rs": lambda x: not rs,
                "rs.sum": lambda x: not (rs or in_place)}
        sides: dict[str, tuple] = {"before": (), "after": ()}
        for tensor, where, coll in copies:
            if not kept[coll](tensor):
                continue
            nbytes = 1 if fp8_gather and tensor in "xg" else dt
            sides[where] += (layout_copy(elements, nbytes, dtype),)
        if sides["before"] or sides["after"]:
            out[part] = (sides["before"], sides["after"])
    return out
