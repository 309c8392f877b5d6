"""GPT training iteration → workload trace (Megatron-LM layout, DDP / ZeRO / the seed's DP
update strategies, GPipe / 1F1B / interleaved pipelines).

Rank order follows Megatron-LM: tensor-parallel innermost, then data-parallel, then pipeline:
``rank = t + T·(d + D·s)``. All ranks of one pipeline stage run the same program, so each
stage is one rank class (the reduce-to-root strategy splits off the root, which alone updates).
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from ..config import DTYPE_BYTES, RunConfig
from .memory import stage_memory
from .models.gpt import GPTShape
from .schedules import schedule_arrays
from .trace import (Block, Collective, Compute, GroupFamily, Op, P2P, Program, RankClass,
                    StepTable, Wait, Workload, WorkloadMeta)

__all__ = ["build_gpt_workload", "megatron_groups", "ADAM_BYTES_PER_PARAM"]

#: Bytes the optimizer step reads and writes per parameter (mixed-precision Adam: fp32 master
#: weights, momentum and variance read and written, 16-bit gradient read, 16-bit weight written).
ADAM_BYTES_PER_PARAM = 3 * 4 * 2 + 2 + 2


def megatron_groups(tp: int, dp: int, pp: int) -> dict[str, GroupFamily]:
    """tp, dp and pp group families for ``rank = t + T·(d + D·s)``."""
    r = np.arange(tp * dp * pp).reshape(pp, dp, tp)  # [s, d, t]
    return {
        "tp": GroupFamily("tp", "tp", r.reshape(pp * dp, tp)),
        "dp": GroupFamily("dp", "dp", r.transpose(0, 2, 1).reshape(pp * tp, dp)),
        "pp": GroupFamily("pp", "pp", r.transpose(1, 2, 0).reshape(dp * tp, pp)),
    }


class _Builder:
    """Builds the blocks of one pipeline stage."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.shape = GPTShape.of(cfg.model)
        p, t = cfg.parallel, cfg.train
        self.tp, self.pp, self.v, self.dp = p.tp, p.pp, p.vpp, cfg.dp
        self.sp = p.sequence_parallel
        self.b, self.s = t.micro_batch_size, t.seq_length
        self.dt = DTYPE_BYTES[t.dtype]
        self.dtype = t.dtype
        self.layers_per_chunk = cfg.model.num_hidden_layers // (self.pp * self.v)
        self.act_bytes = self.b * self.s * cfg.model.hidden_size * self.dt
        self._layer_ops: dict[tuple[bool, int], list[Op]] = {}
        self._ops: dict[tuple, object] = {}

    @cached_property
    def fwd_layer(self) -> list[Compute | Collective]:
        return self.layer_forward()

    @cached_property
    def bwd_layer(self) -> list[Compute | Collective]:
        return self.layer_backward()

    def cached(self, key: tuple, make):
        """``make()``, built once per key: ops are immutable, so stages and chunks that need the
        same op share one object."""
        hit = self._ops.get(key)
        if hit is None:
            hit = self._ops[key] = make()
        return hit

    def layer_ops(self, backward: bool, repeat: int) -> list[Op]:
        """One layer's forward (or backward) ops, each repeated ``repeat`` times (ops are
        immutable, so every block and stage shares these lists)."""
        key = (backward, repeat)
        ops = self._layer_ops.get(key)
        if ops is None:
            ops = self._layer_ops[key] = [Op(x, repeat=repeat) for x in
                                          (self.bwd_layer if backward else self.fwd_layer)]
        return ops

    # ------------------------------------------------------------------ per-layer ops
    def _tp_comm(self, name: str) -> list[Collective]:
        """Megatron's f/g operators: an all-reduce, or reduce-scatter + all-gather with SP."""
        if self.tp == 1:
            return []
        if self.sp:
            return [Collective(f"{name}.rs", "reduce_scatter", "tp", self.act_bytes),
                    Collective(f"{name}.ag", "all_gather", "tp", self.act_bytes)]
        return [Collective(f"{name}.ar", "all_reduce", "tp", self.act_bytes)]

    def layer_forward(self, tag: str = "fwd") -> list[Compute | Collective]:
        g = self.shape.layer_gemm_flops(self.b, self.s)
        t, dt = self.tp, self.dt
        ew = self.shape.layer_elementwise_bytes(self.b, self.s, t, self.sp, dt)
        ops: list[Compute | Collective] = [
            Compute(f"{tag}.attn", (g["qkv"] + g["attn_core"] + g["proj"]) / t, dtype=self.dtype),
            *self._tp_comm(f"{tag}.attn"),
            Compute(f"{tag}.mlp", g["mlp"] / t, dtype=self.dtype),
            *self._tp_comm(f"{tag}.mlp"),
            Compute(f"{tag}.elementwise", 0.0, ew, kind="elementwise", dtype=self.dtype),
        ]
        return ops

    def layer_backward(self) -> list[Compute | Collective]:
        g = self.shape.layer_gemm_flops(self.b, self.s)
        t, dt = self.tp, self.dt
        recompute = self.cfg.train.recompute
        ops: list[Compute | Collective] = []
        if recompute == "full":
            ops += self.layer_forward("recompute")
        elif recompute == "selective":
            ew_scores = 3 * 2 * self.b * self.shape.a * self.s * self.s / t * dt
            ops.append(Compute("recompute.attn_core", g["attn_core"] / t, ew_scores, dtype=self.dtype))
        ew = 2 * self.shape.layer_elementwise_bytes(self.b, self.s, t, self.sp, dt)
        ops += [
            Compute("bwd.mlp", 2 * g["mlp"] / t, dtype=self.dtype),
            *self._tp_comm("bwd.mlp"),
            Compute("bwd.attn", 2 * (g["qkv"] + g["attn_core"] + g["proj"]) / t, dtype=self.dtype),
            *self._tp_comm("bwd.attn"),
            Compute("bwd.elementwise", 0.0, ew, kind="elementwise", dtype=self.dtype),
            Compute("bwd.grad_accumulate", 0.0, self.grad_accumulate_bytes(self.shape.layer_params / t),
                    kind="elementwise", dtype=self.dtype),
        ]
        return ops

    def grad_accumulate_bytes(self, params: float) -> float:
        """Memory traffic of adding one micro-batch's weight gradients into the accumulated
        gradients: the GEMM writes them in the training dtype, then they are read and added
        into an fp32 buffer (read + write). Megatron-LM's ``main_grad`` hook
        (``param.main_grad.add_(param.grad)``) and PyTorch's AccumulateGrad in fp32 training."""
        return params * (2 * self.dt + 2 * 4)

    # ------------------------------------------------------------------ edges of the model
    def embedding_forward(self) -> list[Compute | Collective]:
        ops: list[Compute | Collective] = [
            Compute("embedding", 0.0, 2 * self.act_bytes, kind="elementwise", dtype=self.dtype)]
        if self.tp > 1:  # vocab-parallel embedding: all-reduce of the looked-up rows
            ops.append(Collective("embedding.ar", "all_reduce", "tp", self.act_bytes))
        return ops

    def head_forward(self) -> list[Compute | Collective]:
        V, t = self.shape.V, self.tp
        ops: list[Compute | Collective] = [
            Compute("logits", self.shape.logits_forward_flops(self.b, self.s) / t, dtype=self.dtype),
            Compute("loss", 0.0, 3 * 4 * self.b * self.s * V / t, kind="elementwise", dtype=self.dtype),
        ]
        if t > 1:  # vocab-parallel cross-entropy: max, sum-exp and target logit across TP
            ops.append(Collective("loss.ar", "all_reduce", "tp", 4.0 * self.b * self.s))
        return ops

    def head_backward(self) -> list[Compute | Collective]:
        emb = self.shape.V * self.shape.h / self.tp
        return [Compute("bwd.logits", 2 * self.shape.logits_forward_flops(self.b, self.s) / self.tp,
                        dtype=self.dtype),
                Compute("bwd.grad_accumulate.embedding", 0.0, self.grad_accumulate_bytes(emb),
                        kind="elementwise", dtype=self.dtype)]

    # ------------------------------------------------------------------ parameters per stage
    def stage_params(self, stage: int) -> float:
        """Parameters held by one rank of ``stage`` (TP-sharded; tied embedding copied to the
        last stage as Megatron does)."""
        sh, t = self.shape, self.tp
        n = self.layers_per_chunk * self.v * sh.layer_params / t
        if stage == 0:
            n += sh.V * sh.h / t + sh.s_max * sh.h
        if stage == self.pp - 1:
            n += 2 * sh.h + (sh.V * sh.h / t if self.pp > 1 else 0)
        return n

    # ------------------------------------------------------------------ blocks
    def chunk_blocks(self, stage: int, chunk: int, sync_ops: list[Op] | None) -> dict[str, Block]:
        """Forward and backward blocks of one model chunk of ``stage`` (and, if ``sync_ops``
        is given, the variant of the backward that overlaps the gradient sync)."""
        k = chunk * self.pp + stage           # virtual stage index
        last_k = self.pp * self.v - 1
        p2p_bytes = self.act_bytes / (self.tp if self.tp > 1 and not self.sp else 1)
        Lc = self.layers_per_chunk

        def recv(tag: str, peer: int) -> list[Op]:
            def make() -> list[Op]:
                ops = [Op(P2P(f"recv.{tag}", "recv", "pp", peer, p2p_bytes, tag), stream="pp")]
                if self.tp > 1 and not self.sp:  # scatter-gather (Narayanan 2021 §4.1)
                    ops.append(Op(Collective(f"{tag}.gather", "all_gather", "tp", self.act_bytes),
                                  deps=(len(ops) - 1,)))
                return ops
            return self.cached(("recv", tag, peer), make)

        def send(tag: str, peer: int, dep: int) -> Op:
            return self.cached(("send", tag, peer, dep), lambda: Op(
                P2P(f"send.{tag}", "send", "pp", peer, p2p_bytes, tag), stream="pp", deps=(dep,)))

        def after(op: Op, dep: int) -> Op:  # ``op`` made to depend on op ``dep``
            return self.cached(("after", op, dep), lambda: Op(op.payload, op.stream, (dep,), op.repeat))

        # tags name the receiving chunk, so every middle stage has the same blocks (the last
        # stage's chunk c feeds chunk c + 1 of stage 0 in the interleaved schedule)
        fwd: list[Op] = []
        if k > 0:
            fwd += recv(f"act.c{chunk}", -1)
        if k == 0:
            fwd += self.cached(("embedding",), lambda: [Op(x) for x in self.embedding_forward()])
        first = len(fwd)
        fwd += self.layer_ops(False, Lc)
        if fwd[:first]:
            fwd[first] = after(fwd[first], first - 1)
        if k == last_k:
            fwd += self.cached(("head",), lambda: [Op(x) for x in self.head_forward()])
        else:
            to = chunk + (1 if stage == self.pp - 1 else 0)
            fwd.append(send(f"act.c{to}", +1, len(fwd) - 1))

        def backward(with_sync: bool) -> list[Op]:
            ops: list[Op] = []
            if k < last_k:
                ops += recv(f"grad.c{chunk}", +1)
            else:
                ops += self.cached(("head.bwd",), lambda: [Op(x) for x in self.head_backward()])
            start = len(ops)
            if with_sync and sync_ops:
                ops += self._overlapped_layers(sync_ops, start)
            else:
                ops += self.layer_ops(True, Lc)
            if ops[:start]:
                ops[start] = after(ops[start], start - 1)
            if k > 0:
                last_compute = next(i for i in range(len(ops) - 1, -1, -1)
                                    if ops[i].stream == "compute")
                to = chunk - (1 if stage == 0 else 0)
                ops.append(send(f"grad.c{to}", -1, last_compute))
            return ops

        blocks = {f"F{chunk}": Block(f"F{chunk}", "forward", tuple(fwd)),
                  f"B{chunk}": Block(f"B{chunk}", "backward", tuple(backward(False)))}
        if sync_ops:
            blocks[f"B{chunk}.sync"] = Block(f"B{chunk}.sync", "backward", tuple(backward(True)))
        return blocks

    def _overlapped_layers(self, sync_ops: list[Op], start: int) -> list[Op]:
        """Backward layers split into bucket segments; after each segment its gradients'
        collective is issued on the dp stream (PyTorch DDP buckets, overlap with backward)."""
        key = ("overlapped", tuple((o.payload, o.repeat) for o in set(sync_ops)), len(sync_ops),
               start)
        return self.cached(key, lambda: self._segments(sync_ops, start))

    def _segments(self, sync_ops: list[Op], start: int) -> list[Op]:
        Lc, n_seg = self.layers_per_chunk, len(sync_ops)
        ops: list[Op] = []
        for seg, s in enumerate(sync_ops):
            ops += self.layer_ops(True, Lc // n_seg + (1 if seg < Lc % n_seg else 0))
            ops.append(Op(s.payload, stream=s.stream, deps=(start + len(ops) - 1,), repeat=s.repeat))
        return ops

    def grad_sync_ops(self, stage: int) -> list[Op]:
        """Bucketed gradient collectives of one model chunk (all-reduce, or reduce-scatter
        under ZeRO-1/2), one per segment of layers, on the ``dp`` stream."""
        if self.dp == 1:
            return []
        grad_bytes = self.stage_params(stage) / self.v * self.dt
        bucket = self.cfg.parallel.grad_bucket_size
        n_buckets = max(1, math.ceil(grad_bytes / bucket))
        n_seg = min(n_buckets, self.layers_per_chunk)
        per_seg = math.ceil(n_buckets / n_seg)
        op = "reduce_scatter" if self.cfg.parallel.zero_stage in (1, 2) else "all_reduce"
        size = grad_bytes / (n_seg * per_seg)
        return [Op(Collective(f"grad.{op}", op, "dp", size), stream="dp", repeat=per_seg)] * n_seg

    def update_block(self, stage: int, root: bool, overlapped: bool) -> Block:
        """Gradient synchronisation not overlapped with backward, the optimizer step, and the
        parameter redistribution of the chosen data-parallel update."""
        p = self.cfg.parallel
        params = self.stage_params(stage)
        grad_bytes, dp = params * self.dt, self.dp
        opt = self.cfg.train.optimizer
        per_param = ADAM_BYTES_PER_PARAM if opt == "adam" else 2 * 4 + 2 + 2

        def step(n_params: float) -> Op:
            return Op(Compute("optimizer", 10.0 * n_params, per_param * n_params,
                              kind="optimizer", dtype="fp32"))

        if dp == 1:
            return Block("update", "optimizer", (step(params),))
        # ops[0] marks "backward finished": communication-stream ops below depend on it
        ops: list[Op] = [Op(Wait("backward.done", "compute"))]
        if p.dp_strategy == "ddp":
            if overlapped:
                ops.append(Op(Wait("wait.grad", "dp")))
            elif p.zero_stage in (0, 1, 2):
                op = "all_reduce" if p.zero_stage == 0 else "reduce_scatter"
                ops += [*self.grad_sync_ops_flat(grad_bytes, op), Op(Wait("wait.grad", "dp"))]
            if p.zero_stage == 3:
                ops.append(Op(Wait("wait.grad", "dp.rs")))
            shard = params / dp if p.zero_stage else params
            ops.append(step(shard))
            if p.zero_stage in (1, 2):
                ops.append(Op(Collective("params.all_gather", "all_gather", "dp", params * self.dt)))
        elif p.dp_strategy == "reduce_broadcast":
            ops.append(Op(Collective("grad.reduce", "reduce", "dp", grad_bytes, root=0)))
            if root:
                ops.append(step(params))
            ops.append(Op(Collective("params.broadcast", "broadcast", "dp", params * self.dt, root=0)))
        elif p.dp_strategy == "sliced_reduce_broadcast":
            for i in range(dp):
                ops.append(Op(Collective(f"grad.reduce.slice{i}", "reduce", "dp", grad_bytes / dp,
                                         root=i), stream=f"dp.{i}"))
            ops += [Op(Wait(f"wait.slice{i}", f"dp.{i}")) for i in range(dp)]
            ops.append(step(params / dp))
            base = len(ops) - 1
            for i in range(dp):
                ops.append(Op(Collective(f"params.broadcast.slice{i}", "broadcast", "dp",
                                         params * self.dt / dp, root=i), stream=f"dp.{i}",
                              deps=(base,)))
            ops += [Op(Wait(f"wait.bslice{i}", f"dp.{i}")) for i in range(dp)]
        else:  # reduce_scatter
            ops.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", "dp", grad_bytes)))
            ops.append(step(params / dp))
            ops.append(Op(Collective("params.all_gather", "all_gather", "dp", params * self.dt)))
        anchored = tuple(Op(o.payload, o.stream, o.deps or (0,), o.repeat)
                         if o.stream != "compute" else o for o in ops)
        return Block("update", "optimizer", anchored)

    def grad_sync_ops_flat(self, grad_bytes: float, op: str) -> list[Op]:
        n = max(1, math.ceil(grad_bytes / self.cfg.parallel.grad_bucket_size))
        return [Op(Collective(f"grad.{op}", op, "dp", grad_bytes / n), stream="dp", repeat=n)]


def _zero3_blocks(b: _Builder, stage: int) -> dict[str, Block]:
    """ZeRO-3 without pipelining: every layer's parameters are all-gathered before its forward
    and backward (prefetched on stream dp.ag) and its gradients reduce-scattered after its
    backward (stream dp.rs): 3Ψ per iteration (Rajbhandari et al. 2020, §7.2.2)."""
    layer_bytes = b.shape.layer_params / b.tp * b.dt
    fwd: list[Op] = [Op(x) for x in b.embedding_forward()]
    bwd: list[Op] = [Op(x) for x in b.head_backward()]
    for i in range(b.layers_per_chunk):
        fwd.append(Op(Collective("param.all_gather", "all_gather", "dp", layer_bytes), "dp.ag"))
        fwd += [Op(x, deps=(len(fwd) - 1,) if j == 0 else ()) for j, x in enumerate(b.layer_forward())]
    fwd += [Op(x) for x in b.head_forward()]
    for i in range(b.layers_per_chunk):
        bwd.append(Op(Collective("param.all_gather", "all_gather", "dp", layer_bytes), "dp.ag"))
        bwd += [Op(x, deps=(len(bwd) - 1,) if j == 0 else ()) for j, x in enumerate(b.layer_backward())]
        bwd.append(Op(Collective("grad.reduce_scatter", "reduce_scatter", "dp", layer_bytes),
                      "dp.rs", deps=(len(bwd) - 1,)))
    return {"F0": Block("F0", "forward", tuple(fwd)), "B0": Block("B0", "backward", tuple(bwd))}


def _step_tables(sched: str, pp: int, m: int, v: int, sync: bool) -> list[StepTable]:
    """Each stage's steps, built for all stages at once from :func:`schedule_arrays`; the last
    backward of each chunk uses its ``.sync`` block, and ``update`` ends the iteration."""
    backward, ordinal, mb, chunk, warm = schedule_arrays(sched, pp, m, v)
    v = v if sched == "interleaved" else 1
    T = m * v
    names = [f"F{c}" for c in range(v)] + [f"B{c}" for c in range(v)]
    block = np.where(backward, v + chunk, chunk)
    first_sync = np.full(pp, 2 * T)
    if sync:
        names += [f"B{c}.sync" for c in range(v)]
        b0, o0, c0 = backward[0], ordinal[0], chunk[0]
        last_b = np.array([o0[b0 & (c0 == c)].max() for c in range(v)])
        is_sync = backward & (ordinal == last_b[chunk])
        block = np.where(is_sync, 2 * v + chunk, block)
        first_sync = np.argmax(is_sync, axis=1)
    names.append("update")
    tail = np.zeros((pp, 1), dtype=np.int64)
    block = np.hstack([block, tail + len(names) - 1])
    mb, chunk = np.hstack([mb, tail]), np.hstack([chunk, tail])
    for a in (block, mb, chunk):
        a.setflags(write=False)
    tables = []
    for s in range(pp):
        w = int(warm[s])
        if sched == "gpipe":       # the forwards: one per micro-batch, nothing in between
            steady = (0, min(T, int(first_sync[s])), 1, 1)
        elif sched == "1f1b":      # one forward and one backward per micro-batch
            steady = (w, min(2 * T - w, int(first_sync[s])), 2, 1)
        else:                      # p micro-batches of every chunk, forward and backward
            steady = (w, min(2 * T - w, int(first_sync[s])), 2 * pp * v, pp)
        tables.append(StepTable.trusted(names, block[s], mb[s], chunk[s], steady))
    return tables


def build_gpt_workload(cfg: RunConfig) -> Workload:
    """The trace of one training iteration of ``cfg`` (a GPT model).

    Stages that play the same role (first, last, or in between) share their block objects,
    and every stage's steps are a :class:`StepTable`, so building a 32-stage plan with 384
    micro-batches costs a few arrays rather than 25,000 objects.
    """
    b = _Builder(cfg)
    par = cfg.parallel
    tp, dp, pp, v, m = b.tp, b.dp, b.pp, b.v, cfg.num_microbatches
    groups = megatron_groups(tp, dp, pp)
    overlap = par.overlap_grad_reduce and par.dp_strategy == "ddp" and par.zero_stage in (0, 1, 2)
    split_root = par.dp_strategy == "reduce_broadcast" and dp > 1
    zero3 = par.zero_stage == 3 and dp > 1
    classes: list[RankClass] = []
    ranks = np.arange(tp * dp * pp).reshape(pp, dp, tp)
    tables = None
    shared: dict[tuple, dict[str, Block]] = {}
    for stage in range(pp):
        role = (stage == 0, stage == pp - 1)
        blocks = shared.get(role)
        if blocks is None:
            blocks = {}
            if zero3:
                blocks.update(_zero3_blocks(b, stage))
            else:
                sync = b.grad_sync_ops(stage) if overlap else None
                for c in range(v):
                    blocks.update(b.chunk_blocks(stage, c, sync))
            shared[role] = blocks
        if tables is None:
            sync_blocks = any(name.endswith(".sync") for name in blocks)
            tables = _step_tables(par.schedule, pp, m, v, sync_blocks)
        splits = [(True, ranks[stage, :1]), (False, ranks[stage, 1:])] if split_root \
            else [(True, ranks[stage])]
        for root, members in splits:
            key = (*role, root, "update")
            update = shared.get(key)
            if update is None:
                update = shared[key] = {"update": b.update_block(stage, root, overlap)}
            program = Program({**blocks, **update}, tables[stage])
            name = f"stage{stage}" + ("" if len(splits) == 1 else (".root" if root else ".rest"))
            classes.append(RankClass(name, tuple(members.ravel().tolist()), program))
    shape = b.shape
    t = cfg.train
    model_flops = shape.model_flops(t.global_batch_size, t.seq_length)
    meta = WorkloadMeta(
        model=cfg.model.name, architecture="gpt", parameter_count=int(shape.params),
        model_flops=float(model_flops), tokens=t.global_batch_size * t.seq_length,
        samples=t.global_batch_size, microbatches=m, dtype=t.dtype)
    wl = Workload(f"{cfg.model.name}-tp{tp}-pp{pp}-dp{dp}", tp * dp * pp, groups, tuple(classes), meta)
    return wl


def gpt_memory(cfg: RunConfig) -> list:
    """Per-stage memory of one rank (see :func:`ddlsim.workloads.memory.stage_memory`)."""
    b = _Builder(cfg)
    return [stage_memory(cfg, b.shape, s, b.stage_params(s)) for s in range(b.pp)]
