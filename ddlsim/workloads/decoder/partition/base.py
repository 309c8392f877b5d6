"""The layer-partitioner interface, and the layer template every scheme fills in.

A decoder layer is four GEMMs ``(M, N, K)`` over the ``M = b·s/cp`` tokens of one
micro-batch on one context-parallel rank (``qkv``: ``N = ad + 2gd``, ``K = h``; ``proj``:
``N = h``, ``K = ad``; ``fc1``: ``N = (m−1)·f``, ``K = h``; ``fc2``: ``N = h``, ``K = f``,
``m`` = 3 for a gated MLP), the attention core between ``qkv`` and ``proj``, and elementwise
work (norms, residuals, dropout, the non-linearity, softmax). A scheme says how one GEMM runs
on its grid (:meth:`LayerPartitioner.gemm_forward`, :meth:`~LayerPartitioner.gemm_backward`)
and over how many ranks weights and activations are split; the template below strings the
GEMMs into a layer's forward and backward. The attention core never communicates inside the
tensor-parallel grid (every scheme splits heads over one grid axis and the batch over the
others); across the ``cp`` axis it is a ring or an all-gather (:mod:`.context`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from ....simulator.kernels.attention import attention_kernels
from ....simulator.kernels.dtensor import regathers_input
from ....simulator.kernels.elementwise import layer_elementwise_kernels
from ....simulator.kernels.elementwise_backward import layer_elementwise_backward_kernels
from ..layerkinds import attention_projections
from ...trace import Compute, Kernel, Loop, Op, Wait
from . import context
from .embedding_head import EmbeddingHeadOps
from .oplist import OpList

__all__ = ["LayerPartitioner"]


class LayerPartitioner(EmbeddingHeadOps):
    """How one scheme splits a decoder layer over its grid (subclasses register a ``mode``);
    the embedding's and the head's ops are :class:`.embedding_head.EmbeddingHeadOps`'.

    Parameters
    ----------
    plan : DecoderPlan
        The run's resolved plan (:func:`..plan.resolve_plan`): the grid
        (``tensor_parallel``, ``tp``), the cp axis, the micro-batch, the dtypes, recomputation
        and the software stack; the model's closed-form counts are ``plan.shape``. A
        partitioner reads the plan and nothing else of the run.
    """

    mode: ClassVar[str] = ""
    #: grid fields of ``parallel.tensor_parallel`` the scheme takes
    grid_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, plan: Any):
        self.plan, self.shape, self.spec = plan, plan.shape, plan.tensor_parallel
        #: the software stack (:class:`~ddlsim.software.Software`)
        self.sw = plan.software
        self.size = plan.tp
        self.cp, self.cp_comm = plan.cp, plan.cp_comm
        self.b, self.s = plan.micro_batch, plan.seq_length
        self.dtype = plan.dtype                 # FP8: only the linear GEMMs run in FP8
        self.dt = plan.dtype_bytes
        self.recompute = plan.recompute

    # ------------------------------------------------------------------ the grid
    @classmethod
    def check_grid(cls, spec: Any) -> None:
        """``spec`` gives exactly the grid fields of the scheme (ValueError otherwise)."""
        given = [k for k in ("size", "q", "d") if getattr(spec, k) is not None]
        extra = [k for k in given if k not in cls.grid_keys]
        missing = [k for k in cls.grid_keys if getattr(spec, k) is None]
        if extra or missing:
            raise ValueError(f"tensor_parallel.mode = {cls.mode!r} takes the grid field(s) "
                             f"{', '.join(cls.grid_keys)}; missing: {missing or 'none'}, not "
                             f"applicable: {extra or 'none'} (e.g. {cls.example()})")

    @classmethod
    def example(cls) -> str:
        return "{mode: " + cls.mode + ", " + ", ".join(f"{k}: 4" for k in cls.grid_keys) + "}"

    @classmethod
    def grid_size(cls, spec: Any) -> int:
        """Ranks of the grid: the size of the ``tp`` mesh axis."""
        raise NotImplementedError

    def families(self, mesh: Any) -> dict:
        """Group families of the grid's axes (besides the mesh's ``tp``, ``cp``, …)."""
        return {}

    @classmethod
    def check(cls, spec: Any, shape: Any, micro_batch: int) -> None:
        """Divisibility of the model and batch by the grid (ValueError, one paragraph).

        Parameters
        ----------
        spec : TensorParallelSpec
            The grid (``parallel.tensor_parallel``).
        shape : DecoderShape
            The model's closed-form counts.
        micro_batch : int
            Sequences per micro-batch (``train.micro_batch_size``).
        """

    #: ranks over which a layer's weights are split
    param_split: int = 1
    #: streams of weight-gradient reductions, joined before the gradients are accumulated
    grad_streams: tuple[str, ...] = ()

    @property
    def structured(self) -> bool:
        """Whether the builder takes its layers from :meth:`layer_forward` (always, except
        Megatron 1-D without context parallelism, which keeps the builder's own ops)."""
        return True

    @property
    def tokens(self) -> float:
        """``M``: tokens of one micro-batch on one cp rank, the rows of every layer GEMM."""
        return self.b * self.s / self.cp

    def ew_split(self) -> tuple[int, bool]:
        """``(t, sp)`` for DecoderShape's elementwise and activation counts: the 2-D family
        splits every activation over the grid, i.e. as 1-D with sequence parallelism."""
        return self.size, True

    # ------------------------------------------------------------------ one GEMM
    def gemm_op(self, name: str, M: float, N: float, K: float) -> Compute:
        """One local GEMM ``[M,K]·[K,N]`` as an op carrying its shape (the kernel model;
        the linear layers run in the training dtype, FP8 included)."""
        return Compute(name, 2 * M * N * K, dtype=self.dtype,
                       kernels=(Kernel("gemm", (M, N, K), dtype=self.plan.train_dtype),))

    def weight_grad_op(self, name: str, M: float, N: float, K: float) -> Compute:
        """A weight gradient's local GEMM that produces the rank's whole gradient shard (no
        partial product left to reduce): it accumulates into ``main_grad`` as the stack's
        fused weight-gradient GEMMs do (:func:`..wgrad.accumulating`), else :meth:`gemm_op`."""
        from ..wgrad import accumulating, main_grad_bytes
        op = self.gemm_op(name, M, N, K)
        mg = main_grad_bytes(self.sw, self.plan.train_dtype)
        return replace(op, kernels=(accumulating(op.kernels[0], mg),)) if mg else op

    def core_kernels(self, backward: bool) -> tuple | None:
        """The attention core's kernels on this rank (``software.attention``), or None
        under context parallelism (its steps take :meth:`cp_core_kernels`)."""
        if self.cp > 1:
            return None
        sh = self.shape
        return attention_kernels(self.sw.attention, self.b, sh.heads / self.size,
                                 self.s, sh.d, self.dt, sh.dropout, backward, self.dtype,
                                 kv_heads=sh.g / self.size,
                                 softmax_fp32=self.sw.softmax_in_fp32,
                                 softmax_dispatch=self.sw.softmax_dispatch,
                                 window=sh.sliding_window, window_share=sh.window_share,
                                 sinks=sh.attention_sinks)

    def cp_core_kernels(self, backward: bool, step: int | None = None) -> tuple | None:
        """Under context parallelism, the fused attention kernels of ring step ``step`` of
        cp rank 0, or with ``step`` None of its all-gather core, at the shapes the stack
        launches them (docs/tensor_parallel.md, "Context parallelism"). None for the unfused
        paths (the ring steps keep the FLOPs roofline).

        The rank holds chunks ``0`` and ``2cp − 1`` of ``c = s/(2cp)`` tokens each
        (``get_batch_on_this_cp_rank``). Ring (TransformerEngine ``AttnFuncWithCPAndKVP2P``;
        torch ``_templated_ring_attention``): step 0 is one causal call of its ``2c`` queries
        on its ``2c`` keys; a later step ``i`` of rank ``r`` is one unmasked call, of all
        ``2c`` queries on the first key chunk when ``i <= r``, else of the second query chunk
        on both key chunks. Rank 0 takes the latter at every step, the shorter query length
        of the two (the other ranks' steps do the same FLOPs). All-gather (TE
        ``AttnFuncWithCPAndKVAllGather``): one causal call per query chunk ``k`` on the
        gathered keys ``0 … (k+1)c`` (bottom-right mask), ``(c, c)`` and ``(c, s)`` on rank 0.
        torch's ring (``software.cp_attention: torch``, either rotation) takes the ring's
        steps (:mod:`.torch_cp`).
        """
        from ....simulator.kernels.attention import FLASH_KINDS
        if self.sw.attention not in FLASH_KINDS:
            return None
        c = self.s / (2 * self.cp)
        if step is None:
            calls = ((c, c, True), (c, self.s, True))
        elif step == 0:
            calls = ((2 * c, 2 * c, True),)
        else:
            calls = ((c, 2 * c, False),)
        sh = self.shape
        return tuple(k for s_q, s_k, causal in calls for k in attention_kernels(
            self.sw.attention, self.b, sh.heads / self.size, s_q, sh.d, self.dt,
            sh.dropout, backward, self.dtype, causal=causal, s_k=s_k, sinks=sh.attention_sinks))

    def gemm_forward(self, ops: OpList, name: str, M: float, N: float, K: float,
                     row_parallel: bool) -> None:
        """Append the ops of ``C[M,N] = A[M,K]·B[K,N]`` (``row_parallel``: Megatron's
        RowParallelLinear, i.e. ``proj`` and ``fc2``; only 1-D needs it)."""
        raise NotImplementedError

    def gemm_backward(self, ops: OpList, name: str, M: float, N: float, K: float,
                      row_parallel: bool) -> None:
        """Append the ops of ``dA = dC·Bᵀ`` and ``dB = Aᵀ·dC``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the layer template
    def _gemms(self, backward: bool) -> list[tuple[str, float, float, bool]]:
        sh = self.shape
        mlp = [("fc1", (sh.mlp_matrices - 1) * sh.ffn, sh.hidden, False),
               ("fc2", sh.hidden, sh.ffn, True)]
        before, after = attention_projections(sh)   # the fused QKV, or MLA's four
        attn = [*before, *after]
        return list(reversed(attn + mlp)) if backward else attn + mlp

    @property
    def _core_after(self) -> str:
        """The GEMM the attention core follows (``qkv``; MLA: ``kv_up``)."""
        return attention_projections(self.shape)[0][-1][0]

    def layer_forward(self, tag: str = "fwd", trim: bool = False) -> list[Op]:
        """One dense layer's forward: qkv, attention core, proj, fc1, fc2, elementwise;
        ``trim``: a recomputation that stops at the last tensor the backward saves
        (:mod:`..early_stop`: fc2's GEMM, its reduction and the last residual add left out)."""
        from .. import early_stop
        ops, M = OpList(), self.tokens
        for name, N, K, row in self._gemms(False):
            if trim and name == "fc2":
                early_stop.structured_fc2(self, ops, f"{tag}.{name}", M, N, K, row)
                continue
            self.gemm_forward(ops, f"{tag}.{name}", M, N, K, row)
            if name == self._core_after:
                context.attention_forward(self, ops, tag)
        ew = self.ew_kernels()
        if trim and ew is not None:
            ew = early_stop.structured_ew(self, ew)
        ops.add(Compute(f"{tag}.elementwise", 0.0, self.elementwise_bytes() if ew is None
                        else sum(k.bytes for k in ew), kind="elementwise", dtype=self.dtype,
                        kernels=ew))
        if tag != "fwd":
            return ops.ops
        from ..sac import forward_host          # torch's SAC policy on the host (..sac)
        return [replace(o, payload=p) if p is not o.payload else o for o, p in
                zip(ops.ops, forward_host([o.payload for o in ops.ops], self.sw, self.recompute))]

    def layer_backward(self, grad_accumulate_bytes: float) -> list[Op]:
        """One dense layer's backward after recomputation; ``grad_accumulate_bytes``: the
        traffic of adding its weight gradients into the fp32 buffer (the builder's rule)."""
        ops, M = OpList(), self.tokens
        if self.recompute == "full":
            from ..early_stop import trims_tail
            ops.extend(self.layer_forward("recompute", trims_tail(self.sw)))
        elif self.recompute == "selective" and self.plan.recompute_modules is not None:
            from ..recompute_modules import cp_norms_op
            norms = cp_norms_op(self)           # Megatron-Core's modules: the norms, the core
            if norms is not None:
                ops.add(norms)
            if "core_attn" in self.plan.recompute_modules:
                ops.add(self._recompute_core_op())
        elif self.recompute == "selective" and \
                self.sw.selective_recompute == "every_second_mm":
            ops.add(self._op_sac())
        elif self.recompute == "selective":
            ops.add(self._recompute_core_op())
        for name, N, K, row in self._gemms(True):
            if name == self._core_after:
                context.attention_backward(self, ops)
            self.gemm_backward(ops, f"bwd.{name}", M, N, K, row)
        ew = self.ew_kernels(backward=True)
        ops.add(Compute("bwd.elementwise", 0.0, 2 * self.elementwise_bytes() if ew is None
                        else sum(k.bytes for k in ew), kind="elementwise", dtype=self.dtype,
                        kernels=ew))
        for stream in self.grad_streams:
            ops.add(Wait(f"bwd.wait.{stream}", stream))
        ops.add(Compute("bwd.grad_accumulate", 0.0, grad_accumulate_bytes,
                        kind="elementwise", dtype=self.dtype))
        return ops.ops

    def _recompute_core_op(self) -> Compute:
        """Selective recomputation's attention core on this rank (Korthikanti et al. 2022
        §5): its forward FLOPs and scores traffic, its kernels where the scheme has them."""
        return Compute("recompute.attn_core", self.attn_core_flops(), self.scores_bytes(),
                       dtype=self.dtype, kernels=self.core_kernels(False))

    def layers(self, backward: bool, count: int, grad_accumulate_bytes: float,
               transform=None) -> Op:
        """``count`` identical layers as one :class:`Loop` op; ``transform(body)`` rewrites
        one layer's ops first (e.g. the TP overlap of :mod:`..tp_overlap`)."""
        body = (self.layer_backward(grad_accumulate_bytes) if backward
                else self.layer_forward())
        if transform is not None:
            body = transform(body)
        return Op(Loop("layers.bwd" if backward else "layers.fwd", tuple(body), count))

    def _op_sac(self) -> Compute:
        """torchtitan's op-level selective recomputation on this grid (:mod:`..sac`): the
        every-second mm of a 1-D rank over this rank's tokens, and the element-wise ops."""
        from ..sac import every_second_mm_op
        from ..layerkernels import layer_kernels
        if self.mode != "1d":
            from ....errors import ConfigError
            raise ConfigError(f"software.selective_recompute = 'every_second_mm' (torchtitan's "
                              f"op-level policy) is modelled for 1-D tensor parallelism; "
                              f"tensor_parallel.mode is {self.mode!r}: use recompute 'full' or "
                              "'none', or the 1-D scheme")
        plan = self.plan
        kernels = layer_kernels(self.shape, self.sw, self.b, self.s // self.cp,
                                self.size, plan.sp, plan.train_dtype,
                                regathers_input(self.sw, plan.recompute), plan.microbatches)
        return every_second_mm_op(self.shape, kernels, self.b, self.s // self.cp, self.size,
                                  self.dtype, plan.train_dtype, self.sw, plan.sp)

    # ------------------------------------------------------------------ per-rank counts
    def attn_core_flops(self) -> float:
        """Forward FLOPs of the attention core on one rank: ``4bs²·ad / (p·cp)`` (each rank
        holds ``1/p`` of the heads × batch and ``1/cp`` of the queries against all keys).
        The same in a dense and an MoE layer (asked as a dense one: a model whose first
        layers are dense has both kinds)."""
        return (self.shape.layer_gemm_flops(self.b, self.s, moe=False)["attn_core"]
                / (self.size * self.cp))

    def scores_bytes(self) -> float:
        """Selective recomputation's traffic on the rank's scores: softmax, mask (and
        dropout) read + write ``b·a·s²/(t·cp)`` (the builder's count, split over cp)."""
        t, _ = self.ew_split()
        passes = 3 if self.shape.dropout else 2
        return passes * 2 * self.b * self.shape.heads * self.s * self.s / t * self.dt / self.cp

    def ew_kernels(self, backward: bool = False) -> tuple | None:
        """The element-wise kernels of one layer on the rank's ``s/cp`` positions, or with
        ``backward`` their backward as torch's autograd runs it
        (:func:`~ddlsim.simulator.kernels.elementwise_backward.layer_elementwise_backward_kernels`,
        the same arguments: the 1-D builder's ``ew`` and ``bwd.ew``). None under context
        parallelism without FlashAttention, whose count keeps the ``s²`` scores passes in
        :meth:`elementwise_bytes`."""
        from ....simulator.kernels.attention import FLASH_KINDS
        if self.cp > 1 and self.sw.attention not in FLASH_KINDS:
            return None
        t, sp = self.ew_split()
        kernels = layer_elementwise_backward_kernels if backward else layer_elementwise_kernels
        return kernels(self.shape, self.b, self.s // self.cp, t, sp, self.dt, self.sw,
                       self.dtype)

    def elementwise_bytes(self) -> float:
        """Forward elementwise traffic of one layer on one rank: DecoderShape's count for
        ``s/cp`` tokens, with the scores term taken for ``s/cp`` queries × ``s`` keys."""
        sh, (t, sp) = self.shape, self.ew_split()
        s_loc = self.s // self.cp
        ew = sh.layer_elementwise_bytes(self.b, s_loc, t, sp, self.dt)
        if self.cp > 1:
            k = (3 if sh.dropout else 2) * 2 * self.b * sh.heads / t * self.dt
            ew += k * (self.s * self.s / self.cp - s_loc * s_loc)
        return ew

    def activation_bytes(self, recompute: str, moe: bool | None = None) -> float:
        """Activation bytes one layer keeps on one rank: Korthikanti et al.'s count with the
        scheme's split, divided by cp (every term, the ``s²`` scores included, holds
        ``1/cp`` of the queries)."""
        t, sp = self.ew_split()
        return self.shape.layer_activation_bytes(self.b, self.s, t, sp, recompute, moe=moe,
                                                 **self.plan.activation_kinds) / self.cp

    def kv_block_bytes(self) -> float:
        """K and V of one cp rank's sequence block on one grid rank: ``2·b·(s/cp)·gd / p``."""
        return 2 * self.tokens * self.shape.kv_width * self.dt / self.size
