"""The trace of one BERT iteration: data parallel, or pipeline + data parallel.

Each pipeline stage holds ``L/p`` encoder layers, the first also the embeddings, the last also
the pre-training heads. Per micro-batch a stage receives activations, computes, sends them on
(forward) and the reverse for gradients (backward), in the order of ``parallel.schedule``.
Gradient buckets (PyTorch DDP's size rule, or one per layer) are all-reduced over the ``dp``
group: overlapped with the last micro-batch's backward, or blocking after it
(``parallel.overlap_grad_reduce: false``, as bert_large.cpp calls ``MPI_Allreduce``).

``stage_exchange: paired`` reproduces comm_only/bert_large.cpp lines 66-104: per micro-batch a middle
stage posts ``MPI_Isend`` to one neighbour and ``MPI_Irecv`` from the other together and
``MPI_Waitall``s both, so its send does not wait for its receive; the default
(``dependent``) is a real pipeline, where a stage sends what it computed from what it received.
"""

from __future__ import annotations

from ...config import DTYPE_BYTES, RunConfig
from ..buckets import FIRST_BUCKET_BYTES, BackwardUnit, backward_with_buckets, ddp_buckets
from ..memory import MemoryBreakdown, inflight_chunks, model_state_bytes
from ..schedules import schedule
from ..resnet.build import model_flops
from ..decoder.tied_embedding import GROUP, OP_NAME, family_of
from ..trace import (P2P, Block, Collective, Compute, Kernel, Op, Program, RankClass, Step,
                     Workload, WorkloadMeta)
from .kernels import embedding_kernels, head_kernels, layer_kernels
from ..freshbuffers import first_touch_op, insert_after
from .schema import LAYER_TENSORS
from .step import apex_master_kernels, autograd_accumulate_kernels

__all__ = ["build_bert", "bert_memory", "stage_buckets", "p2p_bytes"]


def p2p_bytes(cfg: RunConfig) -> float:
    """Bytes of one pipeline message: the ``b·s·h`` hidden states, plus the ``b·s`` attention
    mask with ``p2p_attention_mask`` (bert_large.cpp:22, ``P2PSIZE = 8·128·1024 + 8·128``)."""
    m, t = cfg.model, cfg.train
    bs = t.micro_batch_size * t.seq_length
    return DTYPE_BYTES[t.dtype] * bs * (m.hidden_size + (1 if m.p2p_attention_mask else 0))


def stage_buckets(cfg: RunConfig, stage: int) -> tuple[list[float], list[range], list[range]]:
    """Gradient bytes of ``stage`` in gradient-ready order, its buckets as ranges over them in
    ready order, and the buckets in the order a non-overlapped all-reduce issues them
    (``per_layer``: layer order, as bert_large.cpp:106-123; ``ddp``: ready order)."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    sizes = m.stage_tensors(stage, p.pp)
    grads = [DTYPE_BYTES[t.dtype] * n for n in reversed(sizes)]
    if m.grad_buckets == "ddp":
        ready = ddp_buckets(grads, p.grad_bucket_size, FIRST_BUCKET_BYTES)
        return grads, ready, ready
    per = m.num_hidden_layers // p.pp
    counts = [LAYER_TENSORS] * per        # forward order: embeddings join the first layer,
    if stage == 0:                        # the heads the last
        counts[0] += len(m.embedding_tensors())
    if stage == p.pp - 1:
        counts[-1] += len(m.head_tensors(p.pp))
    ready, start = [], 0
    for c in reversed(counts):
        ready.append(range(start, start + c))
        start += c
    return grads, ready, ready[::-1]


class _Stage:
    """Compute ops of one stage (``compute: model``) or the proxy's sleeps."""

    def __init__(self, cfg: RunConfig, stage: int):
        self.cfg, self.stage = cfg, stage
        m, t, p = cfg.model, cfg.train, cfg.parallel
        self.first, self.last = stage == 0, stage == p.pp - 1
        self.b, self.s, self.dtype = t.micro_batch_size, t.seq_length, t.dtype
        self.layers = m.num_hidden_layers // p.pp
        self.proxy = m.compute == "proxy"

    def _accumulate(self, tensors: list[int], accumulate: bool) -> tuple[Kernel, ...]:
        """The kernels adding a backward's fresh gradients of ``tensors`` into ``.grad``
        (``grad_accumulation: autograd`` on a micro-batch whose gradients join the step's:
        :func:`.step.autograd_accumulate_kernels`), or none. They join the op whose
        backward makes those gradients: autograd runs each ``AccumulateGrad`` as its
        gradient is ready, between that op's kernels."""
        if not accumulate or self.cfg.model.grad_accumulation != "autograd":
            return ()
        return autograd_accumulate_kernels(tensors, DTYPE_BYTES[self.dtype])

    def _layer(self, k: float, accumulate: bool = False) -> tuple[Compute, ...]:
        """One layer's dense GEMMs, attention core and element-wise passes
        (:func:`.kernels.layer_kernels`) as one op of their kernels, scaled by ``k`` (1
        forward, 2 backward) in FLOPs; a backward whose gradients ``accumulate`` adds their
        kernels (:meth:`_accumulate`). One op, because one host thread issues the layer's
        GEMMs and passes interleaved: its lead over the device builds across the whole layer
        (:mod:`ddlsim.simulator.kernels.host`), not over its GEMMs and its short passes
        apart."""
        m, b, s, w = self.cfg.model, self.b, self.s, DTYPE_BYTES[self.dtype]
        gemm, attn = m.layer_flops(b, s)
        h, f, a = m.hidden_size, m.ffn, m.num_attention_heads
        weights = w * sum(m.layer_tensors())
        elems = 12 * b * s * h + 4 * b * s * f + 3 * b * a * s * s   # LN, GeLU, softmax, dropout
        tag = "bwd" if k > 1 else "fwd"
        dense, core, passes = layer_kernels(m, b, s, w, self.dtype, k > 1)
        acc = self._accumulate(m.layer_tensors(), accumulate and k > 1)
        return (Compute(f"{tag}.layer", k * (gemm + attn + 2 * elems),
                        k * (weights + 8 * w * b * s * h) + _bytes(core + passes + acc),
                        dtype=self.dtype, kernels=dense + core + passes + acc),)

    def _ends(self, k: float, accumulate: bool = False
              ) -> tuple[tuple[Compute, ...], tuple[Compute, ...]]:
        """(embedding ops, head ops) of this stage, scaled by ``k`` (1 forward, 2 backward)
        in FLOPs, each an op of its kernels (:mod:`.kernels`), with their gradients'
        accumulation where the backward's gradients ``accumulate`` (:meth:`_accumulate`)."""
        m, b, s, w = self.cfg.model, self.b, self.s, DTYPE_BYTES[self.dtype]
        tag, back = ("bwd", True) if k > 1 else ("fwd", False)
        acc = accumulate and back
        emb = (embedding_kernels(m, b, s, w, self.dtype, back)
               + self._accumulate(m.embedding_tensors(), acc))
        head_acc = self._accumulate(m.head_tensors(self.cfg.parallel.pp), acc)
        head = head_kernels(m, b, s, w, self.dtype, back) + head_acc
        return ((Compute(f"{tag}.embedding", k * 8 * b * s * m.hidden_size, _bytes(emb),
                         kind="elementwise", dtype=self.dtype, kernels=emb),)
                if self.first else (),
                (Compute(f"{tag}.heads", k * m.head_flops(b, s),
                         k * w * (sum(m.head_tensors(self.cfg.parallel.pp))
                                  + b * m.mlm_tokens(s) * m.vocab_size)
                         + _bytes(head_acc), dtype=self.dtype, kernels=head),)
                if self.last else ())

    def forward(self) -> tuple[Op, ...]:
        if self.proxy:
            s = self.cfg.model.proxy_timings["forward_per_microbatch"]
            return (Op(Compute("fwd.stage", self._flops() if s > 0 else 0.0, dtype=self.dtype,
                               seconds=s)),)
        emb, head = self._ends(1.0)
        return tuple([Op(c) for c in emb] + [Op(c, repeat=self.layers) for c in self._layer(1.0)]
                     + [Op(c) for c in head])

    def backward_units(self, first: bool = False) -> list[BackwardUnit]:
        """Backward compute in gradient-ready order, one unit per layer (heads with the last
        layer's unit, embeddings in a unit of their own), of the step's ``first``
        micro-batch or a later one (``model.grad_accumulation``, :mod:`.step`)."""
        m = self.cfg.model
        if self.proxy:
            s = m.proxy_timings["backward_per_microbatch"]
            n = len(m.stage_tensors(self.stage, self.cfg.parallel.pp))
            return [BackwardUnit((Compute("bwd.stage", 2 * self._flops() if s > 0 else 0.0,
                                          dtype=self.dtype, seconds=s),), n)]
        emb, head = self._ends(2.0, not first)
        layer = self._layer(2.0, not first)
        units = [BackwardUnit(head, len(m.head_tensors(self.cfg.parallel.pp)))
                 for _ in (0,) if self.last]
        units += [BackwardUnit(layer, LAYER_TENSORS) for _ in range(self.layers)]
        if self.first:
            units.append(BackwardUnit(emb, len(m.embedding_tensors())))
        if m.grad_accumulation == "apex_master":     # after the whole backward
            ks = apex_master_kernels(m.stage_tensors(self.stage, self.cfg.parallel.pp), first)
            last = units[-1]
            units[-1] = BackwardUnit(last.ops + (Compute("bwd.master_grads", 0.0, _bytes(ks),
                                                         kind="elementwise", dtype="fp32",
                                                         kernels=ks),), last.n_grads)
        return units

    def _flops(self) -> float:
        m = self.cfg.model
        gemm, attn = m.layer_flops(self.b, self.s)
        return self.layers * (gemm + attn) + (m.head_flops(self.b, self.s) if self.last else 0)


def _bytes(kernels) -> float:
    """Bytes the memory kernels of ``kernels`` move (B)."""
    return sum(k.bytes for k in kernels if k.kind == "memory")


def _exchange(ops: tuple[Op, ...], recv: int | None, send: int | None, nbytes: float,
              tag: str, paired: bool) -> tuple[Op, ...]:
    """``ops`` framed by a receive from member ``recv`` and a send to member ``send`` of the
    ``pp`` group (None: no such neighbour). The send follows the last compute op (not the
    gradient all-reduces a synced backward ends with)."""
    r = [] if recv is None else [P2P(f"recv.{tag}", "recv", "pp", recv, nbytes, tag)]
    s = [] if send is None else [P2P(f"send.{tag}", "send", "pp", send, nbytes, tag)]
    if paired:   # compute, then Isend + Irecv posted together (send first, as the proxy
        last = _last_compute(ops, 0)         # does), then Waitall: a zero-length op after both
        out = list(ops) + [Op(x, stream="pp.send", deps=last) for x in s]
        out += [Op(x, stream="pp.recv", deps=last) for x in r]
        posted = tuple(range(len(ops), len(out)))
        return tuple(out + [Op(Compute(f"wait.{tag}", 0.0, kind="elementwise", seconds=0.0),
                               deps=posted)])
    k = len(r)
    out = [Op(x, stream="pp") for x in r]
    for i, op in enumerate(ops):   # shift deps past the receive; the first op waits for it
        deps = tuple(d + k for d in op.deps) + ((0,) if k and i == 0 else ())
        out.append(Op(op.payload, op.stream, deps, op.repeat))
    last = _last_compute(ops, k)
    return tuple(out + [Op(x, stream="pp", deps=last) for x in s])


def _last_compute(ops: tuple[Op, ...], shift: int) -> tuple[int, ...]:
    """``(index + shift,)`` of the last compute op of ``ops``, or ``()`` when there is none."""
    idx = [i for i, op in enumerate(ops) if isinstance(op.payload, Compute)]
    return (idx[-1] + shift,) if idx else ()


def _stage_blocks(cfg: RunConfig, stage: int) -> dict[str, Block]:
    m, p, t = cfg.model, cfg.parallel, cfg.train
    st = _Stage(cfg, stage)
    nbytes, paired = p2p_bytes(cfg), m.stage_exchange == "paired"
    prev = None if st.first else -1
    nxt = None if st.last else +1
    n_mb = cfg.num_microbatches
    plain = _ops(st.backward_units())               # a micro-batch after the step's first
    units = st.backward_units(first=n_mb == 1)      # the last one (the first too when alone)
    grads, ready, issue = stage_buckets(cfg, stage)
    overlap = cfg.software.overlap_grad_reduce and cfg.dp > 1
    synced = backward_with_buckets(units, ready, grads, "dp", True) if overlap else _ops(units)
    blocks = {"F": Block("F", "forward", _exchange(st.forward(), prev, nxt, nbytes, "act", paired)),
              "B": Block("B", "backward", _exchange(plain, nxt, prev, nbytes, "grad", paired)),
              "B.sync": Block("B.sync", "backward",
                              _exchange(synced, nxt, prev, nbytes, "grad", paired))}
    if has_first_block(cfg):
        first = _ops(st.backward_units(first=True))
        blocks["B.first"] = Block("B.first", "backward",
                                  _exchange(first, nxt, prev, nbytes, "grad", paired))
    update: list[Op] = []
    if cfg.dp > 1 and not overlap:
        update += backward_with_buckets([], issue, grads, "dp", False)
    if m.tie_word_embeddings and p.pp > 1 and (st.first or st.last):
        # the word embeddings' two copies' gradients, all-reduced before the step
        # (ddlsim/workloads/decoder/tied_embedding.py; in the gradients' dtype, as the buckets)
        nbytes = DTYPE_BYTES[t.dtype] * m.vocab_size * m.hidden_size
        update.append(Op(Collective(OP_NAME, "all_reduce", GROUP, nbytes)))
    if m.compute == "model":
        n = sum(m.stage_tensors(stage, p.pp))
        k = 10.0 if t.optimizer == "adam" else 4.0
        update.append(Op(Compute("optimizer", k * n, 32.0 * n, kind="optimizer", dtype="fp32")))
    blocks["update"] = Block("update", "optimizer", tuple(update))
    return blocks


def _ops(units: list[BackwardUnit]) -> tuple[Op, ...]:
    """The ops of ``units`` in order, without gradient all-reduces."""
    return tuple(Op(c) for u in units for c in u.ops)


def has_first_block(cfg: RunConfig) -> bool:
    """Whether the step's first micro-batch has a backward of its own (``B.first``): its
    gradients start the step's rather than join them (``model.grad_accumulation``)."""
    return cfg.model.grad_accumulation != "none" and cfg.num_microbatches > 1


def build_bert(cfg: RunConfig) -> Workload:
    """The trace of one iteration of ``cfg`` (one rank class per pipeline stage)."""
    m, t, p, mesh = cfg.model, cfg.train, cfg.parallel, cfg.mesh
    n_mb = cfg.num_microbatches
    pipes = mesh.groups("pp")                   # row: one pipeline; column s: stage s
    classes = []
    for stage in range(p.pp):
        order = schedule(p.schedule, stage, p.pp, n_mb)
        last_b = max(i for i, (kind, _, _) in enumerate(order) if kind == "B")
        first = has_first_block(cfg)
        steps = tuple(Step("B.sync" if i == last_b else
                           "B.first" if first and kind == "B" and mb == 0 else kind, mb)
                      for i, (kind, mb, _) in enumerate(order)) + (Step("update"),)
        blocks = _stage_blocks(cfg, stage)
        program = Program(blocks, _first_touch(cfg, blocks, steps))
        classes.append(RankClass(f"stage{stage}", tuple(int(r) for r in pipes[:, stage]),
                                 program))
    meta = WorkloadMeta(model=m.name, architecture="bert", samples=t.global_batch_size,
                        tokens=t.global_batch_size * t.seq_length,
                        model_flops=model_flops(m, 3.0 * m.forward_flops(t.seq_length)
                                                * t.global_batch_size),
                        dtype=t.dtype, parameter_count=m.params, microbatches=n_mb)
    groups = mesh.families()
    if m.tie_word_embeddings and p.pp > 1:   # the word embeddings' first and last stages
        groups[GROUP] = family_of(pipes)
    return Workload(f"{m.name}-pp{p.pp}-dp{cfg.dp}", mesh.world_size, groups,
                    tuple(classes), meta)


def _first_touch(cfg: RunConfig, blocks: dict[str, Block], steps: tuple[Step, ...]
                 ) -> tuple[Step, ...]:
    """``steps`` with the iteration's first receive in a block of its own (``NAME.touch``,
    added to ``blocks``) that first touches the fresh receive buffer after the exchange's
    wait (``recv_buffers: fresh``, :mod:`..freshbuffers`); ``steps`` as they are when nothing
    is charged."""
    op = first_touch_op(cfg, p2p_bytes(cfg), "recv") if cfg.model.recv_buffers == "fresh" \
        else None
    if op is None:
        return steps
    for i, step in enumerate(steps):
        ops = blocks[step.block].ops
        if any(isinstance(o.payload, P2P) and o.payload.kind == "recv" for o in ops):
            name = f"{step.block}.touch"
            wait = max(j for j, o in enumerate(ops) if o.name.startswith("wait."))
            blocks[name] = insert_after(blocks[step.block], wait, op, name)
            return steps[:i] + (Step(name, step.microbatch),) + steps[i + 1:]
    return steps


def bert_memory(cfg: RunConfig) -> list[MemoryBreakdown]:
    """Per stage: model states and the activations of the micro-batches in flight, each layer
    keeping ``s·b·h·(34 + 5·a·s/h)`` bytes at 16 bits (Korthikanti et al. 2022, eq. 1; scaled
    by the dtype's width / 2)."""
    m, t, p = cfg.model, cfg.train, cfg.parallel
    b, s, h, a = t.micro_batch_size, t.seq_length, m.hidden_size, m.num_attention_heads
    layer = s * b * h * (34 + 5 * a * s / h) * DTYPE_BYTES[t.dtype] / 2
    out = []
    for stage in range(p.pp):
        n = sum(m.stage_tensors(stage, p.pp))
        w, g, o = model_state_bytes(n, cfg.dp, p.zero_stage, t.dtype, t.optimizer)
        acts = layer * (m.num_hidden_layers // p.pp) * inflight_chunks(cfg, stage)
        logits = (DTYPE_BYTES[t.dtype] * b * m.mlm_tokens(s) * m.vocab_size
                  if stage == p.pp - 1 else 0.0)
        out.append(MemoryBreakdown(w, g, o, acts, logits, cfg.system.device.memory_bytes, stage))
    return out
