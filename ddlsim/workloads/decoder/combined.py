"""Megatron-Core's expert-parallel communication overlap (``overlap_moe_expert_parallel_comm``):
the combined 1F1B schedule, in which the forward of one micro-batch and the backward of another
run as one step, layer by layer, so that each one's dispatch/combine all-to-alls (``ep``
stream) run beside the other's attention and expert compute (compute stream). docs/moe.md
says what is modelled and what is not.

The trace encoding (no new trace format): a combined step of forward ``(mb_f, c_f)`` and
backward ``(mb_b, c_b)`` is up to five steps, ``R.F{c_f}`` (micro-batch ``mb_f``: the
forward's pipeline receive), ``R.B{c_b}`` (``mb_b``: the backward's), ``C{c_f}.{c_b}`` (the
paired layers), ``S.F{c_f}`` (``mb_f``: the activation send) and ``S.B{c_b}`` (``mb_b``: the
gradient send); each point-to-point op thus keys by its own micro-batch. Megatron-Core waits
for both receives before the first layer (``pre_forward`` and ``pre_backward`` in
``TransformerModelChunkSchedulePlan.run``) and sends after the last, as here.

One layer pair (forward layer ``i`` of ``c_f`` with backward layer ``L_b − 1 − i`` of ``c_b``;
``TransformerLayerSchedulePlan.run``), in issue order with what each node waits for:

=================  ==============  ====================================================
compute stream     ``ep`` stream   waits for
=================  ==============  ====================================================
                   combine bwd     the backward's previous node (attn bwd of the pair before)
attn fwd                           the forward's previous node (combine fwd before)
mlp bwd (dgrad)                    combine bwd
                   dispatch fwd    attn fwd
mlp bwd (wgrad)                    (delay_wgrad_compute: no event, stream order only)
                   dispatch bwd    mlp bwd (dgrad; without the delay, dgrad and wgrad)
mlp fwd                            dispatch fwd
                   combine fwd     mlp fwd
attn bwd (dgrad)                   dispatch bwd
attn bwd (wgrad)                   (delay_wgrad_compute: no event, stream order only)
=================  ==============  ====================================================

References
----------
NVIDIA/Megatron-LM d7288711 (2026-04-09): ``megatron/core/models/common/
model_chunk_schedule_plan.py`` ``TransformerLayerSchedulePlan.run`` (line 189) and
``TransformerModelChunkSchedulePlan.run`` (line 413); ``megatron/core/pipeline_parallel/
utils.py`` ``ScheduleNode`` (one event per micro-batch and chunk; ``backward_dw`` records
none); ``megatron/core/pipeline_parallel/schedules.py`` (warm-up + 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError
from ..schedules import combined_schedule
from ..trace import Block, Collective, Compute, Contention, Op, P2P, StepTable, Wait
from . import param_gather
from .combined_nodes import moe_layer_nodes

__all__ = ["active", "pair_contention", "combined_blocks",
           "combined_step_tables"]

#: the forward's and the backward's nodes of one layer pair, in Megatron-Core's issue order
#: (``TransformerLayerSchedulePlan.run``); the ``*_wgrad`` nodes join no chain (no event)
PAIR_ORDER = (("b", "combine"), ("f", "attn"), ("b", "mlp"), ("f", "dispatch"),
              ("b", "mlp_wgrad"), ("b", "dispatch"), ("f", "mlp"), ("f", "combine"),
              ("b", "attn"), ("b", "attn_wgrad"))


def active(cfg: Any) -> bool:
    """Whether ``cfg`` runs Megatron-Core's combined 1F1B (the resolved
    ``parallel.moe.overlap_expert_parallel_comm``; False for a dense model)."""
    if not getattr(cfg.model, "num_local_experts", 0):
        return False
    from .moeplan import resolve_moe
    plan = resolve_moe(cfg)
    return plan is not None and plan.a2a_overlap


#: the overlap windows of one layer pair, as Megatron-Core's ``TransformerLayerSchedulePlan.run``
#: states them ("comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd;
#: comp_stream: attn_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | attn_bwd"): (communication nodes,
#: the compute nodes beside them)
WINDOWS = (((("b", "combine"),), (("f", "attn"),)),
           ((("f", "dispatch"), ("b", "dispatch")),
            (("b", "mlp"), ("b", "mlp_wgrad"), ("f", "mlp"))),
           ((("f", "combine"),), (("b", "attn"), ("b", "attn_wgrad"))))


def _dispatcher_sms(b) -> int:
    """SMs the dispatcher's communication kernels hold while they run: the flex kernels'
    (:attr:`.moeplan.MoEPlan.flex_sms`: the plan's ``parallel.moe.flex_dispatcher_num_sms``
    or Megatron-Core's default), or 0 for NCCL's all-to-all (its
    channels, :func:`~ddlsim.simulator.kernels.contention.nccl_ring_ctas`, as the cost model
    gives them)."""
    return b.moe.flex_sms if b.moe.dispatcher == "flex" else 0


def pair_contention(b, f_nodes: dict, b_nodes: dict) -> dict[tuple[str, str], Op]:
    """The SMs the dispatcher's kernels take from the compute beside them in one layer pair:
    per window of :data:`WINDOWS` with both communication and compute, a contention op
    (:class:`~ddlsim.workloads.trace.Contention`: the compute nodes' FLOPs, the window's
    collectives, :func:`_dispatcher_sms`) keyed by the window's last compute node present,
    to run after it on the compute stream, so that it takes the extra time
    :func:`~ddlsim.simulator.kernels.contention.extra_seconds` gives: ``(k/S)·min(C, G_k)``.
    Only between two MoE layers (a dense layer's node is not beside the other's all-to-alls).
    The FLOPs are timed at the training dtype's GEMM rate (attention cores included).

    Parameters
    ----------
    b : the stage builder (:class:`~.moe.MoEOps`).
    f_nodes, b_nodes : the forward's and the backward's nodes of the pair
        (:func:`moe_layer_nodes`; a dense layer's: ``attn`` only).

    Returns
    -------
    dict
        ``(side, node)`` → the contention op (no entry for a window with nothing beside it).

    References
    ----------
    NVIDIA/Megatron-LM d7288711 ``megatron/core/models/common/model_chunk_schedule_plan.py``
    ``TransformerLayerSchedulePlan.run`` (docstring and issue order);
    ``megatron/core/models/gpt/fine_grained_callables.py`` ``submodule_combine_forward``
    (its comment: work beside another micro-batch's "would compete for SM resources").
    """
    side_nodes = {"f": f_nodes, "b": b_nodes}
    out = {}
    if not ("dispatch" in f_nodes and "dispatch" in b_nodes):
        return out     # a dense layer on either side: its node is not beside the other's
    for comm, comp in WINDOWS:
        colls = tuple(op.payload for s, n in comm for op in side_nodes[s].get(n, ())
                      if type(op.payload) is Collective)
        present = [(s, n) for s, n in comp if side_nodes[s].get(n)]
        flops = sum(op.payload.flops * op.repeat for s, n in present for op in side_nodes[s][n]
                    if type(op.payload) is Compute and op.stream == "compute")
        if colls and flops > 0:
            c = Contention(flops, sms=_dispatcher_sms(b), collectives=colls)
            name = f"combined.{present[-1][1]}.ep_sm_contention"
            out[present[-1]] = Op(Compute(name, 0.0, dtype=b.plan.train_dtype, contention=c))
    return out


def _merge(pairs: list[tuple[dict | None, dict | None]], ops: list[Op],
           contention: list[dict] | None = None, wait_on_comm: bool = False) -> None:
    """Append the layer pairs' nodes to ``ops`` in :data:`PAIR_ORDER`, each node's first op
    waiting for its side's previous node (the chain of events of Megatron-Core's
    ``ScheduleNode``); the chains start at the block's last op so far. ``contention[j]``:
    pair ``j``'s contention ops (:func:`pair_contention`), each appended to the node it is
    keyed by. ``wait_on_comm`` (the flex dispatcher): the host's wait that opens a forward
    ``dispatch`` node also waits for the communication stream's last op before it (the paired
    backward's combine): DeepEP's and HybridEP's dispatch, issued on that stream, make it wait
    for the stream's earlier work before the counts the host waits for are computed
    (Megatron-LM d7288711 ``fused_a2a.py`` lines 84-124: ``get_dispatch_layout`` and
    ``dispatch`` with ``previous_event``, an event of the current stream, the dispatch node's
    communication stream; DeepEP 567632d ``csrc/deep_ep.cpp`` lines 1051-1053 and 1137-1143,
    ``internode_dispatch``: DeepEP's stream waits for it, then the host polls the received
    counts)."""
    chain = {"f": len(ops) - 1 if ops else None, "b": len(ops) - 1 if ops else None}
    last_comm = max((i for i, op in enumerate(ops) if op.stream == "ep"), default=None)
    for i, (f_nodes, b_nodes) in enumerate(pairs):
        extra = contention[i] if contention and i < len(contention) else {}
        for side, node in PAIR_ORDER:
            nodes = f_nodes if side == "f" else b_nodes
            body = (nodes or {}).get(node)
            if not body:
                continue
            if (side, node) in extra:
                body = [*body, extra[side, node]]
            base = len(ops)
            for j, op in enumerate(body):
                deps = tuple(d + base for d in op.deps)
                if j == 0 and not node.endswith("wgrad") and chain[side] is not None:
                    deps = tuple(sorted({*deps, chain[side]}))
                if (j == 0 and wait_on_comm and (side, node) == ("f", "dispatch")
                        and op.stream == "host" and last_comm is not None):
                    deps = tuple(sorted({*deps, last_comm}))
                ops.append(Op(op.payload, op.stream, deps, op.repeat))
                if op.stream == "ep":
                    last_comm = len(ops) - 1
            if not node.endswith("wgrad"):
                chain[side] = len(ops) - 1


def _layer_nodes(b, backward: bool, moe: bool, delay: bool) -> dict:
    """One layer's nodes: an MoE layer's four (:func:`moe_layer_nodes`), or a
    dense layer as one ``attn`` node on the compute stream."""
    key = ("combined.nodes", backward, moe, delay)
    if moe:
        return b.cached(key, lambda: moe_layer_nodes(b, backward, delay))
    return b.cached(key, lambda: {"attn": b.layer_ops(backward, 1, 0)})


def _split(block: Block, layers: list[Op]) -> tuple[list[Op], list[Op]]:
    """A chunk block's ops before and after its layers (``layers``, the builder's)."""
    ops = list(block.ops)
    first = next(i for i, op in enumerate(ops) if op.payload is layers[0].payload)
    return ops[:first], ops[first + len(layers):]


def _chunk_parts(b, stage: int, chunk: int, blocks: dict) -> dict:
    """The parts of chunk ``chunk``'s forward and backward blocks around their layers: the
    receive (a P2P prefix) or compute prefix (embedding, head backward), the send or compute
    suffix (head forward), and which layers are MoE layers."""
    from .layerkinds import chunk_first_layer, moe_layers_in_chunk
    Lc = b.split[stage][chunk]
    n_moe = moe_layers_in_chunk(b.shape, b.split, stage, chunk) if b.shape.is_moe else 0
    first = chunk_first_layer(b.split, stage, chunk)
    out = {"moe": [b.shape.is_moe_layer(first + i) for i in range(Lc)]}
    for side, name in (("f", f"F{chunk}"), ("b", f"B{chunk}")):
        pre, post = _split(blocks[name], b.layer_ops(side == "b", Lc, n_moe))
        p2p_pre = any(type(op.payload) is P2P for op in pre)
        out[side] = {"recv": pre if p2p_pre else [], "pre": [] if p2p_pre else pre,
                     "send": [op for op in post if type(op.payload) is P2P],
                     "post": [op for op in post if type(op.payload) is not P2P]}
    return out


def _body(b, parts_f: dict, parts_b: dict, delay: bool) -> tuple[Op, ...]:
    """The combined step's own ops: both receives waited for, the forward's pre-process, the
    backward's post-process (head backward), the layer pairs, the leftover layers, then the
    forward's post-process (head forward) after its last combine and the backward's
    pre-process (the embedding's backward, :mod:`.embedding_grad`)."""
    ops: list[Op] = [Op(Wait("combined.recv", "pp"))]
    for pre in (parts_f["f"]["pre"], parts_b["b"]["pre"]):
        base = len(ops)
        ops += [Op(o.payload, o.stream, tuple(d + base for d in o.deps), o.repeat) for o in pre]
    fl, bl = parts_f["moe"], parts_b["moe"][::-1]
    pairs = [(_layer_nodes(b, False, fl[i], delay) if i < len(fl) else None,
              _layer_nodes(b, True, bl[i], delay) if i < len(bl) else None)
             for i in range(max(len(fl), len(bl)))]
    # Megatron-Core runs the pairs, then the backward's leftover layers, then the forward's
    k = min(len(fl), len(bl))
    order = pairs[:k] + [(None, bw) for _, bw in pairs[k:]] + [(f, None) for f, _ in pairs[k:]]
    cont = [b.cached(("combined.contention", fl[i], bl[i], delay),
                     lambda f=f, bw=bw: pair_contention(b, f, bw))
            for i, (f, bw) in enumerate(pairs[:k])]
    _merge(order, ops, cont, wait_on_comm=b.moe.dispatcher == "flex")
    ops.append(Op(Wait("combined.join", "ep")))
    # the head's forward, then the embedding's backward (Megatron-LM d7288711
    # model_chunk_schedule_plan.py lines 526-531: post_process.forward, pre_process.backward)
    for post in (parts_f["f"]["post"], parts_b["b"]["post"]):
        base = len(ops)
        ops += [Op(o.payload, o.stream, tuple(d + base for d in o.deps), o.repeat) for o in post]
    return tuple(ops)


def combined_blocks(b, stage: int, blocks: dict, delay: bool) -> dict[str, Block]:
    """The blocks of the combined steps of ``stage``, from its chunk blocks ``blocks``
    (``F{c}``, ``B{c}``): ``R.F{c}``/``R.B{c}`` (receives), ``S.F{c}``/``S.B{c}`` (sends,
    after the compute stream), ``C{cf}.{cb}`` for every pair of chunks."""
    v = b.v
    parts = [_chunk_parts(b, stage, c, blocks) for c in range(v)]
    out: dict[str, Block] = {}
    for c, part in enumerate(parts):
        for side, phase in (("f", "forward"), ("b", "backward")):
            tag = f"{side.upper()}{c}"
            if part[side]["recv"]:
                out[f"R.{tag}"] = Block(f"R.{tag}", phase, tuple(part[side]["recv"]))
            if part[side]["send"]:
                send = part[side]["send"][0].payload
                out[f"S.{tag}"] = Block(f"S.{tag}", phase, (
                    Op(Wait("p2p.send", "compute")), Op(send, "pp", (0,))))
    for cf in range(v):
        for cb in range(v):
            name = f"C{cf}.{cb}"
            out[name] = Block(name, "backward", _body(b, parts[cf], parts[cb], delay))
    return out


def combined_step_tables(sched: str, pp: int, m: int, v: int, sync: bool,
                         prologue: bool = False, group: int | None = None) -> list[StepTable]:
    """Each stage's steps under the combined 1F1B (:func:`~ddlsim.workloads.schedules.
    combined_schedule`), in the encoding of this module's docstring; the last backward of
    each chunk uses its ``.sync`` block, ``update`` ends the iteration, ``prologue`` as in
    :func:`.build._step_tables`; ``group``: the interleaved schedule's micro-batches per group
    (None: PP).

    Raises
    ------
    ConfigError
        if a chunk's last backward fell in a combined step (its gradient-sync variant is not
        modelled there; Megatron-Core's warm-up + 1 leaves it to the cool-down).
    """
    v = v if sched == "interleaved" else 1
    last_k = pp * v - 1
    tables = []
    for s in range(pp):
        order = combined_schedule(sched, s, pp, m, v, group)
        last_b = {}
        for j, e in enumerate(order):
            if e[0] != "F":
                last_b[e[-1]] = j
        steps: list[tuple[str, int, int]] = []
        for j, e in enumerate(order):
            if e[0] == "F":
                steps.append((f"F{e[2]}", e[1], e[2]))
            elif e[0] == "B":
                sync_here = sync and last_b[e[2]] == j
                steps.append((f"B{e[2]}" + (".sync" if sync_here else ""), e[1], e[2]))
            else:
                _, mf, cf, mb, cb = e
                if sync and last_b[cb] == j:
                    raise ConfigError(f"combined 1F1B: stage {s}'s last backward of chunk {cb} "
                                      "falls in a combined step; its gradient-sync overlap is "
                                      "not modelled there")
                kf, kb = cf * pp + s, cb * pp + s
                steps += [(f"R.F{cf}", mf, cf)] if kf > 0 else []
                steps += [(f"R.B{cb}", mb, cb)] if kb < last_k else []
                steps.append((f"C{cf}.{cb}", mf, cf))
                steps += [(f"S.F{cf}", mf, cf)] if kf < last_k else []
                steps += [(f"S.B{cb}", mb, cb)] if kb > 0 else []
        if prologue:
            steps[0] = (param_gather.BLOCK, *steps[0][1:])
        steps.append(("update", 0, 0))
        names = list(dict.fromkeys(name for name, _, _ in steps))
        index = {n: i for i, n in enumerate(names)}
        arr = np.array([(index[n], mb, c) for n, mb, c in steps], dtype=np.int64)
        tables.append(StepTable(names, arr[:, 0], arr[:, 1], arr[:, 2]))
    return tables
