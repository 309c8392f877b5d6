"""The Mixture-of-Experts parts of a decoder stage, as Megatron-Core runs them: the MoE
layer's ops (attention from the layer partitioner, router, token permutation, the token
dispatcher's collectives, the local experts' grouped GEMM, shared experts), parameters split
into expert and non-expert, and the update that reduces expert gradients over ``edp`` and the
rest over ``dp`` (ZeRO per group; these two in :mod:`.moe_update`). Mixed into
:class:`~ddlsim.workloads.decoder.builder.StageBuilder`; the attributes these methods read
(``shape``, ``part``, ``tp``, ``cp``, ``b``, ``s``, ``dt``, ``period``, ``moe``, …) are declared
in :class:`.stage.StageBase`, the options resolved by :mod:`.moeplan`; docs/moe.md derives
every size. One MoE layer's forward on one rank (alltoall dispatcher; Megatron-LM 9c1a5351
``token_dispatcher.py`` ``MoEAlltoAllTokenDispatcher.token_permutation`` /
``token_unpermutation``, ``moe_layer.py`` ``MoELayer.forward``):

1. attention (qkv, core, proj and its TP reduce-scatter/all-gather) from the partitioner,
   over the rank's ``T = b·s/(cp·tp)`` tokens (sequence parallel; ``b·s/cp`` at TP 1);
2. the router GEMM ``T × E`` and its other kernels (top-k, the load-balancing loss and its
   all-reduce over TP × CP: :mod:`.moe_router`); permutation 1 (``T`` tokens → ``T·k``
   copies, by expert);
3. dispatch all-to-all over ``ep`` (``T·k·h`` elements, × the capacity factor when padded;
   the hottest rank receives ``load`` × the mean: ``split_bytes``); all-gather over ``etp``;
4. permutation 2 (sort by local expert) when a rank holds several experts;
5. the experts: ``E/EP`` GEMMs of ``n`` tokens each, ``n = etp·ep·T·k/E × load``, widths
   ``f_e/etp``: one grouped GEMM launch (``batch = E/EP``), Transformer Engine's per-expert
   GEMMs on its streams (:mod:`.grouped_linear`), or one launch per expert;
6. the reverse: un-sort, reduce-scatter over ``etp``, combine all-to-all, un-permute;
7. shared experts (all-gather over TP, their GEMMs, reduce-scatter), after the routed experts
   or, with ``shared_expert_overlap``, beside the dispatch (the combine is not overlapped).
The allgather dispatcher instead all-gathers the ``T·h`` hidden states over ``tp_ep`` (etp ×
ep ranks), permutes the gathered tokens to the local experts, and reduce-scatters the output."""

from __future__ import annotations

from ...simulator.kernels.elementwise import layer_elementwise_parts
from ...simulator.kernels.elementwise_backward import layer_elementwise_backward_parts
from ...simulator.kernels.gemm import gemm_kernels_backward
from ..trace import Collective, Compute, Kernel, Loop, Op, Wait
from . import sequential_mlp, tp_overlap
from .fp8linear import with_fp8_casts
from .grouped_linear import te_grouped, te_grouped_experts
from .layerkinds import attention_projections
from .moe_activation import expert_activation_kernels
from .moe_dispatch import INDEX_ADD, alltoall_counts, flex_ops
from .moe_host import add_waits, dispatcher_host
from .moe_host_chain import HostChain, add_backward_dispatcher_host, add_backward_expert_host
from .moe_router import router_gemm, router_ops
from .partition import context
from .partition.oplist import OpList
from .stage import StageBase
from .wgrad import into_main_grad, main_grad_bytes

__all__ = ["MoEOps"]


class _MoECore:
    """The layer partitioner seen from an MoE layer: its attention core counts the MoE
    layer's FLOPs (a model of mixed dense and MoE layers must say which), all else is the
    partitioner's."""

    def __init__(self, part):
        self._part = part

    def __getattr__(self, name: str):
        return getattr(self._part, name)

    def attn_core_flops(self) -> float:
        p = self._part
        core = p.shape.layer_gemm_flops(p.b, p.s, moe=True)["attn_core"]
        return core / (p.size * p.cp)


class MoEOps(StageBase):
    """MoE layer ops and sizes of one pipeline stage (a mixin of ``StageBuilder``; the
    stage's expert parameters and update block: :class:`.moe_update.MoEUpdateOps`)."""

    # ------------------------------------------------------------------ MoE sizes
    def tokens(self) -> float:
        """``T``: tokens of one micro-batch the rank routes: ``b·s/cp``, ``/t`` with sequence
        parallelism (Megatron-Core's MoE layer takes the sequence-parallel shard)."""
        return self.b * self.s / self.cp / (self.tp if self.sp else 1)

    def expert_tokens(self) -> float:
        """``n``: tokens each local expert of the most loaded rank computes per micro-batch:
        the ``etp·ep`` ranks of its ``tp_ep`` group each send ``T·k/E``, times the plan's
        load (capacity, padding, hot rank: :attr:`.moeplan.MoEPlan.load`)."""
        sh = self.shape
        return self.etp * self.ep * self.tokens() * sh.top_k / sh.experts * self.moe.load

    @property
    def local_experts(self) -> int:
        return self.shape.experts // self.ep

    def a2a_bytes(self) -> float:
        """Bytes one rank sends in one dispatch (or combine) all-to-all, nccl-tests
        convention: ``T·k·h`` × dtype bytes, × the capacity factor when padded (every slot
        travels; Megatron-Core ``num_out_tokens = capacity·E``)."""
        sh = self.shape
        return self.tokens() * sh.top_k * sh.hidden * self.dt * self.moe.sent_factor

    def a2a_split(self, total: float) -> tuple[float, ...] | None:
        """Bytes to each EP member when one rank (member 0) is hot: ``load`` × the mean to
        it, the rest shared by the others; None when balanced."""
        plan, ep = self.moe, self.ep
        hot = plan.load / plan.sent_factor
        if hot == 1.0 or ep == 1:
            return None
        mean = total / ep
        rest = max(0.0, (ep - plan.imbalance) / (ep - 1)) * mean
        first = hot * mean
        return (first, *([rest] * (ep - 1)))

    def layer_rank_params(self, moe: bool) -> tuple[float, float]:
        """(non-expert, expert) parameters of one layer on one rank: the non-expert ones
        (attention, norms, router, shared experts) split over TP but MLA's down projections
        (whole: :meth:`~ddlsim.workloads.models.decoder.DecoderShape.tp_rank_params`), the
        routed experts over EP × expert TP."""
        sh, t = self.shape, self.tp
        if not moe:
            return sh.tp_rank_params(sh.dense_layer_params, t), 0.0
        experts = sh.experts * sh.mlp_params(sh.f_e)
        return sh.tp_rank_params(sh.moe_layer_params - experts, t), experts / (self.ep * self.etp)

    # ------------------------------------------------------------------ op pieces
    def _gemm(self, name: str, M: float, N: float, K: float, backward: bool,
              batch: int = 1, launches: int = 1, main_grad: int = 0) -> Compute:
        """``launches × batch`` local GEMMs ``[M,K]·[K,N]`` (backward: data and weight
        gradients, the weight gradients accumulating into a ``main_grad`` of ``main_grad``
        bytes per element, :mod:`.wgrad`) as one op with its kernels; the linear layers run in
        the training dtype."""
        shapes = gemm_kernels_backward(M, N, K) if backward else ((M, N, K),)
        k = tuple(Kernel("gemm", g, batch=batch, dtype=self.plan.train_dtype) for g in shapes)
        k = into_main_grad(k, main_grad) if backward else k
        return Compute(name, (4 if backward else 2) * M * N * K * batch * launches,
                       dtype=self.dtype, kernels=k * launches)

    def _memory(self, name: str, nbytes: float, variant: str = "") -> Compute:
        return Compute(name, 0.0, nbytes, kind="elementwise", dtype=self.dtype,
                       kernels=(Kernel("memory", bytes=nbytes, dtype=self.dtype,
                                       variant=variant),))

    def _permute_bytes(self, unpermute: bool) -> float:
        """Traffic of permutation 1 (or un-permutation) of the ``T`` tokens into their
        ``T·k`` routed copies: fused, one kernel reading one side and writing the other
        (``(T + T·k')·h``); unfused, a gather of the copies (read + write ``T·k'·h``) and, to
        un-permute, the probabilities' product (read + write) and a scatter-add back to
        ``T`` (Megatron-Core ``moe_utils.permute``/``unpermute``, ``fused`` or not).
        ``k' = k ×`` the padding factor."""
        T, h = self.tokens(), self.shape.hidden
        copies = T * self.shape.top_k * self.moe.sent_factor
        if self.moe.permute_fusion:
            return (T + copies) * h * self.dt
        return (2 * copies + (2 * copies + copies + T if unpermute else 0)) * h * self.dt

    def _sort_bytes(self) -> float:
        """Permutation 2 (sort the received tokens by local expert): read + write them; none
        with one local expert."""
        if self.local_experts == 1:
            return 0.0
        return 2 * self.local_experts * self.expert_tokens() * self.shape.hidden * self.dt

    def _expert_compute(self, tag: str, backward: bool) -> list[Compute]:
        """The local experts: fc1 (``(m−1)·f_e/etp`` wide), the non-linearity, fc2; one
        grouped launch of ``E/EP`` problems or one launch per expert."""
        sh, n, e = self.shape, self.expert_tokens(), self.local_experts
        f = sh.f_e / self.etp
        batch, launches = (e, 1) if self.moe.grouped_gemm else (1, e)
        act = expert_activation_kernels(sh, e * n * f, self.dt, self.dtype, backward)
        pre = "bwd" if backward else tag
        fc1 = (n, (sh.mlp_matrices - 1) * f, sh.hidden)
        fc2 = (n, sh.hidden, f)
        gemms = [self._experts_linear(f"{pre}.experts.fc1", fc1, backward, batch, launches),
                 Compute(f"{pre}.experts.act", 0.0, sum(k.bytes for k in act),
                         kind="elementwise", dtype=self.dtype, kernels=act),
                 self._experts_linear(f"{pre}.experts.fc2", fc2, backward, batch, launches)]
        return gemms[::-1] if backward else gemms

    def _experts_linear(self, name: str, shape: tuple, backward: bool, batch: int,
                        launches: int) -> Compute:
        """One linear of the local experts (fc1 or fc2, GEMM ``shape`` per expert) with its
        FP8 casts; a grouped launch on a stack whose grouped GEMM is Transformer Engine's
        multi-stream GroupedLinear as its rounds of per-expert GEMMs (:mod:`.grouped_linear`).
        The weight gradients accumulate into ``main_grad`` where the stack fuses it, except
        in the legacy ``GroupedMLP``'s one grouped launch (:mod:`.wgrad`)."""
        legacy = self.moe.grouped_gemm and not self.moe.gemm_streams
        mg = 0 if legacy else main_grad_bytes(self.sw, self.plan.train_dtype)
        op = with_fp8_casts(self._gemm(name, *shape, backward, batch, launches, mg), self.sw,
                            *shape, backward, batch, launches, mg, self.plan.microbatches)
        if batch > 1 and self.moe.gemm_streams:
            op = te_grouped(self, op, batch, backward)
        return op

    def _shared(self, tag: str, backward: bool) -> list[Compute | Collective]:
        """Shared experts (Megatron-Core ``SharedExpertMLP``): TP-split like a dense MLP over
        the micro-batch's ``b·s/cp`` tokens: all-gather the sequence shard, fc1, fc2,
        reduce-scatter (sequence parallel), or an all-reduce of the output without it."""
        sh = self.shape
        if not sh.shared_experts:
            return []
        M, t, f = self.b * self.s / self.cp, self.tp, sh.shared_experts * sh.f_s
        pre = "bwd" if backward else tag
        mg = main_grad_bytes(self.sw, self.plan.train_dtype)     # TE linears (.wgrad)
        comp = [self._gemm(f"{pre}.shared.fc1", M, (sh.mlp_matrices - 1) * f / t, sh.hidden,
                           backward, main_grad=mg),
                self._gemm(f"{pre}.shared.fc2", M, sh.hidden, f / t, backward, main_grad=mg)]
        act = self.act_bytes / self.cp
        if t == 1:
            return comp
        if self.sp:
            return [Collective(f"{pre}.shared.ag", "all_gather", "tp", act), *comp,
                    Collective(f"{pre}.shared.rs", "reduce_scatter", "tp", act)]
        return [*comp, Collective(f"{pre}.shared.ar", "all_reduce", "tp", act)]

    def _dispatch(self, name: str, combine: bool) -> list[Collective]:
        """The alltoall dispatcher's collectives of one direction: all-to-all over ``ep``
        (the hot member's share as ``split_bytes``), then all-gather over ``etp`` of the
        received tokens (combine: reduce-scatter first, then the all-to-all back)."""
        out: list[Collective] = []
        if self.ep > 1:
            split = self.a2a_split(self.a2a_bytes())
            total = sum(split) if split else self.a2a_bytes()   # less what capacity drops
            out.append(Collective(name, "all_to_all", "ep", total, split_bytes=split,
                                  split_by="sender" if combine and split else "receiver"))
        if self.etp > 1:
            rows = self.local_experts * self.expert_tokens() * self.shape.hidden * self.dt
            op = "reduce_scatter" if combine else "all_gather"
            group = "etp" if self.split_experts else "tp"   # etp = tp, one layout
            coll = Collective(f"{name}.{'rs' if combine else 'ag'}", op, group, rows)
            out = [coll, *out] if combine else [*out, coll]
        return out

    def _gathered(self, name: str, combine: bool) -> list[Collective]:
        """The allgather dispatcher: the ``T·h`` hidden states all-gathered over ``tp_ep``
        (combine: the output reduce-scattered back)."""
        n = self.etp * self.ep
        if n == 1:
            return []
        nbytes = n * self.tokens() * self.shape.hidden * self.dt
        group = "tp_ep" if self.split_experts else "tp"   # ep 1, etp = tp: one layout
        return [Collective(name, "reduce_scatter" if combine else "all_gather", group, nbytes)]

    # ------------------------------------------------------------------ the MoE layer
    def _attention(self, ops: OpList, tag: str, backward: bool) -> None:
        """qkv, the attention core (ring or all-gather over ``cp``) and proj, from the layer
        partitioner, as a dense layer has them; with the plan's TP overlap, as Transformer
        Engine's linears run it (:func:`.tp_overlap.attention_slice`)."""
        part, M = _MoECore(self.part), self.part.tokens
        att = OpList() if self.plan.tp_overlap else ops
        # the fused QKV and proj, or MLA's four projections and its a·d_v output (.layerkinds)
        before, after = attention_projections(self.shape)
        if backward:
            for name, N, K, row in reversed(after):
                part.gemm_backward(att, f"bwd.{name}", M, N, K, row)
            context.attention_backward(part, att)
            for name, N, K, row in reversed(before):
                part.gemm_backward(att, f"bwd.{name}", M, N, K, row)
        else:
            for name, N, K, row in before:
                part.gemm_forward(att, f"{tag}.{name}", M, N, K, row)
            context.attention_forward(part, att, tag)
            for name, N, K, row in after:   # proj's g feeds the next layer (the MoE's is own)
                part.gemm_forward(att, f"{tag}.{name}", M, N, K, row, ends_layer=True)
        if att is not ops:
            ops.extend(tp_overlap.attention_slice(self, backward, att.ops))

    def _attn_elementwise(self, name: str, backward: bool) -> Compute:
        """The layer's non-MLP element-wise ops (its two norms, residual connections, rotary
        embedding, query and key norms) on the rank's ``s/cp`` positions, forward (or
        ``backward``), as one op ``name``: a dense layer's kernels but its MLP activation, by
        the dense builder's own functions and arguments
        (:func:`~ddlsim.simulator.kernels.elementwise.layer_elementwise_parts`,
        :func:`~ddlsim.simulator.kernels.elementwise_backward.layer_elementwise_backward_parts`:
        the stack's fused or unfused kernels, torch's autograd backward); the MoE block's own
        passes (permutation, the experts' activation) are its ops', the softmax the attention
        core's."""
        make = layer_elementwise_backward_parts if backward else layer_elementwise_parts
        parts = make(self.shape, self.b, self.s // self.cp, self.tp, self.sp, self.dt,
                     self.sw, self.dtype)
        kernels = sum((k for op, k in parts.items() if op != "activation"), ())
        return Compute(name, 0.0, sum(k.bytes for k in kernels), kind="elementwise",
                       dtype=self.dtype, kernels=kernels)

    def _beside(self, ops: OpList, comm: list[Collective], work: list,
                issued: tuple[int, ...] = ()) -> None:
        """``comm`` on the ``ep`` stream while ``work`` (the shared experts) computes, then
        joined (``shared_expert_overlap``); in order on the compute stream otherwise.
        ``issued``: deps of the first collective (the host's issue after a wait,
        :mod:`.moe_host`)."""
        if not work or not comm or not self.moe.shared_expert_overlap:
            for j, x in enumerate((*comm, *work)):
                ops.add(x, deps=issued if j == 0 else ())
            return
        prev = ops.last_compute()
        for j, c in enumerate(comm):
            deps = (() if prev is None else (prev,)) + (issued if j == 0 else ())
            prev = ops.add(c, "ep", deps)
        for x in work:
            ops.add(x)
        ops.add(Wait("moe.dispatch.wait", "ep"))

    def _moe_block(self, ops: OpList, tag: str, backward: bool) -> None:
        """Router, permutation, dispatch, experts, combine, un-permutation and shared experts
        of one MoE layer (backward: the same in reverse, each collective's gradient its
        mirror)."""
        sh, plan = self.shape, self.moe
        pre = "bwd" if backward else tag
        router = router_gemm(self, pre, backward)
        shared = self._shared(tag, backward)
        overlap = plan.shared_expert_overlap
        sort = self._sort_bytes()
        sorts = (sort, sort)
        if plan.dispatcher == "alltoall":
            first = self._dispatch(f"{pre}.{'combine' if backward else 'dispatch'}", False)
            second = self._dispatch(f"{pre}.{'dispatch' if backward else 'combine'}", True)
            perm = (self._permute_bytes(backward), self._permute_bytes(not backward))
        elif plan.dispatcher == "flex":   # permuted after the dispatch kernel (.moe_dispatch)
            first, second, sorts = flex_ops(self, pre, backward)
            perm = (0.0, 0.0)
        else:
            first = self._gathered(f"{pre}.gather", False)
            second = self._gathered(f"{pre}.scatter", True)
            rows = 2 * self.local_experts * self.expert_tokens() * sh.hidden * self.dt
            perm = (rows, 2 * rows)
        waits = dispatcher_host(plan)                # the host's side (.moe_host), or None
        host = None if backward else waits
        routed = None
        if not backward:                             # the GEMM, then top-k and the loss
            counts = alltoall_counts(self, pre) if plan.dispatcher == "alltoall" else []
            for x in (*router, *router_ops(self, pre, False), *counts):
                routed = ops.add(x)
        if perm[0]:
            ops.add(self._memory(f"{pre}.permute", perm[0]))
        issued = add_waits(ops, pre, host, "router", routed, self.dtype)
        self._beside(ops, first, shared if overlap else [], issued)
        issued = add_waits(ops, pre, host, "dispatch", len(ops.ops) - 1 if first else routed,
                           self.dtype)
        te_experts = te_grouped_experts(self)
        chain = HostChain(ops, pre, host, self.dtype, te_experts)   # after its last wait
        middle = [self._memory(f"{pre}.sort", sorts[0])] if sorts[0] else []
        middle += self._expert_compute(tag, backward)
        middle += [self._memory(f"{pre}.unsort", sorts[1])] if sorts[1] else []
        middle += second
        if perm[1]:     # backward, unfused alltoall: the gather's backward is an index_add_
            scatter = backward and plan.dispatcher == "alltoall" and not plan.permute_fusion
            middle.append(self._memory(f"{pre}.unpermute", perm[1],
                                       INDEX_ADD if scatter else ""))
        sequential = host is not None and not self.moe.grouped_gemm   # SequentialMLP
        gate: tuple[int, ...] = ()
        for j, x in enumerate(middle):
            ops.add(x, deps=(issued if j == 0 else ()) + chain.issue(x.name) + gate)
            rest = sequential and x.name == f"{pre}.experts.fc2" and \
                sequential_mlp.forward_rest(pre, self.local_experts, self.dtype)
            # the other experts' linear modules: what follows the experts waits for them
            gate = (ops.add(rest, "host"),) if rest else ()
        chain.finish()                               # to the next layer's wait
        if backward:
            add_backward_dispatcher_host(ops, plan, self.dtype)   # measured (.moe_host_chain)
            if waits is not None and not self.moe.grouped_gemm:
                sequential_mlp.add_backward_host(ops, self.local_experts, self.dtype)
            if te_grouped_experts(self) and main_grad_bytes(
                    self.sw, self.plan.train_dtype):      # TE GroupedLinear, main_grad fused
                add_backward_expert_host(ops, self.local_experts, self.dtype)
            for x in (*router_ops(self, pre, True), *router):
                ops.add(x)
        if not overlap:
            for x in shared:
                ops.add(x)

    def moe_layer_body(self, backward: bool, tag: str = "fwd") -> list[Op]:
        """One MoE layer's forward (or backward, after recomputation) on this rank, as ops
        with their streams (a :class:`~ddlsim.workloads.trace.Loop` body)."""
        ops = OpList()
        if not backward:
            self._attention(ops, tag, False)
            self._moe_block(ops, tag, False)
            ops.add(self._attn_elementwise(f"{tag}.elementwise", False))
            return ops.ops
        recompute = self.plan.recompute
        if recompute == "full":
            ops.extend(self.moe_layer_body(False, "recompute"))
        elif recompute == "selective":
            g = self.shape.layer_gemm_flops(self.b, self.s, moe=True)
            ops.add(self._recompute_core(g, True))
        ops.add(self._attn_elementwise("bwd.elementwise", True))
        self._moe_block(ops, "bwd", True)
        self._attention(ops, "bwd", True)
        dense_p, expert_p = self.layer_rank_params(True)
        ops.add(Compute("bwd.grad_accumulate", 0.0, self.grad_accumulate_bytes(dense_p + expert_p),
                        kind="elementwise", dtype=self.dtype))
        return ops.ops

    def moe_layers(self, backward: bool, count: int) -> Op:
        """``count`` MoE layers as one loop op."""
        key = ("moe_layers", backward, count)
        return self.cached(key, lambda: Op(Loop("layers.moe.bwd" if backward else
                                                "layers.moe.fwd",
                                                tuple(self.moe_layer_body(backward)), count)))

    def moe_layer_payloads(self, backward: bool, tag: str = "fwd") -> list:
        """The MoE layer's ops as plain payloads in issue order (ZeRO-3's per-layer units,
        which run on one stream)."""
        return [o.payload for o in self.moe_layer_body(backward, tag)
                if not isinstance(o.payload, Wait) and o.stream != "host"]
