"""The router's kernels beside its GEMM in Megatron-Core's MoE layer: top-k with its score
function, the random logits of forced balance, the load-balancing loss with the all-reduce of
the tokens per expert over TP × CP that the loss needs, and their backward (docs/moe.md,
"The router's kernels").

Counted at NVIDIA/Megatron-LM d7288711 (``megatron/core/transformer/moe/router.py``
``TopKRouter.forward`` lines 681-709 and ``routing`` lines 587-673; ``moe_utils.py``) and
Transformer Engine v2.9's fused router (``transformer_engine/pytorch/csrc/extensions/
router.cpp``), one kernel per CUDA launch, in training with the loss's gradient enabled:

============================  ==========================================================
part                          kernels (forward; backward)
============================  ==========================================================
forced balance                ``RandomSTE``: ``logits.clone().normal_()``, 2 (lines 1203-1215);
                              its backward passes the gradient on, 0
top-k, fused                  ``tex.fused_topk_with_score_function_fwd``/``_bwd``, 1; 1
                              (``router.cpp`` lines 58, 85; ``moe_utils.py`` line 730)
top-k, unfused (softmax)      ``torch.topk``, ``softmax``, ``zeros_like`` and an out-of-place
                              ``scatter`` (copy + scatter) for the probabilities, ``zeros_like``,
                              ``int``, ``scatter`` (2), ``bool`` for the map: 10 (lines 770-821);
                              backward: the scatter's gather, softmax's, top-k's zeros and
                              scatter: 4
aux loss, fused               scores ``fused_score_for_moe_aux_loss_fwd`` (``router.cpp`` 119),
                              ``routing_map.sum(dim=0)`` (``moe_utils.py`` 236), the loss
                              ``fused_moe_aux_loss_fwd`` (164), then ``aux_loss / coeff`` and the
                              tracker's ``+=`` (``router.py`` 474-494, ``moe_utils.py`` 974): 3 over
                              the scores, 2 small; backward: ``MoEAuxLossAutoScaler``'s
                              ``ones_like`` and product (``moe_utils.py`` 285), the loss's and
                              the scores' backward (``router.cpp`` 183, 139) and the sum of the
                              logits' two gradients: 3 over the scores, 2 small
expert bias (top-k)           the bias added to the scores before top-k, ``scores +
                              expert_bias.float()`` (Megatron-LM d98e8a64 ``moe_utils.py``
                              line 924), 1 unfused; 0 fused (TE's top-k kernel takes
                              ``expert_bias``, line 846); no backward (top-k's indices)
expert bias (counts)          ``_apply_expert_bias`` (``router.py`` lines 733-744, with
                              gradients enabled only): ``routing_map.sum(dim=0)`` over the map
                              and ``local_tokens_per_expert +=``: 1 over the scores, 1 small;
                              backward 0
aux loss, unfused             scores: ``softmax``, ``topk``, ``zeros_like``, ``int``,
                              ``scatter`` (2), ``bool`` (lines 855-866), the map's sum, the
                              loss's ``probs.sum(dim=0)`` (lines 142-146): 9 over the scores;
                              its product, sum and scaling, then the division and the tracker:
                              5 small; backward: softmax's and the gradients' sum over the
                              scores, 2; the autoscaler's 2 and the loss's 2 products, 4 small
============================  ==========================================================

Between the map's sum and the loss, ``get_tokens_per_expert_and_token_count`` all-reduces the
``E`` counts (int64) over the ranks that split the sequence, TP × CP
(``reduce_from_tensor_model_parallel_region``, ``moe_utils.py`` line 237), on the compute
stream's order. The loss and its all-reduce run only with gradients enabled (in a
checkpointed layer's recomputation, not its first forward) and only with ``aux_loss`` or
``seq_aux_loss`` balancing and a coefficient above 0 (``router.py`` ``is_aux_loss_enabled``
lines 278-283,
``_apply_aux_loss`` 293-295: Megatron's default ``moe_aux_loss_coeff`` is 0,
``transformer_config.py`` line 734); ``seq_aux_loss`` runs the same steps over the sequence's
reshaped scores (lines 325-378). Kernels "over the scores" read and write the ``T × E`` fp32
matrix (an upper bound for those over ``T × k``: all are launch-bound at these sizes), the small
ones move nothing worth counting. Each op's host time is the stack's host rule per kernel
(:mod:`ddlsim.simulator.kernels.host`). Not counted: ``type_as`` casts when the router runs in
bf16, the z-loss. Both engines and the search tier see these as ordinary ops (compute and one
collective on the compute stream).

The router's GEMM (:func:`router_gemm`) is a plain ``torch.nn.functional.linear`` outside
Transformer Engine (Megatron-LM 1e057005 ``router.py`` ``Router.gating`` lines 64-83), so it
runs in the layer's bf16/fp16 under FP8 training too (as DeepSeek-V3's FP8 framework keeps
"MoE gating modules" in their original precision: arXiv:2412.19437 §3.3.1). With ``--moe-router-dtype fp32`` that
commit casts the input ``T × h`` and the weight ``E × h`` to fp32 first (``input.to``,
``weight.to``: two kernels) and autograd casts their fp32 gradients back (``ToCopyBackward0``,
two kernels); the GEMMs themselves run on TF32 tensor cores, not the fp32 CUDA cores: Megatron
never sets ``torch.backends.cuda.matmul.allow_tf32`` (PyTorch's default False since 1.12), but
the NGC PyTorch containers these runs use (Megatron-MoE-ModelZoo c1ad0b5c ``dockers/Dockerfile``
line 9: ``nvcr.io/nvidia/pytorch:25.06-py3``) carry ``ENV TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``
(pytorch/pytorch#77114; MONAI's docs/source/precision_accelerating.md, "If you are using an NGC
PyTorch container, the container includes a layer ENV TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"),
which turns it on; Megatron-LM from 0f058666a8 (2025-06-14) calls Transformer Engine's
``general_gemm`` instead (``moe_utils.py`` ``RouterGatingLinearFunction``), whose pure-fp32
GEMMs ask cuBLASLt for ``CUBLAS_COMPUTE_32F_FAST_TF32`` ("Use TF32 only for pure FP32 GEMM",
``transformer_engine/common/gemm/cublaslt_gemm.cu``): TF32 either way. Counted as 1e057005 runs
it (the ModelZoo step-time table's code); the later form moves the input's cast into the
backward and runs the forward GEMM in bf16 with an fp32 output, the same bytes in all. Not
counted: the fp32 copy of the input autograd keeps for the weight gradient (memory), the
fp32 probabilities in un-permutation (``--moe-router-dtype``'s help: negligible with permute
fusion, which every row that sets it uses).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...simulator.kernels.gemm import gemm_kernels_backward
from ..trace import Collective, Compute, Kernel

__all__ = ["RouterPass", "ROUTER_KERNELS", "router_kernels", "router_ops", "router_gemm",
           "ROUTER_GEMM_DTYPE", "UNFUSED_HOST_CALLS", "router_host_calls"]

#: ``--moe-router-dtype`` → the dtype its GEMMs run at: fp32 on TF32 tensor cores (the
#: module docstring: the NGC container's ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1``, Transformer
#: Engine's ``CUBLAS_COMPUTE_32F_FAST_TF32``)
ROUTER_GEMM_DTYPE = {"fp32": "tf32"}


@dataclass(frozen=True)
class RouterPass:
    """Kernels of one router part in one direction: ``scores`` over the ``T × E`` fp32 score
    matrix (read and write), ``small`` over ``E``-long vectors or scalars."""

    scores: int
    small: int = 0


#: (part, fused) → (forward, backward) kernels; the module docstring gives each count's lines
ROUTER_KERNELS: dict[tuple[str, bool], tuple[RouterPass, RouterPass]] = {
    ("forced", True): (RouterPass(2), RouterPass(0)),
    ("forced", False): (RouterPass(2), RouterPass(0)),
    ("topk", True): (RouterPass(1), RouterPass(1)),
    ("topk", False): (RouterPass(10), RouterPass(4)),
    ("aux_loss", True): (RouterPass(3, 2), RouterPass(3, 2)),
    ("aux_loss", False): (RouterPass(9, 5), RouterPass(2, 4)),
    ("expert_bias", True): (RouterPass(0), RouterPass(0)),
    ("expert_bias", False): (RouterPass(1), RouterPass(0)),
    ("bias_counts", True): (RouterPass(1, 1), RouterPass(0)),
    ("bias_counts", False): (RouterPass(1, 1), RouterPass(0)),
}


#: part → calls into torch that the router's torch fallbacks (``--moe-router-fusion`` off) make
#: in one forward beyond the fused path's Transformer Engine entry points, measured by running
#: Megatron-LM d7288711's ``MoELayer`` on CPU (benchmarks/moe_host_ops.py,
#: benchmarks/data/moe_host_ops/d7288711_*.json, ``fwd`` → ``where`` → ``router``): top-k,
#: ``moe_utils.py`` lines 723-821 (``dim``, ``topk``, ``type_as``, ``softmax``, two
#: ``zeros_like``, two ``scatter``, ``int``, ``bool``: 10 where
#: ``fused_topk_with_score_function`` is 1); the aux loss, lines 857-866 (the scores:
#: ``softmax``, ``topk``, ``zeros_like``, ``int``, ``scatter``, ``bool``) and 142-143 (the loss:
#: ``sum``, two ``mul``, ``sum``), 10 where the fused score and loss functions are 2
#: (``aux_loss`` balancing; ``seq_aux_loss``'s fallback was not measured). At 1e057005, the
#: ModelZoo step-time rows' commit (``1e057005_*.json``), top-k makes the same 10 calls but the
#: aux loss 5 (its scores are one ``softmax``, ``router.py`` line 199, the map top-k's): like
#: the rest of the stack, counted as d7288711 runs it.
UNFUSED_HOST_CALLS = {"topk": 10 - 1, "aux_loss": 10 - 2}


def router_host_calls(plan: Any) -> int:
    """Host calls the router's forward makes beyond the fused router's, which
    :data:`.moe_host.DISPATCHER_HOST` counts (its ``router 16``): 0 with the fused router,
    :data:`UNFUSED_HOST_CALLS` with the torch fallbacks. Like the fused count, charged to
    every forward, a checkpointed layer's first (no loss without gradients) too.

    Parameters
    ----------
    plan : MoEPlan
        the resolved MoE options (``router_fusion``, ``balancing``, ``aux_loss``).

    Returns
    -------
    int
        calls into torch per forward, each timed by the stack's host rule.
    """
    if plan.router_fusion:
        return 0
    loss = plan.aux_loss and plan.balancing == "aux_loss"
    return UNFUSED_HOST_CALLS["topk"] + (UNFUSED_HOST_CALLS["aux_loss"] if loss else 0)


def router_kernels(plan: Any, backward: bool) -> RouterPass:
    """The router's kernels besides its GEMM in one direction of one MoE layer.

    Parameters
    ----------
    plan : MoEPlan
        the resolved MoE options (:class:`.moeplan.MoEPlan`): ``router_fusion``,
        ``forced_balance`` and :attr:`~.moeplan.MoEPlan.aux_loss`.
    backward : bool
        the backward's kernels instead of the forward's.

    Returns
    -------
    RouterPass
        the kernels over the scores and the small ones, summed over the plan's parts.
    """
    parts = ["topk"] + (["forced"] if plan.forced_balance else []) \
        + (["aux_loss"] if plan.aux_loss else []) \
        + (["expert_bias", "bias_counts"] if plan.expert_bias else [])
    passes = [ROUTER_KERNELS[(p, plan.router_fusion)][int(backward)] for p in parts]
    return RouterPass(sum(p.scores for p in passes), sum(p.small for p in passes))


def _checkpointed(plan: Any) -> bool:
    """Whether the router runs inside a checkpointed region (full recomputation, or the
    ``moe`` module): its first forward runs without gradients, so the loss (and its
    all-reduce) comes with the recomputation (Megatron-LM d7288711 ``router.py`` line 640:
    ``torch.is_grad_enabled()``; ``tensor_parallel/random.py`` ``CheckpointFunction``: forward
    under ``torch.no_grad()``, line 580, the backward's recomputation with gradients, 620)."""
    return plan.recompute == "full" or "moe" in (plan.recompute_modules or ())


def _kernels_op(name: str, k: RouterPass, score_bytes: float, dtype: str) -> Compute:
    kernels = (Kernel("memory", bytes=score_bytes, dtype=dtype),) * k.scores \
        + (Kernel("memory", dtype=dtype),) * k.small
    return Compute(name, 0.0, k.scores * score_bytes, kind="elementwise", dtype=dtype,
                   kernels=kernels)


def router_ops(b: Any, pre: str, backward: bool) -> list[Compute | Collective]:
    """The router's ops after its GEMM (forward: its kernels, the loss's all-reduce of the
    tokens per expert over TP and CP, the loss's last kernels) or before it (backward: its
    kernels), for builder ``b`` (:class:`.moe.MoEOps`).

    Parameters
    ----------
    b : MoEOps
        the stage builder (``moe``, ``tokens()``, ``shape``, ``tp``, ``cp``, ``dtype``).
    pre : str
        the ops' name prefix (``fwd``, ``recompute``, ``bwd``).
    backward : bool
        the backward's ops.

    Returns
    -------
    list of Compute and Collective
        in issue order; the all-reduce over ``tp`` (then ``cp``) only where those groups have
        more than one rank (a stand-in for Megatron's one all-reduce over TP × CP when both
        do: the same counts, two latency-bound steps).
    """
    plan, experts = b.moe, b.shape.experts
    score_bytes = 2 * 4.0 * b.tokens() * experts        # fp32 T × E, read and write
    k = router_kernels(plan, backward)
    if not backward and pre == "fwd" and _checkpointed(b.plan):    # no grad: no loss, no counts
        k = router_kernels(replace(plan, aux_loss_coeff=0.0), False)
        if plan.expert_bias:
            counts = ROUTER_KERNELS[("bias_counts", plan.router_fusion)][0]
            k = RouterPass(k.scores - counts.scores, k.small - counts.small)
    if backward or not plan.aux_loss or pre == "fwd" and _checkpointed(b.plan):
        return [_kernels_op(f"{pre}.router.kernels", k, score_bytes, b.dtype)]
    loss = ROUTER_KERNELS[("aux_loss", plan.router_fusion)][0]
    first = RouterPass(k.scores - 1, k.small - loss.small)     # to the counts' sum
    counts = 8.0 * experts                                     # int64 per expert
    reduce = [Collective(f"{pre}.router.aux_allreduce.{g}", "all_reduce", g, counts)
              for g, n in (("tp", b.tp), ("cp", b.cp)) if n > 1]
    return [_kernels_op(f"{pre}.router.kernels", first, score_bytes, b.dtype), *reduce,
            _kernels_op(f"{pre}.router.loss", RouterPass(1, loss.small), score_bytes, b.dtype)]


def _casts(name: str, elements: tuple[float, ...], dt: float, dtype: str) -> Compute:
    """One cast kernel per tensor of ``elements`` between the layer's ``dt``-byte dtype and
    fp32 (read one, write the other)."""
    kernels = tuple(Kernel("memory", bytes=n * (dt + 4.0), dtype=dtype) for n in elements)
    return Compute(name, 0.0, sum(k.bytes for k in kernels), kind="elementwise", dtype=dtype,
                   kernels=kernels)


def router_gemm(b: Any, pre: str, backward: bool) -> list[Compute]:
    """The router's GEMM ``[T,h]·[h,E]`` (backward: its data and weight gradients) in the
    layer's dtype, or, with ``--moe-router-dtype fp32``, at TF32 with the casts of its
    operands (forward, before it) and of their gradients (backward, after it).

    Parameters
    ----------
    b : MoEOps
        the stage builder (``moe``, ``tokens()``, ``shape``, ``dt``, ``dtype``).
    pre : str
        the ops' name prefix (``fwd``, ``recompute``, ``bwd``).
    backward : bool
        the backward's ops.

    Returns
    -------
    list of Compute
        in issue order: ``{pre}.router`` alone, or with ``{pre}.router.cast`` (two kernels:
        ``T·h`` and ``E·h`` elements, ``dt + 4`` bytes each) before it forward, after it
        backward.

    References
    ----------
    NVIDIA/Megatron-LM 1e057005 ``megatron/core/transformer/moe/router.py`` lines 77-82
    (``torch.nn.functional.linear(input.to(router_dtype), self.weight.to(router_dtype))``).
    """
    T, h, E = b.tokens(), b.shape.hidden, b.shape.experts
    dtype = ROUTER_GEMM_DTYPE.get(b.moe.router_dtype, b.dtype)
    shapes = gemm_kernels_backward(T, E, h) if backward else ((T, E, h),)
    gemm = Compute(f"{pre}.router", (4 if backward else 2) * T * E * h, dtype=b.dtype,
                   kernels=tuple(Kernel("gemm", g, dtype=dtype) for g in shapes))
    if b.moe.router_dtype is None:
        return [gemm]
    cast = _casts(f"{pre}.router.cast", (T * h, E * h), b.dt, b.dtype)
    return [gemm, cast] if backward else [cast, gemm]
