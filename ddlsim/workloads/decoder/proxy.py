"""The GPT proxies' programs (``spcl/DNN-cpp-proxies``) as workload traces.

``model.program: proxy_gpipe`` (``proxies/comm_only/gpt2_large.cpp``, ``proxies/gpt3.cpp``,
``proxies/gpt3_moe.cpp``) and ``proxy_one_step`` (``proxies/gpt3_one_pipe_step.cpp``,
``proxies/gpt3_moe_one_pipe_step.cpp``). Sizes come from the model's
:class:`~ddlsim.workloads.models.decoder.DecoderShape` and the training dtype; the proxies'
``#define`` constants are what these formulas give for their models (tests/workloads/
test_proxy_gpt*.py). docs/workloads/gpt_proxies.md maps every MPI call to its trace op.

How MPI calls become trace ops (docs/trace.md):

* ``MPI_Isend`` / ``MPI_Irecv`` → a ``P2P`` on its own stream (``pp.send.fwd``,
  ``pp.send.bwd``, ``pp.recv``), posted after an anchor that follows the previous compute
  stream ops; ``MPI_Wait`` on a receive → a ``Wait`` on the compute stream that depends on
  the receive, so everything after it waits for the transfer. ``MPI_Wait`` on a send → a
  ``Wait`` on the send's stream, kept in the trace for ``ddlsim comm``'s non-blocking names
  but a no-op in the engines, which complete a send, for its sender, when it is posted
  (docs/trace.md, point 5): a stage does not wait for its previous send to be delivered.
* Blocking ``MPI_Allreduce`` / ``MPI_Alltoall`` → a ``Collective`` on the compute stream.
* ``usleep(T)`` → ``Compute(seconds=T + timer slack)`` from ``model.proxy_timings``
  (:func:`~ddlsim.workloads.proxytime.usleep_s`).
* ``calloc`` of the receive buffer inside the iteration (comm_only/gpt2_large.cpp:63-64,
  ``model.recv_buffers: fresh``) → the iteration's first receive (a stage's first forward
  one, stage 0's first backward one: the same buffer serves both) is followed by its first
  touch, a compute op (:mod:`~ddlsim.workloads.freshbuffers`), in the ``F.touch`` or
  ``B.touch`` block of micro-batch 0.
"""

from __future__ import annotations

import numpy as np

from ...config import DTYPE_BYTES, RunConfig
from ..models.decoder import DecoderShape
from ..freshbuffers import first_touch_op, insert_after
from ..proxytime import usleep_s
from ..trace import (Block, Collective, Compute, Op, P2P, Program, RankClass, Step, StepTable,
                     Wait, Workload, WorkloadMeta)

__all__ = ["ProxySizes", "build_proxy_workload", "check_proxy_plan"]

_RECV, _ANCHOR = "pp.recv", Wait("step.begin", "compute")


class ProxySizes:
    """Buffer sizes (bytes) of a proxy program, per rank, from the model and the plan.

    Parameters
    ----------
    cfg : the run configuration (``model.program`` a proxy program).
    shape : the decoder's closed-form counts.
    """

    def __init__(self, cfg: RunConfig, shape: DecoderShape):
        p, t, m = cfg.parallel, cfg.train, cfg.model
        self.shape, self.tp, self.pp, self.ep = shape, p.tp, p.pp, p.ep
        self.dt = DTYPE_BYTES[t.dtype]
        self.b, self.s = t.micro_batch_size, t.seq_length
        self.layers = shape.layers // self.pp
        self.weights_only = m.grad_buffers == "layer_weights"

    @property
    def p2p(self) -> float:
        """One pipeline message: the whole ``b·s·h`` activation on every TP rank (the proxies
        do not scatter-gather it over TP as Megatron does)."""
        return self.b * self.s * self.shape.hidden * self.dt

    @property
    def tp_allreduce(self) -> float:
        """One tensor-parallel all-reduce: ``b·s·h`` (Megatron's f/g operators)."""
        return self.b * self.s * self.shape.hidden * self.dt

    @property
    def alltoall(self) -> float:
        """One MoE dispatch or combine all-to-all, everything a rank sends: tokens × top-k ×
        h (× capacity factor when not dropless)."""
        sh = self.shape
        return self.b * self.s * sh.top_k * sh.hidden * self.dt * (sh.capacity_factor or 1.0)

    def layer_grads(self) -> tuple[float, float]:
        """(dense, expert) gradient bytes of one layer on one rank: ``grad_buffers: all``
        counts every parameter, ``layer_weights`` only the weight matrices (attention
        ``h·(q + 2kv) + q·h``, MLP ``m·h·f``, experts ``m·h·f_e``)."""
        sh, t = self.shape, self.tp
        if self.weights_only:
            attn = sh.hidden * (sh.q_width + 2 * sh.kv_width) + sh.q_width * sh.hidden
            if not sh.is_moe:
                return (attn + sh.mlp_matrices * sh.hidden * sh.ffn) * self.dt / t, 0.0
            experts = sh.experts * sh.mlp_matrices * sh.hidden * sh.f_e
            return attn * self.dt / t, experts * self.dt / (self.ep * t)
        if not sh.is_moe:
            return sh.layer_params * self.dt / t, 0.0
        experts = sh.experts * sh.mlp_params(sh.f_e)
        return ((sh.moe_layer_params - experts) * self.dt / t,
                experts * self.dt / (self.ep * t))

    def edge_grads(self, stage: int) -> tuple[float, float]:
        """(first-stage, last-stage) extra gradient bytes of ``stage``: the embedding (and
        learned positions) on stage 0; the final norm and the output head on the last stage
        (a tied head is Megatron's copy of the embedding there). None with
        ``layer_weights``."""
        sh = self.shape
        if self.weights_only:
            return 0.0, 0.0
        vh = sh.vocab * sh.hidden / self.tp
        first = vh + (sh.max_positions * sh.hidden if sh.positions == "learned" else 0)
        last = sh.norm_params + vh
        return ((first if stage == 0 else 0.0) * self.dt,
                (last if stage == self.pp - 1 else 0.0) * self.dt)


def check_proxy_plan(cfg: RunConfig) -> None:
    """The plan a proxy program can run: at least 2 stages (an even number for one step),
    GPipe, no overlap of the gradient sync, plain DDP without ZeRO, sequence parallelism or
    interleaving."""
    m, p = cfg.model, cfg.parallel
    if m.program == "megatron":
        return
    if p.pp < 2:
        raise ValueError(f"model.program = {m.program!r} needs pipeline_model_parallel_size "
                         f">= 2 (got {p.pp}): every proxy stage sends to a neighbour")
    if m.program == "proxy_one_step" and p.pp % 2:
        raise ValueError(f"model.program = 'proxy_one_step' needs an even "
                         f"pipeline_model_parallel_size (got {p.pp}): stages pair up 0-1, 2-3, …")
    if m.program == "proxy_gpipe" and (p.schedule != "gpipe" or cfg.software.overlap_grad_reduce):
        raise ValueError("model.program = 'proxy_gpipe' runs every forward, then every "
                         "backward, then the gradient all-reduces: set parallel.schedule: gpipe "
                         "and parallel.overlap_grad_reduce: false")
    bad = {k: v for k, v in (("zero_stage", p.zero_stage), ("dp_strategy", p.dp_strategy),
                             ("sequence_parallel", p.sequence_parallel),
                             ("virtual_pipeline_model_parallel_size", p.vpp))
           if v not in (0, "ddp", False, 1)}
    from .split import UNEVEN_FIELDS
    bad.update({f: getattr(p, f) for f in UNEVEN_FIELDS if getattr(p, f) not in (None, False)})
    if bad:
        raise ValueError(f"model.program = {m.program!r} does not model parallel settings "
                         f"{bad}: the proxies run plain data parallelism (zero_stage 0, "
                         "dp_strategy ddp) without sequence parallelism, interleaving or an uneven "
                         "pipeline split")


class _ProxyBuilder:
    """Blocks of one stage of a proxy program."""

    def __init__(self, cfg: RunConfig, shape: DecoderShape, groups):
        self.cfg, self.shape, self.sz = cfg, shape, ProxySizes(cfg, shape)
        self.groups = groups
        self.timings = cfg.model.proxy_timings
        self.p2p_mode = cfg.model.pipeline_p2p
        self.L = self.sz.layers

    def _size(self, family: str) -> int:
        g = self.groups.get(family)
        return g.size if g is not None else 1

    def compute(self, backward: bool) -> list[Op]:
        """The stage's compute for one micro-batch: ``L`` layers of the proxy's sleep (and
        the experts' sleep after each when MoE), or with ``compute: model`` of the layer's
        GEMM FLOPs (backward: 2×) timed by the cost model."""
        sh, sz, k = self.shape, self.sz, 2.0 if backward else 1.0
        g = sh.layer_gemm_flops(sz.b, sz.s)
        attn = k * (g["q"] + g["kv"] + g["attn_core"] + g["proj"]) / sz.tp
        rest = k * sum(v for n, v in g.items() if n not in ("q", "kv", "attn_core", "proj"))
        name = "backward" if backward else "forward"
        t = self.timings or {}  # compute: model: the cost model times the FLOPs
        if t.get(name) == 0:  # no compute at all (comm_only proxies): no FLOPs either
            attn = rest = 0.0
        dtype = self.cfg.train.dtype
        sec = usleep_s(t.get(name))
        if not sh.is_moe:
            return [Op(Compute(name, attn + rest / sz.tp, dtype=dtype, seconds=sec),
                       repeat=self.L)]
        return [Op(Compute(name, attn, dtype=dtype, seconds=sec), repeat=self.L),
                Op(Compute(f"{name}_experts", rest / sz.tp, dtype=dtype,
                           seconds=usleep_s(t.get(f"{name}_experts"))),
                   repeat=self.L)]

    def layer_collectives(self, backward: bool) -> list[Op]:
        """After the compute of a micro-batch, per layer: 2 TP all-reduces (gpt3.cpp:77-79)
        or 2 MoE all-to-alls (gpt3_moe.cpp:85-87), blocking."""
        tag, out = "bwd" if backward else "fwd", []
        if self._size("tp") > 1:
            out.append(Op(Collective(f"{tag}.tp.all_reduce", "all_reduce", "tp",
                                     self.sz.tp_allreduce), repeat=2 * self.L))
        if self.shape.is_moe and self._size("ep") > 1:
            out.append(Op(Collective(f"{tag}.moe.all_to_all", "all_to_all", "ep",
                                     self.sz.alltoall), repeat=2 * self.L))
        return out

    # ---------------------------------------------------------------- proxy_gpipe
    def gpipe_pass(self, stage: int, backward: bool) -> Block:
        """One micro-batch's forward (or backward) on ``stage`` (gpt3.cpp:59-104;
        comm_only/gpt2_large.cpp:67-104 with ``pipeline_p2p: concurrent``)."""
        pp = self.sz.pp
        src, dst = (+1, -1) if backward else (-1, +1)
        has_src = stage < pp - 1 if backward else stage > 0
        has_dst = stage > 0 if backward else stage < pp - 1
        tag = "grad" if backward else "act"
        send_stream = "pp.send.bwd" if backward else "pp.send.fwd"
        recv = P2P(f"irecv.{tag}", "recv", "pp", src, self.sz.p2p, tag)
        send = P2P(f"isend.{tag}", "send", "pp", dst, self.sz.p2p, tag)
        ops: list[Op] = [Op(_ANCHOR)]
        if self.p2p_mode == "concurrent":
            ops += self.compute(backward)
            c = len(ops) - 1
            ops += [Op(p, s, deps=(c,)) for p, s, on in ((send, send_stream, has_dst),
                                                        (recv, _RECV, has_src)) if on]
            if has_src:  # Waitall: the next step waits for the receive (its deps)
                ops.append(Op(Wait("wait.recv", _RECV), deps=(len(ops) - 1,)))
            if has_dst:  # … and for the send, which the engines complete when posted
                ops.append(Op(Wait("wait.send", send_stream)))
        else:
            if has_src:
                ops += [Op(recv, _RECV, deps=(0,)), Op(Wait("wait.recv", _RECV), deps=(1,))]
            ops.append(Op(Wait("wait.previous_send", send_stream)))
            ops += self.compute(backward)
            if has_dst:
                ops.append(Op(send, send_stream, deps=(len(ops) - 1,)))
        ops += self.layer_collectives(backward)
        return Block("B" if backward else "F", "backward" if backward else "forward", tuple(ops))

    def grad_sync(self, stage: int) -> Block:
        """The gradient all-reduces after the backward, blocking: one per layer (the
        embedding in the first, the head and final norm in the last; gpt2_large.cpp:107-123)
        or one per stage (gpt3.cpp:106; gpt3_moe.cpp:117-118: experts over ``edp`` first)."""
        dense, expert = self.sz.layer_grads()
        first, last = self.sz.edge_grads(stage)
        split = self.shape.is_moe and self._size("ep") > 1 and self.groups.get("edp") is not None
        if not split:
            dense, expert = dense + expert, 0.0
        ops: list[Op] = []

        def ar(name: str, group: str, nbytes: float, repeat: int = 1) -> None:
            if nbytes > 0 and self._size(group) > 1 and repeat > 0:
                ops.append(Op(Collective(name, "all_reduce", group, nbytes), repeat=repeat))

        if self.cfg.model.grad_sync == "per_stage":
            ar("grad.expert.all_reduce", "edp", expert * self.L)
            ar("grad.all_reduce", "dp", dense * self.L + first + last)
        else:
            extras = [0.0] * self.L
            extras[0] += first
            extras[-1] += last
            runs: list[list] = []
            for x in extras:
                if runs and runs[-1][0] == x:
                    runs[-1][1] += 1
                else:
                    runs.append([x, 1])
            for x, n in runs:
                ar("grad.expert.all_reduce", "edp", expert, n)
                ar("grad.all_reduce", "dp", dense + x, n)
        return Block("update", "sync", tuple(ops) or (Op(Wait("no.sync", "compute")),))

    def touched(self, stage: int, blocks: dict[str, Block]) -> str | None:
        """Add the block of the iteration's first receive with its first touch to ``blocks``
        (``F.touch`` on a stage that receives forward, else ``B.touch``) and return its name;
        None when nothing is charged (buffers reused, no measurement, or no receive)."""
        name = "F" if stage > 0 else "B"
        op = first_touch_op(self.cfg, self.sz.p2p, "recv") \
            if self.cfg.model.recv_buffers == "fresh" else None
        waits = [i for i, o in enumerate(blocks[name].ops) if o.name == "wait.recv"]
        if op is None or not waits:
            return None
        blocks[f"{name}.touch"] = insert_after(blocks[name], waits[0], op, f"{name}.touch")
        return f"{name}.touch"

    # ---------------------------------------------------------------- proxy_one_step
    def one_step(self, stage: int) -> Block:
        """gpt3_one_pipe_step.cpp:46-62: an even stage posts the receive of the next
        gradient from stage+1, computes a forward, runs its collectives, sends its output to
        stage+1 and waits for both; an odd stage mirrors it with a backward towards stage−1."""
        backward = stage % 2 == 1
        peer = -1 if backward else +1
        ops: list[Op] = [Op(_ANCHOR)]
        ops += self.compute(backward)
        ops += self.layer_collectives(backward)
        ops.append(Op(P2P("isend", "send", "pp", peer, self.sz.p2p,
                          "grad" if backward else "act"), "pp.send", deps=(len(ops) - 1,)))
        # the receive is posted at the start (deps: the anchor) but listed after the send:
        # engines resolve point-to-point ops in issue order, and the partner's send that it
        # waits for comes after the partner's own receive
        ops.append(Op(P2P("irecv", "recv", "pp", peer, self.sz.p2p,
                          "act" if backward else "grad"), _RECV, deps=(0,)))
        ops += [Op(Wait("waitall.recv", _RECV), deps=(len(ops) - 1,)),
                Op(Wait("waitall.send", "pp.send"))]
        return Block("step", "backward" if backward else "forward", tuple(ops))


def _gpipe_table(m: int, touch: str | None = None) -> StepTable:
    """Every forward micro-batch, every backward micro-batch, then the gradient sync;
    ``touch`` (``F.touch`` or ``B.touch``): that pass's block for micro-batch 0."""
    block = np.r_[np.zeros(m), np.ones(m), [2]].astype(np.int64)
    mb = np.r_[np.arange(m), np.arange(m), [0]].astype(np.int64)
    if touch is None:
        return StepTable(("F", "B", "update"), block, mb)
    block[0 if touch == "F.touch" else m] = 3
    return StepTable(("F", "B", "update", touch), block, mb)


def build_proxy_workload(cfg: RunConfig, shape: DecoderShape) -> Workload:
    """The trace of one iteration of a GPT proxy program (``model.program``).

    Parameters
    ----------
    cfg : a run configuration whose ``model.program`` is ``proxy_gpipe`` or ``proxy_one_step``.
    shape : the decoder's closed-form counts.

    Returns
    -------
    Workload
        One rank class per pipeline stage; groups from ``cfg.mesh``.
    """
    check_proxy_plan(cfg)
    mesh = cfg.mesh
    groups = mesh.families()
    b = _ProxyBuilder(cfg, shape, groups)
    pp, m = cfg.parallel.pp, cfg.num_microbatches
    gpipe = cfg.model.program == "proxy_gpipe"
    classes, shared, touch = [], {}, {}
    for stage in range(pp):
        if not gpipe:
            key = stage % 2
            if key not in shared:
                shared[key] = {"step": b.one_step(stage)}
            program = Program(shared[key], (Step("step"),))
        else:
            key = (stage == 0, stage == pp - 1)
            if key not in shared:
                shared[key] = {"F": b.gpipe_pass(stage, False), "B": b.gpipe_pass(stage, True),
                               "update": b.grad_sync(stage)}
                touch[key] = b.touched(stage, shared[key])
            program = Program(shared[key], _gpipe_table(m, touch[key]))
        ranks = groups["pp"].members[:, stage]
        classes.append(RankClass(f"stage{stage}", tuple(int(r) for r in ranks), program))
    t = cfg.train
    meta = WorkloadMeta(
        model=cfg.model.name, architecture=cfg.model.architecture,
        parameter_count=int(shape.params),
        model_flops=float(shape.model_flops(t.global_batch_size, t.seq_length)
                          if any((cfg.model.proxy_timings or {"": 1}).values()) else 0.0),
        tokens=t.global_batch_size * t.seq_length, samples=t.global_batch_size,
        microbatches=m, dtype=t.dtype)
    return Workload(f"{cfg.model.name}-{cfg.model.program}-tp{b.sz.tp}-pp{pp}-dp{cfg.dp}",
                    mesh.world_size, groups, tuple(classes), meta)


def proxy_memory(cfg: RunConfig, shape: DecoderShape) -> list:
    """Memory of one rank per stage: what the proxy allocates, not a training run's model
    states. Gradients: a send and a receive buffer per all-reduced byte (gpt2_large.cpp:204-205,
    gpt3.cpp:173-174); other: four pipeline message buffers (gpt3.cpp:176-179)."""
    from ..memory import MemoryBreakdown

    sz = ProxySizes(cfg, shape)
    dense, expert = sz.layer_grads()
    sync = cfg.model.program == "proxy_gpipe"
    out = []
    for s in range(sz.pp):
        grads = sum(sz.edge_grads(s)) + (dense + expert) * sz.layers if sync else 0.0
        out.append(MemoryBreakdown(0.0, 2 * grads, 0.0, 0.0, 4 * sz.p2p,
                                   cfg.system.device.memory_bytes, s))
    return out
