"""One MoE layer of the combined 1F1B (:mod:`.combined`) as Megatron-Core's schedule nodes:
``attn``, ``dispatch``, ``mlp`` and ``combine`` (with ``delay_wgrad_compute``, the weight
gradients split off as ``mlp_wgrad`` and ``attn_wgrad``), each a list of ops whose deps index
it, sized op for op as :class:`.moe.MoEOps` sizes the layer.

References
----------
NVIDIA/Megatron-LM d7288711 (2026-04-09): ``megatron/core/models/gpt/
fine_grained_callables.py`` (the nodes' callables).
"""

from __future__ import annotations

from ..trace import Compute, Op
from .grouped_linear import experts_pass_host, te_grouped_experts
from .moe_dispatch import alltoall_counts
from .moe_host import dispatcher_host
from .moe_host_chain import node_with_waits
from .moe_router import router_ops
from .partition.oplist import OpList
from .recompute_modules import beside_core_attn

__all__ = ["moe_layer_nodes"]


def _dispatcher_ops(b, pre: str, backward: bool):
    """The dispatcher's collectives of one MoE layer, ``(first, second, permutation bytes,
    sort bytes)`` in execution order (backward: the combine's gradient first), as
    :meth:`.moe.MoEOps._moe_block` chooses them: alltoall, or flex (:mod:`.moe_dispatch`)."""
    if b.moe.dispatcher == "flex":     # permuted inside the dispatch kernels
        from .moe_dispatch import flex_ops
        first, second, sorts = flex_ops(b, pre, backward)
        return first, second, (0.0, 0.0), sorts
    sort = b._sort_bytes()
    return (b._dispatch(f"{pre}.{'combine' if backward else 'dispatch'}", False),
            b._dispatch(f"{pre}.{'dispatch' if backward else 'combine'}", True),
            (b._permute_bytes(backward), b._permute_bytes(not backward)), (sort, sort))


def moe_layer_nodes(b, backward: bool, delay_wgrad: bool = False) -> dict[str, list[Op]]:
    """One MoE layer of builder ``b`` as Megatron-Core's schedule nodes: ``attn`` (attention,
    shared experts, router, permutation: compute stream), ``dispatch`` and ``combine`` (the
    dispatcher's collectives, combine with the un-permutation: ``ep`` stream), ``mlp`` (sort,
    experts, un-sort: compute), and with ``delay_wgrad`` in the backward ``mlp_wgrad`` and
    ``attn_wgrad``, the weight gradients of the experts and of the attention's (and shared
    experts') linear layers split from ``mlp`` and ``attn``. Each is a list of ops whose deps
    index it.
    The sizes are :class:`.moe.MoEOps`'s, op for op.

    References
    ----------
    NVIDIA/Megatron-LM d7288711 ``megatron/core/models/gpt/fine_grained_callables.py``
    ``submodule_attn_forward`` (attention, pre-MLP norm, shared experts, router, dispatch
    pre-process), ``submodule_dispatch_forward``, ``submodule_moe_forward`` (post-dispatch,
    experts, combine pre-process), ``submodule_combine_forward`` (combine, post-process,
    ``mlp_bda``).
    """
    sh, pre = b.shape, "bwd" if backward else "fwd"
    router = b._gemm(f"{pre}.router", b.tokens(), sh.experts, sh.hidden, backward)
    first, second, perm, sorts = _dispatcher_ops(b, pre, backward)
    mem = lambda name, n: [b._memory(f"{pre}.{name}", n)] if n else []   # noqa: E731
    experts = b._expert_compute("fwd", backward)
    wgrad = []
    if backward and delay_wgrad:
        wgrad_host = experts_pass_host(b, 1)   # the weight gradients' own GroupedLinear pass
        split = [_split_wgrad(c, wgrad_host) if any(k.kind == "gemm" for k in c.kernels or ())
                 else (c, None) for c in experts]
        experts, wgrad = [d for d, _ in split], [w for _, w in split if w is not None]
    mlp = [*mem("sort", sorts[0]), *experts, *mem("unsort", sorts[1])]
    attn = OpList()
    if not backward:
        b._attention(attn, "fwd", False)
        counts = alltoall_counts(b, "fwd") if b.moe.dispatcher == "alltoall" else []
        for x in (*b._shared("fwd", False), router, *router_ops(b, "fwd", False), *counts,
                  *mem("permute", perm[0]),
                  b._attn_elementwise("fwd.elementwise", False)):
            attn.add(x)
        comm = (first, [*second, *mem("unpermute", perm[1])])
    else:
        if b.plan.recompute == "selective":
            g = sh.layer_gemm_flops(b.b, b.s, moe=True)
            attn.add(b._recompute_core(g, True))
            for x in beside_core_attn(b):    # the other modules' op, their TP collectives
                attn.add(x)
        for x in (*mem("unpermute", perm[1]), *router_ops(b, "bwd", True), router,
                  *b._shared("bwd", True),
                  b._attn_elementwise("bwd.elementwise", True)):
            attn.add(x)
        b._attention(attn, "bwd", True)
        dense_p, expert_p = b.layer_rank_params(True)
        attn.add(Compute("bwd.grad_accumulate", 0.0, b.grad_accumulate_bytes(dense_p + expert_p),
                         kind="elementwise", dtype=b.dtype))
        comm = (second, [*mem("permute", perm[0]), *first])
    dispatch, mlp_ops = [Op(x, "ep") for x in comm[0]], [Op(x) for x in mlp]
    if not backward:    # the host's waits for the device, then its issue (.moe_host)
        host = dispatcher_host(b.moe)
        dispatch = node_with_waits(pre, host, "router", b.dtype, dispatch)
        te_experts = te_grouped_experts(b)
        mlp_ops = node_with_waits(pre, host, "dispatch", b.dtype, mlp_ops, te_experts)
    nodes = {"attn": attn.ops, "dispatch": dispatch,
             "mlp": mlp_ops, "combine": [Op(x, "ep") for x in comm[1]]}
    if wgrad:
        nodes["mlp_wgrad"] = [Op(x) for x in wgrad]
        nodes["attn"], nodes["attn_wgrad"] = _attn_wgrad_split(sh, attn.ops)
    return nodes


def _attn_wgrad_split(shape, ops: list[Op]) -> tuple[list[Op], list[Op]]:
    """The attention node's backward with its linear layers' weight gradients (the attention
    projections and the shared experts: ``self_attention.backward_dw`` and the shared
    experts' ``backward_dw`` in ``fine_grained_callables.py``, lines 372-400) split off, to
    run after it with no event."""
    from .layerkinds import attention_projections
    before, after = attention_projections(shape)
    names = {f"bwd.{n}" for n, *_ in (*before, *after)} | {"bwd.shared.fc1", "bwd.shared.fc2"}
    kept, wgrad = [], []
    for op in ops:
        p = op.payload
        gemms = sum(k.kind == "gemm" for k in p.kernels or ()) if type(p) is Compute else 0
        if p.name in names and gemms and gemms % 2 == 0:
            d, w = _split_wgrad(p)
            kept.append(Op(d, op.stream, op.deps, op.repeat))
            wgrad.append(Op(w, op.stream, (), op.repeat))
        else:
            kept.append(op)
    return kept, wgrad


def _split_wgrad(c: Compute, wgrad_host_s: float = 0.0) -> tuple[Compute, Compute]:
    """A backward GEMM op (GEMM kernels: data gradient, weight gradient, per launch:
    :func:`~ddlsim.simulator.kernels.gemm.gemm_kernels_backward`) as two ops, ``.dgrad`` and
    ``.wgrad``, each with half the FLOPs; its memory kernels (the FP8 output gradient's
    casts, which both GEMMs read) stay with the data gradient, which runs first, and so does
    the op's host time (``host_s``: the quantized output gradients' tensors, created before the
    data gradient, :func:`.fp8linear.with_fp8_casts`) except ``wgrad_host_s``, the weight
    gradients' own (their GroupedLinear pass, :meth:`.moe.MoEOps.pass_host`)."""
    half = c.flops / 2
    gemms = tuple(k for k in c.kernels if k.kind == "gemm")
    casts = tuple(k for k in c.kernels if k.kind != "gemm")
    return (Compute(f"{c.name}.dgrad", half, c.bytes, c.kind, c.dtype,
                    kernels=casts + gemms[0::2], host_s=c.host_s - wgrad_host_s),
            Compute(f"{c.name}.wgrad", half, 0.0, c.kind, c.dtype, kernels=gemms[1::2],
                    host_s=wgrad_host_s))
