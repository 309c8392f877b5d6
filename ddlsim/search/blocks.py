"""A stage's pieces for arrays of plans, built by the family's own builder and timed by the
engine's own rule.

A decoder stage's forward is the embedding (first stage), its layers, the head (last stage)
and the all-gather after each received activation (Megatron's scatter-gather); its backward
likewise (:meth:`~ddlsim.workloads.decoder.builder.StageBuilder.chunk_blocks`). Those pieces
depend on a few plan fields only: the micro-batch size, the TP degree, sequence parallelism,
recomputation, and whether ZeRO-3 shards the layer (it turns the TP overlaps off). For each
distinct signature of those fields among the plans, :func:`stage_pieces`

1. makes the plan's config (the context's, with the signature's fields),
2. has :class:`~ddlsim.workloads.decoder.builder.StageBuilder` build the pieces' ops — the
   same op lists, kernels, overlaps and waits the exact engine times,
3. times them with :func:`ddlsim.simulator.analytical.arrays.stream_ends` (the timing rule
   on arrays): compute ops by :func:`~ddlsim.simulator.kernels.op_time`, as
   :meth:`~ddlsim.simulator.costs.CostModel.compute` times them, and collectives on each
   plan's own network (:func:`~ddlsim.search.netcost.collective_seconds`, the cost model's
   closed forms on arrays).

No cost or op list is written here: a cost added to the builder reaches the search tier
through the same ops.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..simulator.analytical.arrays import lower_ops, stream_ends, with_collectives
from ..simulator.kernels import op_time
from ..workloads.decoder.builder import StageBuilder, as_ops
from .plans import RECOMPUTE

__all__ = ["Pieces", "stage_pieces", "piece_config"]


class Pieces(NamedTuple):
    """Per plan, seconds on the compute stream of one micro-batch's pieces of a stage.

    ``fwd``/``bwd``: one transformer layer (the backward with its recomputation, gradient
    accumulation and overlapped TP collectives); ``emb``: the embedding; ``head_f``/``head_b``:
    the output head and loss; ``gather``: the all-gather after a received activation (0 where
    nothing is gathered); ``p2p_bytes``: bytes each rank sends to the next stage.
    """

    fwd: np.ndarray
    bwd: np.ndarray
    emb: np.ndarray
    head_f: np.ndarray
    head_b: np.ndarray
    gather: np.ndarray
    p2p_bytes: np.ndarray


def piece_config(cfg, tp: int, sp: bool, mbs: int, recompute: str, zero: int, dp: int = 1,
                sections: dict | None = None):
    """``cfg`` (a context's base config: one device, one stage) with a plan's layer fields.

    A copy without validation (unlike :func:`.planconfig.plan_config`, which validates a plan
    to judge it): the search's rules have judged the plan already; the resolved
    software follows the new ``parallel`` section (:attr:`~ddlsim.config.RunConfig.software`,
    resolved once per ``parallel`` object: ``sections``, a dict kept by the caller, hands the
    same object to every plan that shares it)."""
    key = (tp, sp, zero, dp)
    parallel = None if sections is None else sections.get(key)
    if parallel is None:
        parallel = cfg.parallel.model_copy(update={"tensor_model_parallel_size": tp,
                                                   "sequence_parallel": sp, "zero_stage": zero,
                                                   "data_parallel_size": dp})
        if sections is not None:
            sections[key] = parallel
    train = cfg.train.model_copy(update={"micro_batch_size": mbs, "recompute": recompute})
    return cfg.model_copy(update={"parallel": parallel, "train": train})


def _signatures(plans) -> tuple[np.ndarray, np.ndarray]:
    """One integer per plan for (mbs, tp, sp, recompute, ZeRO-3), and each plan's index into
    the distinct ones."""
    tp, mbs = plans["tp"].astype(np.int64), plans["mbs"].astype(np.int64)
    span = int(tp.max(initial=0)) + 1
    code = ((((mbs * span + tp) * 2 + plans["sp"].astype(np.int64)) * len(RECOMPUTE)
             + plans["recompute"]) * 2 + (plans["zero"] == 3))
    return np.unique(code, return_inverse=True)


def stage_pieces(ctx, plans, coll_at) -> Pieces:
    """The :class:`Pieces` of every plan.

    Parameters
    ----------
    ctx : the family's context (``cfg``, ``shape``, ``dev``: the kernel model's device).
    plans : the plans (a :class:`~ddlsim.search.plans.PlanSet`).
    coll_at : ``coll_at(op, family, nbytes, index)``: seconds of one collective of
        ``nbytes[i]`` bytes for the plan at position ``index[i]``, on its network (arrays).
    """
    n = len(plans)
    codes, inverse = _signatures(plans)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(codes) + 1))
    groups = [order[bounds[j]:bounds[j + 1]] for j in range(len(codes))]
    kernels: dict = {}
    sections: dict = {}
    lowered: dict[tuple, tuple] = {}

    def compute_s(op) -> float:
        return op.seconds if op.seconds is not None else op_time(op, ctx.dev, memo=kernels)

    def lower(ops) -> tuple:
        """:func:`lower_ops` once per distinct op list: signatures share many pieces (the
        embedding and the head do not depend on recomputation, …), equal ops time alike."""
        ops = tuple(ops)
        hit = lowered.get(ops)
        if hit is None:
            hit = lowered[ops] = lower_ops(ops, compute_s)
        return hit

    # 1. each signature's pieces, built by the builder, collectives symbolic
    built, asked = [], {}
    for j, index in enumerate(groups):
        i0 = int(index[0])
        cfg = piece_config(ctx.cfg, int(plans["tp"][i0]), bool(plans["sp"][i0]),
                          int(plans["mbs"][i0]), RECOMPUTE[int(plans["recompute"][i0])],
                          int(plans["zero"][i0]), sections=sections)
        sb = StageBuilder.from_config(cfg, ctx.shape)
        pieces = {name: lower(ops) for name, ops in (
            ("fwd", sb.layer_ops(False, 1)), ("bwd", sb.layer_ops(True, 1)),
            ("emb", as_ops(sb.embedding_forward())), ("head_f", as_ops(sb.head_forward())),
            ("head_b", as_ops(sb.head_backward())), ("gather", sb.gather_ops("act")))}
        for _, colls in pieces.values():
            for c in colls:
                if c is not None:
                    asked.setdefault((c.op, c.group), {})[(j, c.bytes)] = None
        built.append((pieces, sb.part.boundary(sb.act_bytes)[0]))
    # 2. every collective asked, on each plan's network: one array call per (op, family)
    seconds: dict[tuple, np.ndarray] = {}
    for (op, family), wanted in asked.items():
        keys = list(wanted)
        sizes = [len(groups[j]) for j, _ in keys]
        t = coll_at(op, family, np.repeat([float(b) for _, b in keys], sizes),
                    np.concatenate([groups[j] for j, _ in keys]))
        for (j, b), part in zip(keys, np.split(t, np.cumsum(sizes)[:-1])):
            seconds[(j, op, family, b)] = part
    # 3. each piece timed by the timing rule, on arrays over its plans
    out = {name: np.zeros(n) for name in Pieces._fields}
    for j, (pieces, p2p_bytes) in enumerate(built):
        index = groups[j]
        for name, (instrs, colls) in pieces.items():
            timed = with_collectives(instrs, colls,
                                     lambda c: seconds[(j, c.op, c.group, c.bytes)])
            out[name][index] = stream_ends(timed, len(index))[0]
        out["p2p_bytes"][index] = p2p_bytes
    return Pieces(**out)
