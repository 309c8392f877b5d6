"""Selective activation checkpointing as the stack runs it (``software.selective_recompute``).

``attention_core`` (Megatron-LM, Korthikanti et al. 2022 §5): the backward recomputes the
attention core's forward (:func:`.layerkernels.recompute_op`).

``every_second_mm`` (torchtitan's op-level selective AC, ``selective_ac_option = 'op'``:
torchtitan 9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` lines 213-276, 07c00d9
``torchtitan/distributed/activation_checkpoint.py`` lines 22-31 and 85-101): inside each
checkpointed transformer block the policy saves the outputs of ``aten.mm`` except every
second one (counted per block and pass), of the SDPA kernels, of TP's reduce-scatters and of
``max``; every other op is recomputed in the backward. For torchtitan's Llama block the
``mm`` calls are, in order, ``wq wk wv wo w1 w3 w2`` (a gated MLP; ``w1 w2`` otherwise), so
the backward recomputes ``wk``, ``wo`` and ``w3`` and every element-wise op of the forward
(norms, rotary embedding, SiLU and product, residual adds). FP8 linears (torchao) run
``aten._scaled_mm``, which is not on the save list: every FP8 GEMM and its casts are
recomputed. MoE layers keep the attention-core form. Where the stack's recomputation stops at
the last tensor the backward saves (:mod:`.early_stop`: torch's early stop, or a compiled
block's dead-code elimination), the block's last op, the residual add after ``w2``, is not
recomputed either; ``w2`` (the 7th ``mm``, saved) and the reduce-scatters (saved) never are.
Under FP8 ``w2``'s ``_scaled_mm`` is not on the save list but feeds nothing the backward
needs: a compiled block drops it (its input casts stay), an eager one runs it (torchao's
autograd Function saves its tensors after it).

**Host time** (eager only: ``software.kernels.host_dispatch = eager``). Torch runs the policy
in Python: ``create_selective_checkpoint_contexts`` puts every ATen op of a checkpointed block
through a ``TorchDispatchMode`` in the forward (``_CachingTorchDispatchMode``: the policy call,
the saved outputs' detached copies) and again in the recompute (``_CachedTorchDispatchMode``:
cached outputs handed back, each recomputed op through the mode), views and detaches included.
Each such op costs the host time measured on one H200's host (torch 2.11, 8 torchtitan
Llama 3.1 8B blocks, ``benchmarks/sac_host_cost.py`` on
``benchmarks/data/device_h200_2026-11-30/run4/llama_s2048/llama_step_trace.json.gz``): the forward
runs :data:`FORWARD_OPS` ops per block through the mode, each :data:`FORWARD_OP_S` more than the
same op outside the blocks; the recompute :data:`RECOMPUTE_OPS`, each :data:`RECOMPUTE_OP_S`
more. The recompute's is its op's ``host_s`` (:func:`every_second_mm_op`); the forward's is
spread over the layer's forward ops as its ops go with their kernels (:func:`forward_host`:
:data:`GEMM_OPS` per GEMM, :data:`ATTENTION_OPS` per attention kernel, the rest evenly over the
memory kernels). ``host_s`` carries it to where the host's work is laid: under FSDP2 on a GPU
the block's host chain on the ``host`` stream (:mod:`.eager_host`: each op's share joins the
host op before it, beside the op's own measured units, and the recompute's host op also holds
the forward's units, which it runs again), so the host's lead carries across ops; elsewhere
(no FSDP2, layers built as one loop op) the op keeps it
(:mod:`ddlsim.simulator.kernels.host`: ``max(Σ t + n·g, n·h + host_s)``). A compiled block runs
no per-op Python (compile removes it: run3/s2048c, ``compile_selective_op`` 106.3 ms against
eager's 175.5 ms at sequence 2048).

**Every n-th layer** (``train.recompute: full`` with ``recompute_every_n_layers: n``,
torchtitan's ``selective_ac_option = 'n'``: 9dec370 ``parallelize_llama.py`` lines 282-290,
1ea476e9 lines 82-99, 07c00d9 ``activation_checkpoint.py`` lines 115-123): torchtitan wraps a
rank's transformer blocks one by one, in the order it builds them (its model chunks in order,
each chunk's layers in order), counting them in one process-wide counter that is incremented
before the test, and checkpoints a block fully when the count is divisible by ``n``: the
rank's ``n``-th, ``2n``-th, … block (layers ``n − 1, 2n − 1, …`` counted from 0). The other
blocks keep all their activations and recompute nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError
from ..trace import Compute, Kernel
from .early_stop import trimmed_fc2, trims_tail, without_last_add

__all__ = ["layer_mms", "every_second_mm_op", "checkpointed_layers", "checkpointed_share",
           "mixed_backward", "op_level", "sac_activation_bytes", "forward_host", "policy_host",
           "FORWARD_OPS", "FORWARD_OP_S", "RECOMPUTE_OPS", "RECOMPUTE_OP_S"]

# The policy's host time (module docstring), each figure printed by benchmarks/sac_host_cost.py
# from benchmarks/data/device_h200_2026-11-30/run4/llama_s2048/llama_step_trace.json.gz (one eager
# selective_op step at sequence 2048, host-bound: the trace's forward host time 43.2 ms against
# the untraced steps' 45.3 ms; torch 2.11 on the H200 machine's host, its README.md). The
# earlier trace of that machine, run1/llama (sequence 8192, a slower host: its ops outside the
# blocks took 1.2-1.9 times as long), reads the same counts and 43.6 and 17.5 µs.
#: ATen ops of one checkpointed block's forward through SAC's dispatch mode (the trace's
#: ``PythonDispatchMode`` events per block, 8 of 8 blocks alike)
FORWARD_OPS = 66
#: host seconds the mode adds to each: in-block ``rms_norm``, ``linear``, ``to``, ``flatten``
#: against the same top-level ops outside the blocks (the root's norm, output projection, the
#: loss's cast and flatten), Σ difference / their ops through the mode = 34.8 µs
FORWARD_OP_S = 34.8e-6
#: ATen ops of one block's recompute through the mode (detaches and cache hits included)
RECOMPUTE_OPS = 90
#: host seconds the mode adds to each, the same reading in the recompute = 16.3 µs
RECOMPUTE_OP_S = 16.3e-6
#: forward ops through the mode per GEMM kernel (a linear's ``t``, ``view``, ``mm``,
#: ``_unsafe_view``) and per attention kernel (SDPA with the q/k/v views, three transposes,
#: the output's transpose and view), counted in the trace's sequence
GEMM_OPS, ATTENTION_OPS = 4, 9


def checkpointed_layers(every: int, first: int, count: int) -> int:
    """How many of a run of a rank's layers torchtitan checkpoints with
    ``selective_ac_option = every``: those whose 1-based count is divisible by ``every``
    (module docstring).

    Parameters
    ----------
    every : int
        ``train.recompute_every_n_layers``.
    first : int
        The rank's count of the run's first layer, from 0, in the order it builds them.
    count : int
        Layers in the run.

    Returns
    -------
    int
        ``(first + count) // every − first // every``.
    """
    return (first + count) // every - first // every


def checkpointed_share(plan: Any, stage: int) -> float:
    """The fraction of a pipeline stage's layers that are checkpointed.

    Parameters
    ----------
    plan : DecoderPlan
        The run's resolved plan (its layer split and ``recompute_every_n_layers``).
    stage : int
        The pipeline stage.

    Returns
    -------
    float
        Checkpointed layers over the stage's layers (1 when every layer is).
    """
    layers = sum(plan.split[stage])
    return checkpointed_layers(plan.recompute_every_n_layers, 0, layers) / layers


def layer_mms(shape: Any, M: float, t: int) -> list[tuple[float, float, float]]:
    """``(M, N, K)`` of a layer's ``aten.mm`` calls in forward order on one of ``t`` TP
    ranks: ``wq wk wv wo`` then ``w1 [w3] w2`` (torchtitan's Llama ``Attention`` and
    ``FeedForward``)."""
    h, f = shape.hidden, shape.ffn
    attn = [(M, shape.q_width / t, h), (M, shape.kv_width / t, h), (M, shape.kv_width / t, h),
            (M, h, shape.q_width / t)]
    mlp = [(M, f / t, h)] * (shape.mlp_matrices - 1) + [(M, h, f / t)]
    return attn + mlp


def op_level(sw: Any, recompute: str, moe: bool | None = False) -> bool:
    """Whether a layer runs torchtitan's op-level selective checkpointing (module docstring):
    ``recompute: selective`` on a stack whose ``selective_recompute`` is ``every_second_mm``,
    a dense layer (MoE layers keep the attention-core form)."""
    return (recompute == "selective" and sw.selective_recompute == "every_second_mm"
            and not moe)


def sac_activation_bytes(shape: Any, b: Any, s: int, t: Any, sp: bool) -> Any:
    """Bytes one dense layer keeps for its backward on one of ``t`` 1-D TP ranks under
    torchtitan's op-level selective checkpointing (module docstring): what the policy saves,
    16-bit unless said; ``b`` and ``t`` may be arrays over plans.

    * the block's input, which the checkpoint keeps (``h``, ``h/t`` with sequence
      parallelism);
    * the outputs of every second ``aten.mm`` from the first (``wq wv w1 w2`` of a gated
      MLP, :func:`layer_mms`: column-parallel outputs are ``N/t`` wide, row-parallel ones
      the whole ``h`` before their reduction), FP8 runs too: ``aten._scaled_mm`` is not on the
      save list, so the policy alone would keep none, yet torchtitan's published FP8 runs hold
      as much as its BF16 ones (benchmarks/llama3_h100_202412_torchtitan.md Tables 1 and 3:
      76.8 vs 77.0 and 61.8 vs 62.0 GiB); the larger count is kept, so that a plan said to fit
      is not one the policy's reading alone would fit;
    * SDPA's output (``q/t``) and its fp32 log-sum-exp (one per head and token);
    * with sequence parallelism, the outputs of the attention's and the MLP's
      reduce-scatters (``h/t`` each, ``c10d.reduce_scatter_tensor`` is on the save list).

    ``s`` is the rank's sequence (``s/cp``), ``b`` the micro-batch.

    References
    ----------
    torchtitan 9dec370 ``torchtitan/parallelisms/parallelize_llama.py`` lines 213-276
    (``_save_list`` and the every-other-mm policy).
    """
    M = b * s
    widths = shape.hidden / t if sp else shape.hidden           # the block's input
    widths += sum(n for _, n, _ in layer_mms(shape, M, t)[0::2])
    widths += shape.q_width / t                                  # SDPA's output
    if sp and np.ndim(t):                     # the two reduce-scatters (none at t = 1)
        widths = widths + np.where(np.asarray(t) > 1, 2 * shape.hidden / t, 0.0)
    elif sp and t > 1:
        widths += 2 * shape.hidden / t
    return 2.0 * M * widths + 4.0 * M * shape.heads / t         # + fp32 log-sum-exp


def every_second_mm_op(shape: Any, kernels: dict, b: int, s: int, t: int, dtype: str,
                       train_dtype: str, sw: Any = None, sp: bool = False) -> Compute:
    """The recomputation of torchtitan's op-level selective AC for one dense layer on one
    TP rank (module docstring): the forward's element-wise kernels (``kernels['ew']``; the
    last residual add left out where the stack's recomputation stops at the last tensor the
    backward saves, :func:`.early_stop.trims_tail`, ``sp``: sequence parallelism) and its
    every-second ``mm`` (all linear GEMMs and the stack ``sw``'s FP8 casts under FP8), and
    the repeat of K and V to the query heads where the stack repeats them
    (``kernels['repeat_kv']``: SDPA's inputs are recomputed, its output alone is saved)."""
    if train_dtype == "fp8":
        from ...simulator.kernels.fp8recipe import FP8_RECIPES
        from .layerkernels import _linear, linear_gemms
        recipe = sw.fp8_recipe if sw is not None else "te_delayed"
        compiled = bool(sw.compile) if sw is not None else False
        per_module = FP8_RECIPES[recipe].per_module     # torchao: one FP8 linear per module
        gathered = bool(sw is not None and sw.enable_fsdp_float8_all_gather)   # .fsdp_float8
        trim = sw is not None and trims_tail(sw)    # w2's _scaled_mm: .early_stop
        gemms = tuple(k for name, g in linear_gemms(shape, b * s, t, per_module).items()
                      for k in _tail(name, trim, sw, _linear(
                          g, train_dtype, False, recipe, compiled, per_module,
                          weight_fp8=gathered)))
    else:
        mms = layer_mms(shape, b * s, t)[1::2]
        gemms = tuple(Kernel("gemm", g, dtype=train_dtype) for g in mms)
    ew = tuple(kernels["ew"])
    if sw is not None and trims_tail(sw):
        from ...config_types import DTYPE_BYTES
        ew = without_last_add(ew, shape, b * s * shape.hidden / (t if sp else 1),
                              DTYPE_BYTES[dtype], sw, dtype)
    ew += tuple(kernels.get("repeat_kv", ()))   # K/V's repeat feeds the core: not saved
    flops = sum(2.0 * k.shape[0] * k.shape[1] * k.shape[2] * k.batch
                for k in gemms if k.kind == "gemm")
    nbytes = sum(k.bytes for k in ew + gemms if k.kind == "memory")
    host = RECOMPUTE_OPS * RECOMPUTE_OP_S if sw is not None and policy_host(sw) else 0.0
    return Compute("recompute.sac", flops, nbytes, dtype=dtype, kernels=gemms + ew,
                   host_s=host)


def policy_host(sw: Any) -> bool:
    """Whether stack ``sw`` runs the SAC policy in Python per ATen op: eager dispatch
    (``software.kernels.host_dispatch``; compiled blocks and CUDA graphs run none)."""
    return getattr(sw, "host_dispatch", None) == "eager"


def forward_host(ops: list, sw: Any, recompute: str) -> list:
    """A dense layer's forward ops with the host time of the SAC policy (module docstring)
    under op-level selective checkpointing on an eager stack; ``ops`` unchanged otherwise.

    The block's :data:`FORWARD_OPS` × :data:`FORWARD_OP_S` is spread over its compute ops by
    the ATen ops their kernels come with: :data:`GEMM_OPS` per GEMM, :data:`ATTENTION_OPS` per
    attention kernel, the remaining ops evenly over the memory kernels (an op timed without
    kernels counts as one memory kernel; collectives and SM-contention ops take none).

    Parameters
    ----------
    ops : list of Compute or Collective
        One dense layer's forward, in order.
    sw : ResolvedSoftware
        The stack (its ``selective_recompute`` and ``host_dispatch``).
    recompute : str
        ``train.recompute``.

    Returns
    -------
    list
        The ops, each compute op with its share in ``host_s`` (s).
    """
    if not (op_level(sw, recompute) and policy_host(sw)):
        return ops
    kinds = [[k.kind for k in (op.kernels or (Kernel("memory"),))] if _runs(op) else []
             for op in ops]
    gemm = sum(k.count("gemm") for k in kinds)
    flash = sum(k.count("flash") for k in kinds)
    memory = sum(k.count("memory") for k in kinds)
    per_memory = max(FORWARD_OPS - GEMM_OPS * gemm - ATTENTION_OPS * flash, 0) / max(memory, 1)
    weights = [GEMM_OPS * k.count("gemm") + ATTENTION_OPS * k.count("flash")
               + per_memory * k.count("memory") for k in kinds]
    total = sum(weights)
    if total == 0:
        return ops
    from dataclasses import replace
    block = FORWARD_OPS * FORWARD_OP_S
    return [replace(op, host_s=op.host_s + block * w / total) if w else op
            for op, w in zip(ops, weights)]


def _runs(op: Any) -> bool:
    """Whether ``op`` is a compute op that runs kernels of its own (not a collective, nor the
    extra time of GEMMs beside communication, nor an op of no work)."""
    return (isinstance(op, Compute) and op.contention is None
            and bool(op.kernels or op.flops or op.bytes))


def _tail(name: str, trim: bool, sw: Any, kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """A linear's recomputed FP8 kernels: the down projection's (``fc2``) as far as a trimmed
    recomputation runs them (:func:`.early_stop.trimmed_fc2`), every other one's whole."""
    return trimmed_fc2(kernels, sw) if trim and name == "fc2" else kernels


def mixed_backward(b: Any, repeat: int, first: int | None) -> list:
    """The backward ops of ``repeat`` dense layers of builder ``b``'s stage, the first of
    them the rank's layer ``first`` (from 0), under ``train.recompute_every_n_layers``: the
    checkpointed layers' ops (:func:`checkpointed_layers`), then the others', built by a
    builder of the same stage for the plan without recomputation. Nothing overlaps
    consecutive layers, so the order within the pass does not change its time.

    Parameters
    ----------
    b : StageBuilder
        The stage's builder.
    repeat : int
        Layers in the pass.
    first : int
        The rank's count of the pass's first layer (from 0).

    Returns
    -------
    list of Op
        The pass's backward ops.

    Raises
    ------
    ConfigError
        For a model with Mixture-of-Experts layers (not modelled).
    """
    every = b.plan.recompute_every_n_layers
    if b.shape.is_moe:
        raise ConfigError(f"train.recompute_every_n_layers = {every} is modelled for dense "
                          "decoders; this model has Mixture-of-Experts layers: use "
                          "recompute_every_n_layers: 1")
    assert first is not None, "a pass under recompute_every_n_layers names its first layer"
    full = checkpointed_layers(every, first, repeat)

    def make() -> list:
        ops = list(b._dense_layer_ops(True, full)) if full else []
        if repeat > full:
            ops += b.cached(("uncheckpointed",), lambda: _uncheckpointed(b))._dense_layer_ops(
                True, repeat - full)
        return ops
    return b.cached(("mixed backward", repeat, full), make)


def _uncheckpointed(b: Any) -> Any:
    """A builder of ``b``'s stage for the plan without recomputation (resolved with the
    plan: :attr:`.plan.DecoderPlan.uncheckpointed`)."""
    from .builder import StageBuilder
    return StageBuilder(b.plan.uncheckpointed)
