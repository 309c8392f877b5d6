"""PyTorch's async tensor parallelism (``tp_comm_overlap: torch_async``): the micro-pipelined
all-gather-matmul and matmul-reduce-scatter of ``torch.distributed._symmetric_memory``, as
torchtitan's ``enable_async_tensor_parallel`` runs them (Inductor's ``micro_pipeline_tp``
pass rewrites ``all_gather → mm`` and ``mm → reduce_scatter`` into ``fused_all_gather_matmul``
and ``fused_matmul_reduce_scatter``).

Read in pytorch/pytorch ``torch/distributed/_symmetric_memory/__init__.py`` (the stored
snapshot 006b161f; the functions are those of the 2025 releases):

* ``_pipelined_multi_all_gather_and_consume`` (all-gather-matmul): each rank first copies its
  shard into its symmetric-memory buffer and meets the others at a barrier — *not* overlapped
  ("we are giving up the chance to overlap 'mv' and 'b' with the first shard_consumer");
  then it multiplies its own shard while the next shard is copied from a peer
  (``copy_`` from the peer's buffer: a copy engine over NVLink, no SMs), and so on over
  ``TP`` chunks on two alternating streams. The GEMM runs as ``TP`` GEMMs of ``M/TP`` rows.
* ``_pipelined_produce_and_all2all`` (matmul-reduce-scatter): the ``TP`` chunks of the
  GEMM are produced one per destination rank, each copied to it while the next is computed,
  the rank's own chunk last; the ``TP`` partial sums are then added by ``reduce_partials``
  (one streaming kernel after the pipeline, not overlapped).

So, unlike TransformerEngine's userbuffers (:mod:`.tp_overlap`), the collective overlaps
only the one GEMM that consumes or produces it (the ``qkv``/``fc1`` forward GEMM behind the
all-gather, ``proj``/``fc2`` before the reduce-scatter; in the backward the row-parallel
data gradient behind the gradient's all-gather and the column-parallel data gradient before
its reduce-scatter), never the attention core or the element-wise work, takes no SMs, and
costs the chunked GEMMs' lower efficiency (their time from the GEMM-by-shape model) plus the
exposed local copy and reduction. A GEMM of ``TP`` chunks ``g`` with a transfer ``c`` of the
other ``TP − 1`` shards ends after ``max(TP·g, g + c)``: here ``TP − 1`` chunks beside the
transfer, then the last chunk (all-gather) or the first chunk before it (reduce-scatter).
The backward's re-gather of the saved input (``.ag.input``, the weight gradient's
contraction dimension) is no ``all_gather → mm`` on the gathered rows and stays blocking.

Where the column-parallel linears on one input are separate modules (the stack's
``separate_projections``: torchtitan's ``wq``, ``wk``, ``wv`` and ``w1``, ``w3``), the
backward's reduce-scatter of that input's gradient takes the *sum* of their data gradients,
which autograd adds before the collective: Inductor's ``fuse_matmul_reduce_scatter`` fuses
a reduce-scatter only when its input is an ``mm`` or ``_scaled_mm`` (or one between two
reshapes: ``_find_producer_matmul`` in pytorch ``torch/_inductor/fx_passes/
micro_pipeline_tp.py``, as read in the code index's versions of late 2024 and 2025), so that
reduce-scatter stays blocking ("in the backward graph, the reduce-scatters are receiving as
input the addition of various scaled_mms, so it's not what we are looking to fuse": pytorch
PR #149946, its author's review reply on ``micro_pipeline_tp.py``, 2025-03-28).

An all-gather is fused only where its result is the GEMMs' operand itself
(``_find_consumer_matmuls``): in the GEMMs' dtype, or cast to FP8 before the gather (torchao's
tensorwise TP styles). Under torchao's rowwise recipe torchtitan gathers in bf16 and the FP8
cast runs between the gather and each ``_scaled_mm``, forward and backward, so every
all-gather stays blocking with its layout copy, and only the reduce-scatters after a
``_scaled_mm`` are fused (:func:`ddlsim.simulator.kernels.dtensor.all_gather_fused`; pytorch
issue #149990).
"""

from __future__ import annotations

from ...simulator.kernels.dtensor import all_gather_fused
from ..trace import Collective, Compute, Kernel, Op, Wait
from .fp8linear import fp8_sp_gather
from .gemm_groups import gemm_groups

__all__ = ["role", "block", "layer_body"]


def role(c: Collective, backward: bool, summed: bool = False,
         gathers: bool = True) -> str | None:
    """``pre`` (an all-gather fused with the GEMM it feeds), ``post`` (a reduce-scatter fused
    with the GEMM producing it) or None (blocking) for one TP collective; ``summed``: the
    stack's separate projections, whose backward reduce-scatter takes a sum of data
    gradients and is not fused; ``gathers``: the all-gathers' results are the GEMMs'
    operands (:func:`_gathers`), else none is fused (module docstring)."""
    if c.name.endswith(".ag.input") or c.op not in ("all_gather", "reduce_scatter"):
        return None
    if c.op == "all_gather" and not gathers:
        return None
    if c.op == "reduce_scatter" and backward and summed and not c.name.startswith("recompute."):
        return None         # a gradient's (the recomputed forward's follow one GEMM each)
    return "pre" if c.op == "all_gather" else "post"


def _summed(b) -> bool:
    """Whether builder ``b``'s stack runs separate column-parallel projections on one input
    (``separate_projections``), whose data gradients are summed before the backward's
    reduce-scatter."""
    return bool(b.sw.separate_projections)


def _gathers(b) -> bool:
    """Whether builder ``b``'s sequence-parallel all-gathers are fused with the GEMMs they
    feed (:func:`~ddlsim.simulator.kernels.dtensor.all_gather_fused`)."""
    fp8 = b.plan.train_dtype == "fp8"
    return all_gather_fused(b.sw, fp8, fp8_sp_gather(b.sw, b.plan.train_dtype, b.tp, b.sp,
                                                     b.shape))


def _kernel_flops(k: Kernel) -> float:
    if k.kind == "gemm":
        M, N, K = k.shape
        return 2.0 * M * N * K * k.batch
    return k.flops


def _part(x: Compute, name: str, kernels: tuple[Kernel, ...], scale: float) -> Compute:
    """A piece of ``x`` running ``kernels``, with its share of ``x``'s counted FLOPs."""
    return Compute(f"{x.name}.{name}", scale * sum(_kernel_flops(k) for k in kernels),
                   kind=x.kind, dtype=x.dtype, kernels=kernels)


def _chunks(k: Kernel, tp: int) -> tuple[Kernel, ...]:
    """``k`` as ``tp`` GEMMs of ``M/tp`` rows (one launch each)."""
    M, N, K = k.shape
    one = Kernel("gemm", (M / tp, N, K), batch=k.batch, dtype=k.dtype)
    return (one,) * tp


def _memory(x: Compute, name: str, nbytes: float) -> Compute:
    return Compute(f"{x.name}.{name}", 0.0, kind="elementwise", dtype=x.dtype,
                   kernels=(Kernel("memory", bytes=nbytes, dtype=x.dtype),))


def block(x: Compute, pres: list[Collective], posts: list[Collective], tp: int,
          ops: list[Op]) -> None:
    """Append to ``ops`` the compute op ``x`` with its fused all-gathers ``pres`` and
    reduce-scatters ``posts`` (module docstring); ``x`` must carry GEMM kernels."""
    ks = x.kernels or ()
    gemms = [i for i, k in enumerate(ks) if k.kind == "gemm"]
    if not gemms or (not pres and not posts):
        ops += [Op(c) for c in pres] + [Op(x)] + [Op(c) for c in posts]
        return
    rows = ks[gemms[0]].shape[0]                        # the tokens M of the layer
    on_rows = [i for i in gemms if ks[i].shape[0] == rows]
    first, last = on_rows[0], on_rows[-1]
    total = sum(_kernel_flops(k) for k in ks)
    scale = x.flops / total if total else 0.0
    pieces: list[tuple[str, tuple[Kernel, ...]]] = []
    cut = 0
    if pres:
        for c in pres:    # "mv": the local shard into the symmetric buffer, before the barrier
            ops.append(Op(_memory(x, "ag_copy", 2 * c.bytes / tp)))
        ops.append(Op(Wait(f"{x.name}.tp_async.start", "compute"), "tp"))
        ops += [Op(c, "tp", (len(ops) - 1,)) for c in pres]
        chunks = _chunks(ks[first], tp)
        ops.append(Op(_part(x, "ag_mm", ks[:first] + chunks[:-1], scale)))
        ops.append(Op(Wait(f"{x.name}.tp_async.ag_wait", "tp")))
        pieces.append(("ag_mm_last", chunks[-1:]))
        cut = first + 1
    if posts and (last >= cut):
        chunks = _chunks(ks[last], tp)
        ops.append(Op(_part(x, "mm_rs_first", tuple(k for _, kk in pieces for k in kk)
                            + ks[cut:last] + chunks[:1], scale)))
        anchor = len(ops) - 1
        ops += [Op(c, "tp", (anchor,)) for c in posts]
        ops.append(Op(_part(x, "mm_rs", chunks[1:], scale)))
        ops.append(Op(Wait(f"{x.name}.tp_async.rs_wait", "tp")))
        ops += [Op(_memory(x, "rs_reduce", c.bytes * (1 + 1 / tp))) for c in posts]
        pieces, cut = [], last + 1
        posts = []
    rest = tuple(k for _, kk in pieces for k in kk) + ks[cut:]
    if rest:
        ops.append(Op(_part(x, "rest", rest, scale)))
    ops += [Op(c) for c in posts]      # no GEMM of M rows left after the all-gather's


def _has_gemm(x) -> bool:
    return isinstance(x, Compute) and any(k.kind == "gemm" for k in x.kernels or ())


def _lead_gathers(items: list, role_of) -> list:
    """``items`` with each phase's trailing all-gathers (after its last GEMM op: they feed
    the first GEMM of the next layer's phase) moved to the front of the phase; a phase is a
    run of ops of the recomputed forward (``recompute.*``) or of the others."""
    out, start = [], 0
    while start < len(items):
        key = _phase(items[start])
        end = start
        while end < len(items) and _phase(items[end]) == key:
            end += 1
        run = items[start:end]
        last = max((i for i, x in enumerate(run) if _has_gemm(x)), default=None)
        lead = [] if last is None else [x for x in run[last + 1:] if isinstance(x, Collective)
                                        and role_of(x) == "pre"]
        out += lead + [x for x in run if not any(x is t for t in lead)]
        start = end
    return out


def _phase(x) -> bool:
    return x.name.startswith("recompute.")


def layer_body(b, backward: bool, payloads: list) -> list[Op]:
    """One layer's ops under ``torch_async``: the all-gathers after the last GEMM op of the
    forward, of the recomputed forward and of the backward feed the first GEMM of the next
    layer's (QKV; the down projection's data gradient) and move to the front of their run
    (:func:`_lead_gathers`: Inductor fuses every all-gather a matmul reads, in the forward
    and the backward graph); each compute op takes the all-gathers before it and the
    reduce-scatters after it."""
    summed, gathers = _summed(b), _gathers(b)
    items = _lead_gathers(list(payloads), lambda c: role(c, backward, summed, gathers))
    ops: list[Op] = []
    pres: list[Collective] = []
    i = 0
    while i < len(items):
        x = items[i]
        if isinstance(x, Collective):
            if role(x, backward, summed, gathers) == "pre":
                pres.append(x)
            else:
                ops.append(Op(x))
            i += 1
            continue
        j = i + 1
        posts = []
        while j < len(items) and isinstance(items[j], Collective) \
                and role(items[j], backward, summed, gathers) == "post":
            posts.append(items[j])
            j += 1
        block(x, pres, posts, b.tp, ops)
        pres, i = [], j
    ops += [Op(c) for c in pres]
    return ops


def structured_body(b, backward: bool, body: list[Op], is_linear, is_tp) -> list[Op]:
    """A partitioner's layer ops (one op per linear GEMM; context parallelism's ring on its
    own streams) under ``torch_async``: each linear GEMM takes the TP all-gathers before it
    and the reduce-scatters after it (:func:`block`); every other op keeps its place and its
    dependencies (on a GEMM: on the last op of its block)."""
    summed, gathers = _summed(b), _gathers(b)

    def of(kind: str):
        return lambda op: op.payload if is_tp(op) \
            and role(op.payload, backward, summed, gathers) == kind else None

    out: list[Op] = []
    where: dict[int, int] = {}
    for i, op, pres, posts in gemm_groups(body, is_linear, of("pre"), of("post")):
        if op is None:                        # collectives after the last GEMM
            out += [Op(c) for c in pres]
        elif pres is None or op.deps or op.stream != "compute" or op.repeat != 1:
            out += [Op(c) for c in pres or ()]
            where[i] = len(out)
            out.append(Op(op.payload, op.stream, tuple(where[d] for d in op.deps), op.repeat))
            out += [Op(c) for c in posts or ()]
        else:
            block(op.payload, pres, posts, b.tp, out)
            where[i] = len(out) - 1
    return out
