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
   on arrays; the pieces of one structure together, :func:`~ddlsim.simulator.analytical.
   arrays.stream_ends_together`): compute ops by :func:`~ddlsim.simulator.kernels.op_time`, as
   :meth:`~ddlsim.simulator.costs.CostModel.compute` times them, and collectives on each
   plan's own network (:mod:`.piececolls`, each distinct mesh and size asked once of
   :func:`~ddlsim.search.collforms.collective_seconds`, the cost model's closed forms on
   arrays).

No cost or op list is written here: a cost added to the builder reaches the search tier
through the same ops.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..simulator.analytical.arrays import lean_ops, lower_ops, stream_ends_together, structure
from ..simulator.kernels import op_time
from ..simulator.kernels.device import kernel_times
from ..simulator.kernels.dtensor import regathers_input
from ..simulator.kernels.contention import contention_seconds
from ..workloads.smcontention import gemm_flops
from ..workloads.trace import Compute
from ..workloads.decoder.builder import StageBuilder, as_ops
from ..workloads.decoder.fp8linear import weight_cast_microbatches
from . import piececolls
from .plans import RECOMPUTE, microbatches

__all__ = ["Pieces", "stage_pieces", "piece_config"]


class Pieces(NamedTuple):
    """Per plan, seconds on the compute stream of one micro-batch's pieces of a stage.

    ``fwd``/``bwd``: one transformer layer (the backward with its recomputation, gradient
    accumulation and overlapped TP collectives); ``emb``/``emb1``: the embedding after the
    batch's loading on a first stage without and with the output layer (PP = 1 loads and
    broadcasts every tensor: :mod:`~ddlsim.workloads.decoder.batch_input`); ``load_l``: the
    batch's loading on a last stage at PP > 1; ``emb_b``/``emb_b1``:
    its backward on a first stage without and with the output layer (PP = 1, where a tied
    weight's two gradients meet: :mod:`~ddlsim.workloads.decoder.embedding_grad`);
    ``head_f``/``head_b``: the output head and loss; ``gather``: the all-gather after a
    received activation (0 where nothing is gathered); ``p2p_bytes``: bytes each rank sends
    to the next stage;
    ``fwd_gemm``/``bwd_gemm``/``emb_gemm``/``head_gemm``: FLOPs of the GEMMs of one layer's
    forward and backward, of the embedding and of the head's forward
    (:func:`~ddlsim.workloads.smcontention.gemm_flops`), which lose SMs beside overlapped
    data-parallel collectives. A piece no plan of its signature reads (``emb1``, ``emb_b1``,
    ``load_l``, ``emb_b``: :func:`_wanted`) is not built and NaN there.
    """

    fwd: np.ndarray
    bwd: np.ndarray
    emb: np.ndarray
    emb1: np.ndarray
    load_l: np.ndarray
    emb_b: np.ndarray
    emb_b1: np.ndarray
    head_f: np.ndarray
    head_b: np.ndarray
    gather: np.ndarray
    p2p_bytes: np.ndarray
    fwd_gemm: np.ndarray
    bwd_gemm: np.ndarray
    emb_gemm: np.ndarray
    head_gemm: np.ndarray


def piece_config(cfg, tp: int, sp: bool, mbs: int, recompute: str, zero: int, dp: int = 1,
                sections: dict | None = None, microbatches: int = 0):
    """``cfg`` (a context's base config: one device, one stage) with a plan's layer fields.

    A copy without validation (unlike :func:`.planconfig.plan_config`, which validates a plan
    to judge it): the search's rules have judged the plan already; the resolved
    software follows the new ``parallel`` section (:attr:`~ddlsim.config.RunConfig.software`,
    resolved once per ``parallel`` object: ``sections``, a dict kept by the caller, hands the
    same object to every plan that shares it, and likewise the ``train`` section).
    ``microbatches`` (> 0): the plan's micro-batches per step, where its layer's kernels
    depend on them (:func:`~ddlsim.workloads.decoder.fp8linear.weight_cast_microbatches`),
    set through the global batch; 0: the base config's."""
    parallel = _section(cfg.parallel, sections, "parallel", tensor_model_parallel_size=tp,
                        sequence_parallel=sp, zero_stage=zero, data_parallel_size=dp)
    batch = {"global_batch_size": microbatches * mbs * dp} if microbatches else {}
    train = _section(cfg.train, sections, "train", micro_batch_size=mbs, recompute=recompute,
                     **batch)
    return cfg.model_copy(update={"parallel": parallel, "train": train})


def _section(section, sections: dict | None, name: str, **update):
    """``section`` with ``update`` (a copy, not validated), made once per distinct update
    when ``sections`` (the caller's dict) is given."""
    key = (name, *update.values())
    hit = None if sections is None else sections.get(key)
    if hit is None:
        hit = section.model_copy(update=update)
        if sections is not None:
            sections[key] = hit
    return hit


def _signatures(plans, ctx) -> tuple[np.ndarray, np.ndarray]:
    """One integer per plan for (mbs, tp, sp, recompute, ZeRO-3, the micro-batches its
    layer's kernels depend on: :func:`_cast_microbatches`), and each plan's index into the
    distinct ones."""
    tp, mbs = plans["tp"].astype(np.int64), plans["mbs"].astype(np.int64)
    span = int(tp.max(initial=0)) + 1
    code = ((((mbs * span + tp) * 2 + plans["sp"].astype(np.int64)) * len(RECOMPUTE)
             + plans["recompute"]) * 2 + (plans["zero"] == 3))
    m = _cast_microbatches(ctx, plans)
    return np.unique(code * (int(m.max(initial=0)) + 1) + m, return_inverse=True)


def _cast_microbatches(ctx, plans) -> np.ndarray:
    """Per plan, its micro-batches per step where the layer's FP8 weight casts are spread over
    them (:func:`~ddlsim.workloads.decoder.fp8linear.weight_cast_microbatches`), else 0."""
    m = microbatches(plans)
    cfg = ctx.cfg
    return weight_cast_microbatches(cfg.software, cfg.train.dtype, m.astype(np.int64))


def stage_pieces(ctx, plans, coll_at, backend: str = "mpi",
                 mesh_of: np.ndarray | None = None) -> Pieces:
    """The :class:`Pieces` of every plan.

    Parameters
    ----------
    ctx : the family's context (``cfg``, ``shape``, ``dev``: the kernel model's device).
    plans : the plans (a :class:`~ddlsim.search.plans.PlanSet`).
    coll_at : ``coll_at(op, family, nbytes, index)``: seconds of one collective of
        ``nbytes[i]`` bytes for the plan at position ``index[i]``, on its network (arrays).
    backend : the system's collective backend (:attr:`~ddlsim.simulator.costs.CostModel.comm_backend`):
        NCCL's channels hold SMs beside the GEMMs they overlap (:mod:`~ddlsim.simulator.kernels.contention`).
    mesh_of : per plan, the index of its mesh (the plans of one mesh have the same networks,
        so a collective of one size is asked once per mesh); None: every plan its own.
    """
    codes, inverse = _signatures(plans, ctx)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(codes) + 1))
    groups = [order[bounds[j]:bounds[j + 1]] for j in range(len(codes))]
    # 1. each signature's pieces, built by the builder, collectives symbolic; each distinct
    # op list lowered once, with the (piece, signature) pairs that have it
    distinct, p2p_bytes = _built_pieces(ctx, plans, groups)
    # 2. every collective asked, on each plan's network: one array call per (op, family)
    shared = [np.concatenate([groups[j] for _, j in users]) for _, _, users in distinct]
    seconds = piececolls.piece_collectives(
        distinct, shared, coll_at, np.arange(len(plans)) if mesh_of is None else mesh_of)
    piececolls.piece_contention(ctx, distinct, seconds, backend)
    # 3. each distinct piece timed by the timing rule once, on arrays over every plan that
    # has it (element by element, as over each signature's plans apart), the pieces of one
    # structure together; a piece no plan of a signature reads (:func:`_wanted`) is not
    # built: NaN there
    out = {name: np.full(len(plans), np.nan) for name in Pieces._fields}
    alike: dict[tuple, list[int]] = {}
    key = piececolls.seconds_key
    for k, (instrs, _, _) in enumerate(distinct):
        alike.setdefault(structure(instrs), []).append(k)
    for members in alike.values():
        # a collective's factor is mostly 1: its seconds as they are (the same floats; no
        # array is changed in place below)
        durations = [[ins.dur if c is None else seconds[key(k, c)] if ins.dur == 1.0
                      else ins.dur * seconds[key(k, c)]
                      for ins, c in zip(distinct[k][0], distinct[k][1])] for k in members]
        ends = stream_ends_together(distinct[members[0]][0], durations,
                                    [len(shared[k]) for k in members])
        for k, at in zip(members, ends):
            _lay(out, at, distinct[k][2], shared[k], groups)
    # each signature's figures on its plans, by each plan's signature (every plan has one)
    per_signature = np.array(p2p_bytes, dtype=float).reshape(len(groups), 5)
    for c, name in enumerate(("p2p_bytes", "fwd_gemm", "bwd_gemm", "emb_gemm", "head_gemm")):
        out[name] = per_signature[:, c][inverse]
    return Pieces(**out)


def _lay(out: dict, ends: np.ndarray, users: list, plans: np.ndarray,
         groups: list[np.ndarray]) -> None:
    """Put one distinct piece's ``ends`` (over ``plans``: its ``users``' signatures' plans,
    in order) in ``out``, under each user's piece name."""
    if all(name == users[0][0] for name, _ in users):   # one piece's: at once
        out[users[0][0]][plans] = ends
        return
    start = 0
    for name, j in users:
        out[name][groups[j]] = ends[start:start + len(groups[j])]
        start += len(groups[j])


def _built_pieces(ctx, plans, groups: list[np.ndarray]) -> tuple[list, list[float]]:
    """``(distinct, p2p_bytes)``: each distinct lowered piece as ``(instrs, collectives,
    [(piece, signature), ...])`` (:func:`lower_ops` once per distinct op list of the
    :data:`_RECURRING` pieces, once per key of the others: signatures share many pieces, the
    embedding and the head do not depend on recomputation, …), and
    each signature's (bytes sent to the next stage, GEMM FLOPs of a layer's forward and
    backward, the embedding and the head's forward)."""
    kernels: dict = {}
    kernel_s: dict[int, float] = {}
    by_id: dict[int, tuple] = {}
    sections: dict = {}
    lowered: dict[tuple, list] = {}

    def compute_s(op) -> float:   # as CostModel.compute times it, once per op object
        # an op object met again (a loop's body repeated, a payload shared by pieces) is
        # found by identity, kept alive in its entry so no other object takes its id; a new
        # object is timed from its kernels' seconds, found by identity too (kernel_s, every
        # kernel timed at once below): finding an equal op by value would hash all its
        # kernels' fields, which costs more than adding their seconds up again
        hit = by_id.get(id(op))
        if hit is not None:
            return hit[1]
        if op.seconds is not None:
            got = op.seconds
        elif op.contention is not None:   # SMs held for the GEMMs' whole duration
            got = contention_seconds(op, ctx.dev, 0)
        else:
            got = op_time(op, ctx.dev, memo=kernels, kernel_s=kernel_s)
        by_id[id(op)] = (op, got)
        return got

    p2p_bytes = []
    built: dict[tuple, list] = {}   # piece key (:func:`_piece_keys`) -> its lowered entry
    casts = _cast_microbatches(ctx, plans)
    for j, (mbs, tp, sp, recompute, zero, one, many) in enumerate(_group_fields(plans, groups)):
        m = int(casts[groups[j][0]])
        cfg = piece_config(ctx.cfg, tp, sp, mbs, recompute, zero, sections=sections,
                           microbatches=m)
        sb = StageBuilder.from_config(cfg, ctx.shape)
        keys = _piece_keys(sb, mbs, tp, sp, recompute, zero, m)
        wanted = _wanted(one, many, zero)
        flops = {}
        for name, make in _PIECES.items():
            if name not in wanted:
                continue
            entry = built.get(keys[name])
            if entry is None:   # not built for a signature that shares the fields it reads
                ops = tuple(make(sb))
                # the op list hashed once, where lists recur under other keys
                entry = lowered.setdefault(ops if name in _RECURRING else keys[name], [])
                if not entry:   # lowered once per op list (below); kept for its FLOPs
                    entry += [lean_ops(ops), None, [], ops, None]
                built[keys[name]] = entry
            entry[2].append((name, j))
            if name in _GEMM_PIECES:   # GEMM FLOPs counted once per op list, where read
                if entry[4] is None:
                    entry[4] = gemm_flops(entry[3])
                flops[name] = entry[4]
        p2p_bytes.append((sb.part.boundary(sb.act_bytes)[0],
                          *(flops[name] for name in _GEMM_PIECES)))
    # every distinct kernel the compute ops run, timed at once; then each op list lowered
    _time_kernels([entry[0] for entry in lowered.values()], ctx.dev, kernel_s)
    for entry in lowered.values():
        entry[:2] = lower_ops(entry[0], compute_s)
    return [entry[:3] for entry in lowered.values()], p2p_bytes


def _time_kernels(pieces: list, dev, kernel_s: dict[int, float]) -> None:
    """Put in ``kernel_s`` (:func:`~ddlsim.simulator.kernels.op_time`'s, keyed by the kernel
    object's ``id``; the op lists ``pieces`` keep the kernels alive) the seconds of every
    kernel of the compute ops :func:`lower_ops` will time in ``pieces`` (their op lists as
    it times them, :func:`lean_ops`), each kernel object once and all in one
    :func:`~ddlsim.simulator.kernels.device.kernel_times` call: the seconds it would have
    timed them with, one by one. Equal kernels that are other objects are timed again, to
    the same seconds: cheaper than finding them by value (a key hashes its kernel's fields
    afresh)."""
    kernels: list = []
    seen: set[int] = set(kernel_s)   # kernel tuples and kernels met before (most are shared)
    for block in pieces:
        for op in block:
            p = op.payload
            if (type(p) is Compute and p.kernels is not None and id(p.kernels) not in seen
                    and p.seconds is None and p.contention is None):
                seen.add(id(p.kernels))
                for k in p.kernels:
                    if id(k) not in seen:
                        seen.add(id(k))
                        kernels.append(k)
    kernel_s.update(zip(map(id, kernels), kernel_times(kernels, dev)))


def _group_fields(plans, groups: list[np.ndarray]) -> list[tuple]:
    """Per signature (the plans at ``groups[j]``, none empty): its micro-batch size, TP
    degree, sequence parallelism, recomputation and ZeRO stage (of its first plan: every
    plan of a signature has them), and whether some plan of it has one pipeline stage, and
    some several (:func:`_wanted`); read for all signatures at once, as Python values."""
    if not groups:
        return []
    lengths = np.array([len(g) for g in groups])
    starts = np.cumsum(lengths) - lengths
    every = np.concatenate(groups)
    first = every[starts]
    pp = plans["pp"][every]
    return list(zip(map(int, plans["mbs"][first].tolist()),
                    map(int, plans["tp"][first].tolist()),
                    map(bool, plans["sp"][first].tolist()),
                    (RECOMPUTE[int(r)] for r in plans["recompute"][first].tolist()),
                    map(int, plans["zero"][first].tolist()),
                    np.logical_or.reduceat(pp == 1, starts).tolist(),
                    np.logical_or.reduceat(pp > 1, starts).tolist()))


def _wanted(one: bool, many: bool, zero: int) -> set[str]:
    """The pieces some plan of a signature reads, given whether some of its plans have one
    pipeline stage (``one``) and some several (``many``), and its ZeRO stage: the embedding
    forward and backward of a PP = 1 rank (``emb1``,
    ``emb_b1``) where a plan has one stage (ZeRO-3's root unit reads ``emb_b1`` on every
    ZeRO-3 plan), the last stage's batch loading and the first stage's embedding backward
    without the head (``load_l``, ``emb_b``) where a plan has several; the rest always
    (``emb``'s GEMM FLOPs count on every first stage). A grid's signatures mostly hold
    plans of one kind only (the speed grid's 106: 51 with PP = 1, 55 without)."""
    wanted = set(_PIECES)
    if not one:
        wanted -= {"emb1"} if zero == 3 else {"emb1", "emb_b1"}
    if not many:
        wanted -= {"load_l", "emb_b"}
    return wanted


#: The pieces whose op lists recur under distinct keys (their keys keep fields the builder
#: need not read for them: the embedding's list is one at TP 2, 4 and 8, the gather's is
#: empty wherever nothing is gathered), so a list is found by value, hashing it (the bundled
#: GPT-3 grid: 136 builds, 46 distinct lists). A layer's and the head's lists are found by
#: their keys alone: on the benchmark's grids no two keys of theirs give one list, and
#: hashing their long lists cost more than lowering a rare duplicate again would (a cold
#: bundled grid 473.5 → 469.0 M instructions; the same seconds either way).
_RECURRING = frozenset({"emb", "emb1", "load_l", "emb_b", "emb_b1", "gather"})

#: The pieces whose GEMM FLOPs :class:`Pieces` carries (``fwd_gemm``, ``bwd_gemm``,
#: ``emb_gemm``, ``head_gemm``, in this order): only those are counted.
_GEMM_PIECES = ("fwd", "bwd", "emb", "head_f")

#: A stage's pieces and how the builder makes each (:meth:`~ddlsim.workloads.decoder.
#: builder.StageBuilder.chunk_blocks` assembles a chunk from them).
_PIECES = {
    "fwd": lambda sb: sb.layer_ops(False, 1),
    "bwd": lambda sb: sb.layer_ops(True, 1),
    "emb": lambda sb: as_ops(sb.embedding_forward(False)),
    "emb1": lambda sb: as_ops(sb.embedding_forward(True)),
    "load_l": lambda sb: as_ops(sb.batch_ops("last")),
    "emb_b": lambda sb: as_ops(sb.embedding_backward(False)),
    "emb_b1": lambda sb: as_ops(sb.embedding_backward(True)),
    "head_f": lambda sb: as_ops(sb.head_forward()),
    "head_b": lambda sb: as_ops(sb.head_backward()),
    "gather": lambda sb: sb.gather_ops("act"),
}


def _piece_keys(sb, mbs: int, tp: int, sp: bool, recompute: str, zero: int,
                microbatches: int = 0) -> dict:
    """Per piece, the signature fields (micro-batch, TP, sequence parallelism, recomputation,
    ZeRO-3) its ops depend on, in one context (one model, stack and system): two signatures
    with the same key have the same op list, so it is built once.

    Only the layer's backward reads ``train.recompute`` itself (the recomputed forward, the
    attention core, :mod:`~ddlsim.workloads.decoder.early_stop`'s trimmed checkpoint); the
    layer's forward reads it only through :func:`~ddlsim.simulator.kernels.dtensor.
    regathers_input` (whether DTensor's sequence-parallel linears saved their gathered
    input: the layer's kernels, :func:`~ddlsim.workloads.decoder.layerkernels.layer_kernels`);
    the embedding, the head, the loss and the gather after a received activation not at all.
    The ZeRO stage is read by the layer through the plan's TP overlap only (ZeRO-3 turns
    it off, :func:`~ddlsim.workloads.decoder.tp_overlap.mode`, resolved once in
    :attr:`~ddlsim.workloads.decoder.plan.DecoderPlan.tp_overlap`: a layer at TP 1 is the
    same with and without ZeRO-3), by the head's forward (the stack's host wait after the
    loss, none under ZeRO-3), and is kept in the key of the embedding's backward.
    The layer's forward and backward (its recomputed forward) also read ``microbatches``:
    FP8 weight casts spread over a step (:func:`_cast_microbatches`; 0 where they are not).
    ``tests/test_search_pieces.py`` builds every piece of every signature on several stacks
    and dtypes and checks that equal keys give equal op lists."""
    layer = (mbs, tp, sp, sb.plan.tp_overlap, microbatches)
    # the async TP overlap is the backward's alone: the builder's forward keeps the plain
    # ops under it (:meth:`~ddlsim.workloads.decoder.builder.StageBuilder._dense_layer_ops`,
    # unless its partitioner lays the layers out itself), the same as without an overlap
    fwd_overlap = None if layer[3] == "async" and not sb.structured else layer[3]
    edges = ("edges", mbs, tp, sp, zero == 3)
    shape = ("edges", mbs, tp, sp)   # read neither recomputation nor the ZeRO stage
    return {"fwd": ("fwd", *layer[:3], fwd_overlap, microbatches,
                    regathers_input(sb.sw, recompute)),
            "bwd": ("bwd", *layer, recompute), "emb": ("emb", *shape),
            "emb1": ("emb1", *shape), "load_l": ("load_l", *shape),
            "emb_b": ("emb_b", *edges), "emb_b1": ("emb_b1", *edges),
            "head_f": ("head_f", *edges), "head_b": ("head_b", *shape),
            "gather": ("gather", *shape)}
