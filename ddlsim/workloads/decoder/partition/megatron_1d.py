"""Megatron-LM's 1-D tensor parallelism, today's builder's numbers exactly.

Shoeybi et al. 2019 ("Megatron-LM", arXiv:1909.08053, §3): ``qkv`` and ``fc1`` are split by
columns (ColumnParallelLinear), ``proj`` and ``fc2`` by rows (RowParallelLinear); the
``g`` operator all-reduces the ``b·s·h`` output of each row-parallel GEMM in the forward and
the ``f`` operator the input gradient of each column-parallel GEMM in the backward: per layer
two all-reduces of ``b·s·h`` forward and two backward. With sequence parallelism (Korthikanti
et al. 2022, arXiv:2205.05198, §4.2.2) each all-reduce becomes a reduce-scatter and an
all-gather of the same size. Weights and the head-split activations are divided by ``t``.

Without context parallelism the decoder builder keeps its own op lists
(:class:`~ddlsim.workloads.decoder.builder.StageBuilder`, Mixture-of-Experts layers included)
and takes only :meth:`Megatron1D.tp_comm` from here, so its predictions are unchanged; with
``cp > 1`` the layer is built from the partitioner template (qkv, ring, proj, MLP).
"""

from __future__ import annotations

from typing import Any

from ..fp8linear import fp8_sp_gather, linear_kernels
from ..layerkernels import logits_kernels, loss_op
from ....simulator.kernels.dtensor import regathers_input
from ....simulator.kernels.fp8_current import amax_allreduce
from ....simulator.kernels.step_passes import stack_cross_entropy
from ...trace import Collective, Compute, Kernel, Op
from ..wgrad import main_grad_bytes
from . import register_partitioner
from .base import LayerPartitioner
from .mla_1d import DOWN, UP, duplicated_gemm, gathers_latents, latent_backward, \
    latent_gathers, projection
from .oplist import OpList

__all__ = ["Megatron1D"]


@register_partitioner("1d")
class Megatron1D(LayerPartitioner):
    """1-D (Megatron) tensor parallelism over ``t = tensor_model_parallel_size`` ranks."""

    grid_keys = ("size",)

    def __init__(self, plan: Any):
        super().__init__(plan)
        self.sp = plan.sp
        self.param_split = self.size
        #: Transformer Engine gathers the FP8 tensors it quantized per shard under SP
        #: (:func:`..fp8linear.fp8_sp_gather`)
        self.fp8_gather = fp8_sp_gather(self.sw, plan.train_dtype, self.size, self.sp,
                                        self.shape)
        #: MLA's attention all-gathers its latents, not the hidden state (:mod:`.mla_1d`)
        self.latents = gathers_latents(self.shape, self.size, self.sp)

    @classmethod
    def grid_size(cls, spec: Any) -> int:
        return spec.size

    @property
    def structured(self) -> bool:
        return self.cp > 1

    def ew_split(self) -> tuple[int, bool]:
        return self.size, self.sp

    def tp_comm(self, name: str, nbytes: float, ends_layer: bool = False) -> list[Collective]:
        """Megatron's f/g operator on ``nbytes``: an all-reduce, or reduce-scatter +
        all-gather with sequence parallelism; nothing when ``t = 1``. The all-gather feeds a
        linear (a column-parallel input, or a row-parallel output gradient): under TE's FP8
        current scaling the amax all-reduce before it (:func:`~ddlsim.simulator.kernels.
        fp8_current.amax_allreduce`); in FP8 when the recipe quantizes before the gather
        (:meth:`gather_bytes`). ``ends_layer``: the operator after a layer's last linear,
        whose all-gather feeds the next layer's attention, which an MLA layer under
        sequence parallelism makes itself, of its latents (:mod:`.mla_1d`): the
        reduce-scatter alone there."""
        if self.size == 1:
            return []
        if self.sp:
            rs = Collective(f"{name}.rs", "reduce_scatter", "tp", nbytes)
            if ends_layer and self.latents:
                return [rs]
            return [rs, *self.gather(f"{name}.ag", nbytes)]
        return [Collective(f"{name}.ar", "all_reduce", "tp", nbytes)]

    def gather(self, name: str, nbytes: float) -> list[Collective]:
        """A sequence-parallel all-gather ``name`` of ``nbytes`` of 16-bit activations that
        feeds a linear, after the amax all-reduce of TE's FP8 current scaling where it runs
        one (:meth:`tp_comm`)."""
        return [*amax_allreduce(name, self.sw, self.plan.train_dtype, self.size, True),
                Collective(name, "all_gather", "tp", self.gather_bytes(nbytes))]

    def head_gather(self, nbytes: float) -> list[Collective]:
        """The all-gather of the final norm's ``nbytes`` output before the output layer, where
        the last layer (MLA under SP: :mod:`.mla_1d`) gathered no hidden state for it; none
        otherwise (the last layer's ``g`` did)."""
        return self.gather("head.ag", nbytes) if self.latents else []

    def _duplicated(self, kind: str) -> bool:
        """Whether projection ``kind`` is one MLA replicates over TP (:data:`.mla_1d.DOWN`)."""
        return self.shape.mla is not None and kind in DOWN

    def gather_bytes(self, nbytes: float) -> float:
        """Bytes of a sequence-parallel all-gather of ``nbytes`` of 16-bit activations that
        feeds a linear: 1 byte per element where Transformer Engine gathers the FP8 tensor it
        quantized on each shard (:func:`..fp8linear.fp8_sp_gather`; TransformerEngine v2.9
        ``distributed.py`` ``_all_gather_fp8`` gathers ``inp._data``; v1.8 gathers the FP8
        ``ln_out`` and ``grad_output_c``), else ``nbytes``."""
        return nbytes / self.dt if self.fp8_gather else nbytes

    def tp_comm_backward(self, name: str, nbytes: float) -> list[Collective]:
        """The backward's collectives of one column-parallel block on ``nbytes``: ``f``'s
        all-reduce, or with sequence parallelism its reduce-scatter and all-gather plus the
        all-gather that rebuilds the sequence-sharded input the forward saved, for the weight
        gradient (Korthikanti et al. 2022, §4.2.2; Megatron-LM
        ``LinearWithGradAccumulationAndAsyncCommunication.backward``): three per block; two
        where the stack saved the gathered input (DTensor TP, :func:`~ddlsim.simulator.
        kernels.dtensor.regathers_input`)."""
        comm = self.tp_comm(name, nbytes)
        if self.sp and comm and regathers_input(self.sw, self.plan.recompute):
            comm.insert(0, Collective(f"{name}.ag.input", "all_gather", "tp",
                                      self.gather_bytes(nbytes)))
        return comm

    def _shape(self, M: float, N: float, K: float, row_parallel: bool) -> tuple:
        """The rank's GEMM: ``K`` split over ``t`` (row-parallel) or ``N`` (column-parallel)."""
        t = self.size
        return (M, N, K / t) if row_parallel else (M, N / t, K)

    def _kernels(self, shape3: tuple, backward: bool, row_parallel: bool) -> tuple[Kernel, ...]:
        """The rank's GEMMs of one linear, in FP8 with the recipe's casts (:mod:`..fp8linear`):
        a column-parallel forward's input amax comes from TE's fused norm; under SP the
        column-parallel input and the row-parallel output gradient are all-gathered, which
        Transformer Engine quantizes per shard (:func:`..fp8linear.fp8_sp_gather`)."""
        gathered = ("g" if row_parallel else "x") if self.fp8_gather else ""
        return self.linear_kernels(shape3, backward, not (backward or row_parallel), gathered)

    def linear_kernels(self, shape3: tuple, backward: bool, norm_fed: bool,
                       gathered: str = "") -> tuple[Kernel, ...]:
        """The kernels of the rank's GEMM ``shape3`` in the plan's dtype and recipe
        (:func:`..fp8linear.linear_kernels`): ``norm_fed``, its FP8 input's amax taken by the
        norm before it; ``gathered``, the tensor Transformer Engine gathers in FP8."""
        return linear_kernels(self.sw, self.plan.train_dtype, *shape3, backward,
                              norm_amax=norm_fed, gathered=gathered, shards=self.size,
                              main_grad=main_grad_bytes(self.sw, self.plan.train_dtype),
                              microbatches=self.plan.microbatches)

    def gemm_forward(self, ops: OpList, name: str, M: float, N: float, K: float,
                     row_parallel: bool, ends_layer: bool = False) -> None:
        """The GEMM, then ``g`` after a row-parallel one (``ends_layer``: after a layer's last
        linear, :meth:`tp_comm`; a dense layer's ``fc2`` always is). MLA's down projections
        run whole on the rank's own tokens, its up projections after their latents'
        gathers (:mod:`.mla_1d`)."""
        kind = projection(name)
        if self._duplicated(kind):
            duplicated_gemm(self, ops, name, M, N, K, False)
            return
        if self.latents and kind in UP:
            for c in latent_gathers(self, name, M, kind):
                ops.add(c)
        ops.add(Compute(name, 2 * M * N * K / self.size, dtype=self.dtype, kernels=self._kernels(
            self._shape(M, N, K, row_parallel), False, row_parallel)))
        if row_parallel:   # g: the partial outputs b·s·h are summed
            for c in self.tp_comm(name, M * N * self.dt, ends_layer or kind == "fc2"):
                ops.add(c)

    def gemm_backward(self, ops: OpList, name: str, M: float, N: float, K: float,
                      row_parallel: bool) -> None:
        kind = projection(name)
        if self._duplicated(kind):
            duplicated_gemm(self, ops, name, M, N, K, True)
            return
        ops.add(Compute(name, 4 * M * N * K / self.size, dtype=self.dtype, kernels=self._kernels(
            self._shape(M, N, K, row_parallel), True, row_parallel)))
        if row_parallel:
            return
        # f: the partial input gradients b·s·h are summed (MLA's up projections: their
        # latents', .mla_1d)
        comm = latent_backward(self, name, M, kind) if self.latents and kind in UP else \
            self.tp_comm_backward(name, M * K * self.dt)
        for c in comm:
            ops.add(c)

    @property
    def embedding_split(self) -> int:
        return self.cp      # the lookup's output is replicated over TP

    def embedding_ops(self, act_bytes: float) -> list[Op]:
        """The builder's lookup and vocab-parallel all-reduce, for ``s/cp`` tokens."""
        ops = OpList()
        act = act_bytes / self.cp
        ops.add(Compute("embedding", 0.0, 2 * act, kind="elementwise", dtype=self.dtype))
        if self.size > 1:
            ops.add(Collective("embedding.ar", "all_reduce", "tp", act))
        return ops.ops

    def head_forward_ops(self) -> list[Op]:
        """The builder's logits, loss and cross-entropy all-reduce, for ``s/cp`` tokens
        (after the gather of the final norm's output where the last layer, MLA, gathered
        none for it: :mod:`.mla_1d`)."""
        ops, sh, t, n = OpList(), self.shape, self.size, self.tokens
        for c in self.head_gather(n * sh.hidden * self.dt):
            ops.add(c)
        ops.add(Compute("logits", sh.logits_forward_flops(self.b, self.s) / t / self.cp,
                        dtype=self.dtype, kernels=(Kernel("gemm", (n, sh.vocab / t, sh.hidden),
                                                          dtype=self.dtype),)))
        ops.add(loss_op(n, sh.vocab / t, self.dt, self.dtype,
                        stack_cross_entropy(self.sw), False))
        if t > 1:
            ops.add(Collective("loss.ar", "all_reduce", "tp", 4.0 * n))
        return ops.ops

    def head_backward_ops(self, grad_accumulate_bytes: float) -> list[Op]:
        ops, sh = OpList(), self.shape
        ops.add(loss_op(self.tokens, sh.vocab / self.size, self.dt, self.dtype,
                        stack_cross_entropy(self.sw), True))
        bwd = logits_kernels(self.tokens, sh.vocab / self.size, sh.hidden, self.dtype, True,
                             main_grad_bytes(self.sw, self.plan.train_dtype))
        ops.add(Compute("bwd.logits", 2 * sh.logits_forward_flops(self.b, self.s) / self.size
                        / self.cp, dtype=self.dtype, kernels=bwd))
        ops.add(Compute("bwd.grad_accumulate.embedding", 0.0, grad_accumulate_bytes,
                        kind="elementwise", dtype=self.dtype))
        return ops.ops

    def boundary(self, act_bytes: float) -> tuple[float, float | None]:
        """Narayanan et al. 2021 §4.1 scatter-gather: each TP rank sends ``1/t`` of the
        stage output and the receivers all-gather it. With SP the output is already split
        along the sequence: each rank sends its ``1/t`` and nothing is gathered (Megatron-LM
        ``get_tensor_shapes``: ``seq_length // tensor_model_parallel_size``)."""
        act = act_bytes / self.cp
        if self.size > 1:
            return act / self.size, None if self.sp else act
        return act, None
