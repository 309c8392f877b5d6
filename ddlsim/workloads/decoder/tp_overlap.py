"""Megatron-Core's ``--tp-comm-overlap`` (TransformerEngine userbuffers) on one dense layer of
the 1-D plan with sequence parallelism.

TransformerEngine (``transformer_engine/pytorch/module/base.py``, ``initialize_ub``) overlaps
each sequence-parallel collective with a GEMM by one of three methods:

* ``ring_exchange`` — the all-gather feeding a column-parallel GEMM (``qkv``/``fc1`` forward)
  and the output-gradient all-gather feeding a row-parallel dgrad (``proj``/``fc2``): the
  GEMM runs in ``TP`` chunks, the first on the rank's own chunk while it is sent on and the
  next one received, each later chunk once its part has arrived (TransformerEngine
  ``CommOverlapP2PBase::split_overlap_ag``, ``aggregate`` off: TE's default and every
  published NeMo/Megatron-Bridge H100 config), so nothing is exposed unless the exchange
  outlasts the GEMM; copy engines, 1 SM (``num_sm = 1``).
* ``pipeline`` — the reduce-scatter after a row-parallel GEMM (``proj``/``fc2`` forward):
  ``num_splits = 4`` chunks, the last chunk's reduce-scatter exposed.

Both split the GEMM into launches of their own along its rows (:func:`chunked`).
* ``bulk`` — the backward's all-gather of the saved input (for the weight gradient) and the
  reduce-scatter of the input gradient of ``qkv``/``fc1`` run beside the dgrad/wgrad GEMMs:
  nothing exposed unless they outlast the GEMMs.

``pipeline`` and ``bulk`` run on ``num_sm = 16`` SMs with ``set_sm_margin``: the GEMM they
overlap gets the device's SMs less 16 for its whole duration, a slowdown of
``16 / (S − 16)`` (13.8 % on an H100 SXM's 132 SMs, 17.4 % on an A100's 108) — added as a
contention op ``<gemm>.tp_overlap.sm_contention`` beside the GEMM
(:mod:`ddlsim.simulator.kernels.contention`, timed from the device's ``sm_count``).

``tp_comm_overlap: bulk`` is Megatron's ``--tp-comm-overlap`` with
``--disable-tp-comm-overlap-ag --disable-tp-comm-overlap-rs`` (only the backward's bulk
overlaps); ``pipelined`` is its default (all of the above; Megatron-LM arguments.py,
2024-06). Megatron asserts sequence parallelism with it; ddlsim applies it to dense layers of
the 1-D plan, with or without context parallelism (otherwise inactive, or refused when the
plan sets it: :mod:`.overlap`; with CP, per GEMM: :func:`structured_body`), and to an MoE
layer's attention linears (:func:`attention_slice`).

In the trace each GEMM compute op ``G`` with its collectives becomes: the exposed chunks of
the collectives feeding ``G`` (compute stream), the rest of every overlapped collective on
the ``tp`` stream, ``G`` (and its SM-margin op), a ``Wait`` for ``tp``, the exposed chunk of
the reduce-scatter after ``G``: ``pre + max(G + margin, rest) + post``.

**Without userbuffers** (``tp_comm_overlap: off``) Megatron-Core still overlaps the backward's
sequence-parallel collectives through NCCL (``software.tp_async_backward``; Megatron-LM
900f1b76 ``megatron/core/tensor_parallel/layers.py``,
``LinearWithGradAccumulationAndAsyncCommunication.backward``, and TransformerEngine's
``Linear``): the input's all-gather is launched asynchronously before the data-gradient GEMM
and the input-gradient reduce-scatter before the weight-gradient GEMM — the collectives
``bulk`` overlaps, mode ``async`` here. Without sequence parallelism the same class launches
the input-gradient all-reduce of a column-parallel layer (``qkv``/``fc1``: Megatron's ``f``
operator's backward) asynchronously before the weight-gradient GEMM (Megatron-LM 739cb43d
``megatron/mpu/layers.py`` lines 272-276, ``--no-async-tensor-model-parallel-allreduce`` off by
default since 16c90445, 2021-09): it runs beside that block's backward, as the reduce-scatter
does with SP. NCCL's kernels take one SM per channel while they run (24 on a DGX A100:
:func:`~ddlsim.simulator.kernels.contention.nccl_ring_ctas`), so the overlapped GEMMs get a
contention op too, for as long as the collectives run beside them: ``async`` is ``bulk``
with NCCL's channels in place of TE's fixed margin.
"""

from __future__ import annotations

from dataclasses import replace

from ..trace import Collective, Compute, Contention, Loop, Op, Wait
from . import torch_tp
from .gemm_groups import gemm_groups

__all__ = ["TE_COMM_SMS", "RS_SPLITS", "active", "mode", "overlapped_layers",
           "structured_body", "attention_slice"]

#: SMs of TransformerEngine's pipeline/bulk userbuffers kernels (``num_sm`` default, TE
#: ``pytorch/module/base.py`` ``initialize_ub``)
TE_COMM_SMS = 16
#: chunks of the pipelined reduce-scatter (TE ``num_splits`` default for ``pipeline``)
RS_SPLITS = 4


def mode(cfg) -> str | None:
    """How this plan's TP collectives overlap its GEMMs: the stack's or plan's
    ``tp_comm_overlap`` (``bulk``/``pipelined``: TE userbuffers; ``torch_async``: PyTorch's
    micro-pipelined TP, :mod:`.torch_tp`), else ``async`` with
    ``tp_async_backward`` (Megatron's NCCL overlap in the backward, with or without sequence
    parallelism), else None (blocking). None too unless TP > 1 and 1-D (with or without context
    parallelism); ``torch_async`` for a dense model only (an MoE model's attention linears
    take the others: :func:`attention_slice`); under ZeRO-3 only ``tp_comm_overlap`` with per-layer (FSDP)
    units (torchtitan's async TP), never the async backward; the userbuffers modes need
    sequence parallelism as well (without it the NCCL path runs, as in Megatron when
    TransformerEngine's userbuffers are not set up)."""
    p, sw = cfg.parallel, cfg.software
    if not (p.tp > 1 and p.tp_mode == "1d"):
        return None
    if p.zero_stage == 3 and sw.zero3_gather != "per_layer":
        return None
    if sw.tp_comm_overlap != "off" and p.sequence_parallel:
        if cfg.model.num_local_experts and sw.tp_comm_overlap == "torch_async":
            return None                # torch's async TP: modelled for dense models only
        return sw.tp_comm_overlap      # under ZeRO-3 too: FSDP's per-layer units (.fsdp)
    return "async" if sw.tp_async_backward and p.zero_stage != 3 else None


def active(cfg) -> bool:
    """Whether any TP overlap (:func:`mode`) applies to this plan."""
    return mode(cfg) is not None


def _role(c: Collective, backward: bool, how: str) -> tuple[str, int] | None:
    """(``pre``/``post``, chunks of which one is exposed; 0: none exposed), or None when the
    collective stays blocking. ``post`` collectives are only the pipelined reduce-scatter
    and the bulk ones, i.e. those whose method takes SMs (the SM margin applies); ``pre``
    ones are the ring exchanges, none of whose chunks waits before its GEMM starts."""
    name = c.name
    if name.endswith(".amax"):   # FP8 current scaling's amax all-reduce: TE waits for it
        return None              # on the compute stream (simulator/kernels/fp8_current.py)
    if not backward or name.startswith("recompute."):
        if c.op == "reduce_scatter":
            return ("post", RS_SPLITS) if how == "pipelined" else None
        return ("pre", 0) if how == "pipelined" else None
    if name.endswith(".ag.input") or c.op == "reduce_scatter":
        return "post", 0                       # bulk (every mode)
    if how == "async" and c.op == "all_reduce":
        return "post", 0                       # without SP: the input-gradient all-reduce
    return ("pre", 0) if how == "pipelined" else None


def _overlapped_flops(b, backward: bool, gemm: Compute) -> float:
    """FLOPs of the GEMMs the collectives after ``gemm``'s block run beside (forward: the
    row-parallel ``proj``/``fc2``; backward: ``qkv``/``fc1`` dgrad + wgrad): the attention's
    (the same in every layer) or a dense layer's MLP, so asked as a dense layer (a model
    whose first layers are dense has both kinds)."""
    g = b.shape.layer_gemm_flops(b.b, b.s, moe=False)
    attn = "attn" in gemm.name
    if backward:
        f = 2 * ((g["q"] + g["kv"]) if attn else g["mlp"] * (1 - 1 / b.shape.mlp_matrices))
    else:
        f = g["proj"] if attn else g["mlp"] / b.shape.mlp_matrices
    return f / b.tp


def chunked(gemm: Compute, how: str, tp: int, pending: list, posts: list) -> Compute:
    """``gemm`` as TransformerEngine's userbuffers run it beside the collectives that feed
    (``pending``) and follow (``posts``) it: split along its rows (the tokens) into GEMM
    launches of their own. A ring exchange feeding the op's first GEMM kernel runs it in
    ``tp`` chunks (``CommOverlapP2PBase::split_overlap_ag``: one ``nvte_cublas_gemm`` per
    step on ``M/tp`` rows); a pipelined reduce-scatter after its last GEMM kernel runs that
    one in :data:`RS_SPLITS` chunks (``CommOverlapBase::split_overlap_rs``: one GEMM per
    split). Each chunk pays its own tile and wave quantisation and fixed launch cost
    (:func:`ddlsim.simulator.kernels.gemm.gemm_time`): at TP 8 with 4,096 tokens per rank a
    chunk has 512 rows. Unchanged without per-kernel shapes (``gemm.kernels`` None) and
    under ``bulk``, whose GEMMs run whole.

    Parameters
    ----------
    gemm : the compute op whose GEMM kernels the collectives overlap.
    how : the overlap mode (:func:`mode`); only ``pipelined`` splits.
    tp : tensor-parallel size, the ring exchange's steps.
    pending : ``(collective, chunks)`` overlapped before the op (ring exchanges).
    posts : ``(collective, chunks)`` overlapped after it (:data:`RS_SPLITS` chunks: the
        pipelined reduce-scatter; 0: bulk).

    Returns
    -------
    Compute
        ``gemm`` with each split GEMM kernel ``(M, N, K)`` replaced by ``n`` kernels
        ``(M/n, N, K)``; the same FLOPs.
    """
    if how != "pipelined" or not gemm.kernels:
        return gemm
    at = [i for i, k in enumerate(gemm.kernels) if k.kind == "gemm"]
    splits = {}
    if at and pending:
        splits[at[0]] = tp
    if at and any(n == RS_SPLITS for _, n in posts):
        splits.setdefault(at[-1], RS_SPLITS)
    if not splits:
        return gemm
    kernels = []
    for i, k in enumerate(gemm.kernels):
        n = splits.get(i, 1)
        M, N, K = k.shape
        kernels += [k] if n == 1 else [replace(k, shape=(M / n, N, K))] * n
    return replace(gemm, kernels=tuple(kernels))


def _contention(name: str, flops: float, dtype: str, how: str, posts: list) -> Op:
    """The contention op of GEMMs of ``flops`` overlapped under ``how``: TE's ``num_sm`` for
    their whole duration, or (``async``) NCCL's channels while the ``posts`` run."""
    if how == "async":
        c = Contention(flops, collectives=tuple(x for x, _ in posts))
    else:
        c = Contention(flops, sms=TE_COMM_SMS)
    return Op(Compute(f"{name}.tp_overlap.sm_contention", 0.0, dtype=dtype, contention=c))


def _split(c: Collective, n: int) -> tuple[Collective | None, Collective]:
    """(exposed chunk or None, overlapped rest) of ``c`` cut into ``n`` chunks (0: all rest)."""
    if n == 0:
        return None, c
    return (Collective(f"{c.name}.chunk", c.op, c.group, c.bytes / n),
            Collective(f"{c.name}.overlapped", c.op, c.group, c.bytes * (n - 1) / n))


def _overlap_around(ops: list[Op], pending: list, posts: list) -> tuple[list[Op], bool]:
    """Append to ``ops`` the exposed chunks of the ``pending`` collectives feeding the next
    GEMM and the overlapped rest of them and of its ``posts`` on the ``tp`` stream (anchored
    on the last compute-stream op, or — for a layer's first GEMM, with none before it in the
    layer — on everything the compute stream has issued, so that a layer's collectives never
    start before the compute before it has ended); return the posts' exposed chunks, to
    follow the GEMM, and whether anything was overlapped."""
    rests, after = [], []
    for c, n in pending:
        chunk, rest = _split(c, n)
        if chunk is not None:
            ops.append(Op(chunk))
        rests.append(rest)
    for c, n in posts:
        chunk, rest = _split(c, n)
        rests.append(rest)
        if chunk is not None:
            after.append(chunk)
    anchor = next((k for k in range(len(ops) - 1, -1, -1) if ops[k].stream == "compute"), None)
    deps = () if anchor is None else (anchor,)
    if anchor is None and rests:
        ops.append(Op(Wait("tp_overlap.start", "compute"), "tp"))
    ops += [Op(r, "tp", deps) for r in rests]
    return [Op(c) for c in after], bool(rests)


def layer_body(b, backward: bool, payloads: list) -> list[Op]:
    """One layer's ops with the overlaps of :func:`mode` (``torch_async``: :mod:`.torch_tp`)."""
    how = b.plan.tp_overlap
    if how == "torch_async":
        return torch_tp.layer_body(b, backward, payloads)
    items = list(payloads)
    last_gemm = max(i for i, x in enumerate(items) if isinstance(x, Compute)
                    and any(isinstance(y, Collective) for y in items[i + 1:]))
    trailing = [x for x in items[last_gemm + 1:] if isinstance(x, Collective)
                and (_role(x, backward, how) or ("",))[0] == "pre"]
    items = trailing + [x for x in items if not any(x is t for t in trailing)]
    # group: each compute op with the collectives after it (its "post" and the next's "pre")
    ops: list[Op] = []
    pending_pre: list[tuple[Collective, int]] = []
    i = 0
    while i < len(items):
        x = items[i]
        if isinstance(x, Collective):
            role = _role(x, backward, how)
            if role is None:
                ops.append(Op(x))
            else:
                pending_pre.append((x, role[1]))   # only "pre" reach here (posts are taken)
            i += 1
            continue
        j = i + 1
        posts = []
        while j < len(items) and isinstance(items[j], Collective):
            role = _role(items[j], backward, how)
            if role is None or role[0] != "post":
                break
            posts.append((items[j], role[1]))
            j += 1
        if not posts:   # the pending all-gathers feed the next GEMM that has its own
            ops.append(Op(x))
            i += 1
            continue
        exposed_after, _ = _overlap_around(ops, pending_pre, posts)
        ops.append(Op(chunked(x, how, b.tp, pending_pre, posts)))
        fwd_type = not backward or x.name.startswith("recompute.")
        ops.append(_contention(x.name, _overlapped_flops(b, not fwd_type, x), x.dtype, how,
                               posts))
        ops.append(Op(Wait(f"{x.name}.tp_overlap.wait", "tp")))
        ops += exposed_after
        pending_pre = []
        i = j
    ops += [Op(c) for c, _ in pending_pre]
    return ops


def overlapped_layers(b, backward: bool, count: int, payloads: list) -> Op:
    """``count`` identical layers with the overlaps, as one :class:`Loop` (each layer's
    ``tp`` stream drains before the next begins)."""
    return Op(Loop("layers.bwd" if backward else "layers.fwd",
                   tuple(layer_body(b, backward, payloads)), count))


#: the linear layers' GEMM ops of a partitioner's layer (``fwd.qkv``, ``bwd.fc2``, …)
_LINEAR = ("qkv", "proj", "fc1", "fc2")


def _is_linear(op: Op) -> bool:
    p = op.payload
    return (isinstance(p, Compute) and op.stream == "compute"
            and p.name.rsplit(".", 1)[-1] in _LINEAR)


def _is_tp(op: Op) -> bool:
    p = op.payload
    return isinstance(p, Collective) and p.group == "tp" and op.stream == "compute" \
        and not op.deps


def attention_slice(b, backward: bool, body: list[Op]) -> list[Op]:
    """An MoE layer's attention ops (``qkv``, the core, ``proj`` and their TP collectives, one
    op per linear GEMM from the partitioner: :meth:`.moe.MoEOps._attention`) with the plan's
    overlap, as :func:`structured_body` lays a partitioner's layer out: Megatron-Core builds
    an MoE layer's attention from the same Transformer Engine linears as a dense layer's
    (``linear_qkv``, ``linear_proj`` with userbuffers ``qkv``/``proj``), while its experts'
    ``GroupedLinear`` and its dispatcher's collectives have no such overlap. In the forward
    the all-gather the partitioner emits after ``proj``'s reduce-scatter feeds the next
    layer's ``qkv`` (sequence parallelism): moved before ``qkv``, as :func:`layer_body` moves
    a layer's trailing ones. (Shared experts' ``fc1``/``fc2`` keep their collectives
    blocking: not modelled.)"""
    if not backward:
        last = max((i for i, o in enumerate(body) if o.stream == "compute"
                    and isinstance(o.payload, Compute)), default=-1)
        moved = [o for o in body[last + 1:] if _is_tp(o)
                 and (_role(o.payload, False, b.plan.tp_overlap) or ("",))[0] == "pre"]
        if moved:
            order = [*moved, *(o for o in body if not any(o is m for m in moved))]
            at = {id(o): n for n, o in enumerate(order)}
            new = [at[id(o)] for o in body]          # each op's index once reordered
            body = [Op(o.payload, o.stream, tuple(new[d] for d in o.deps), o.repeat)
                    for o in order]
    return structured_body(b, backward, body)


def structured_body(b, backward: bool, body: list[Op]) -> list[Op]:
    """A partitioner's layer ops (1-D TP with context parallelism: one op per linear GEMM,
    the attention core's ring on the ``cp`` streams) with the overlaps of ``b.plan.tp_overlap``
    (the plan's ``tp_comm_overlap``), per GEMM as TransformerEngine runs them: an
    all-gather feeding a GEMM (``ring_exchange``) is overlapped with that GEMM, nothing
    exposed before it; the collectives after a GEMM (``pipeline`` reduce-scatter,
    ``bulk`` backward ones) are overlapped with it, the pipelined reduce-scatter's last
    chunk exposed after it, and the GEMM pays the SMs the collectives take (a contention op).
    Every other op (the ring, its waits, the element-wise work) keeps its place and its
    dependencies. Collectives left at the end of the layer feed the next layer's first GEMM
    and move to the front, as in :func:`layer_body`."""
    how = b.plan.tp_overlap
    if how == "torch_async":
        return torch_tp.structured_body(b, backward, body, _is_linear, _is_tp)
    def of(kind: str):
        def item(op: Op):
            r = _role(op.payload, backward, how) if _is_tp(op) else None
            return (op.payload, r[1]) if r is not None and r[0] == kind else None
        return item

    out: list[Op] = []
    where: dict[int, int] = {}         # old index -> new index of every op kept whole
    for i, op, pending, posts in gemm_groups(body, _is_linear, of("pre"), of("post")):
        if op is None:                 # collectives after the last GEMM
            out += [Op(c) for c, _ in pending]
            continue
        if pending is None:            # not a GEMM: kept whole, in place
            where[i] = len(out)
            out.append(Op(op.payload, op.stream, tuple(where[d] for d in op.deps), op.repeat))
            continue
        after, overlapped = _overlap_around(out, pending, posts)
        where[i] = len(out)
        out.append(Op(chunked(op.payload, how, b.tp, pending, posts), op.stream,
                      tuple(where[d] for d in op.deps), op.repeat))
        if posts:
            out.append(_contention(op.payload.name, op.payload.flops, op.payload.dtype, how,
                                   posts))
        if overlapped:
            out.append(Op(Wait(f"{op.payload.name}.tp_overlap.wait", "tp")))
        out += after
    return out
