"""Where a checkpointed block's recomputation ends (``software.activation_checkpoint``).

A fully checkpointed transformer block (``train.recompute: full``, and every ``n``-th block
under ``recompute_every_n_layers``) runs its forward again in the backward. How much of it
runs depends on whose checkpoint it is:

* **reentrant** (Megatron-LM's and Megatron-Core's ``tensor_parallel.CheckpointFunction``,
  DeepSpeed's ``CheckpointFunction``): an autograd Function whose backward re-runs the whole
  function on its saved inputs, then backpropagates through that output. Everything is
  recomputed, the block's last GEMM, its tensor-parallel reduction and residual add included.
* **non-reentrant with early stop** (``torch.utils.checkpoint(use_reentrant=False)``, the form
  ``checkpoint_wrapper`` applies, early stop on by default: ``torch/utils/checkpoint.py``
  ``set_checkpoint_early_stop``, "non-reentrant checkpoint stops recomputation as soon as it
  has computed all needed Tensors"): the recomputation's saved-tensor hook
  (``_recomputation_hook.pack_hook``) raises ``_StopRecomputationError`` once the last tensor
  the forward saved for the backward has been saved again. In a Llama block that tensor is
  the down projection's input (``w2``'s ``aten::mm`` saves its inputs before its kernel
  runs: ``tools/autograd/gen_variable_type.py``, whose ``setup_derivative`` emits the inputs'
  saved variables ahead of the dispatch call), so ``w2``'s GEMM, the reduce-scatter (SP) or
  all-reduce after it and the block's last residual add are not recomputed. Under torchao's
  float8 the down projection is an autograd Function, which saves its tensors once its
  forward has returned: its casts and GEMM run again, and only the reduction and the add are
  left out.
* **compiled** (``compile: true``: torchtitan compiles each checkpointed block, 9dec370
  ``parallelize_llama.py`` lines 68-77): AOTAutograd's partitioner builds the backward graph
  from the saved values and the tangents to the gradients it returns and then drops dead code
  (``torch/_functorch/partitioners.py`` ``_extract_graph_with_inputs_outputs`` ending in
  ``eliminate_dead_code()``; functional collectives are not side-effectful in
  ``torch/fx/node.py``), so the same tail is not recomputed under either non-reentrant form
  (under float8 the casts of the down projection's inputs, which tensorwise scaling saves,
  stay; the GEMM and what follows it go).

The recomputed tensors are the ones the backward needs in every case, so the activation
memory does not change; only the backward's recomputation ops do. Op-level selective
checkpointing (:mod:`.sac`) ends the same way: its recomputation never runs the down
projection (its ``mm`` output is on the save list, a reduce-scatter too), and it leaves out
the last residual add when the tail is trimmed.
"""

from __future__ import annotations

from typing import Any

from ...simulator.kernels.elementwise import residual_bytes
from ...simulator.kernels.rotary import rope_passes
from ..trace import Collective, Compute, Kernel
from ..smcontention import kernel_gemm_flops

__all__ = ["trims_tail", "trimmed_recompute", "without_last_add", "trimmed_fc2", "structured_fc2",
           "structured_ew"]


def trims_tail(sw: Any) -> bool:
    """Whether a fully checkpointed block's recomputation on stack ``sw`` ends at the last
    tensor its backward saves (module docstring): non-reentrant with early stop, or
    non-reentrant and compiled.

    Parameters
    ----------
    sw : Software
        The resolved stack (its ``activation_checkpoint`` and ``compile``).

    Returns
    -------
    bool
        True when the down projection's GEMM, the reduction after it and the last residual
        add are not recomputed.
    """
    ac = sw.activation_checkpoint
    return ac == "non_reentrant_early_stop" or (ac == "non_reentrant" and bool(sw.compile))


def trimmed_fc2(kernels: tuple[Kernel, ...], sw: Any) -> tuple[Kernel, ...]:
    """What of the down projection's forward kernels (``mlp.fc2`` of
    :func:`.layerkernels.layer_kernels`: its FP8 casts, GEMM, rescales and the layout copy
    before its reduce-scatter) a trimmed recomputation still runs: the kernels before its
    first GEMM when compiled (the casts whose outputs the backward saves), nothing of a
    16-bit GEMM in eager mode (``aten::mm`` saves its inputs before it runs), and all of
    them under eager float8 (an autograd Function that saves at its end; the layout copy
    feeding the dropped reduce-scatter is kept with them, a small over-count)."""
    first = next((i for i, k in enumerate(kernels) if k.kind == "gemm"), len(kernels))
    fp8 = any(k.kind == "gemm" and k.dtype == "fp8" for k in kernels)
    return kernels[:first] if sw.compile or not fp8 else kernels


def without_last_add(ew: tuple[Kernel, ...], shape: Any, x: float, dt: float, sw: Any,
                     dtype: str) -> tuple[Kernel, ...]:
    """The forward element-wise kernels ``ew`` of one layer less its second residual
    connection (:func:`~ddlsim.simulator.kernels.elementwise.residual_bytes` over ``x``
    hidden-state elements of ``dt`` bytes), the last op of the block's forward.

    Parameters
    ----------
    ew : tuple of Kernel
        The layer's forward element-wise kernels (:func:`~ddlsim.simulator.kernels.
        elementwise.layer_elementwise_kernels`).
    shape : DecoderShape
        The model.
    x : float
        Hidden-state elements on the rank (``b·s·h``, ``/t`` under SP).
    dt : float
        Bytes per element (B).
    sw : Software
        The resolved stack.
    dtype : str
        The kernels' dtype.

    Returns
    -------
    tuple of Kernel
        ``ew`` with the last occurrence of each of the residual connection's kernels before
        the rotary embedding's (the layer's last kernels, which may move the same bytes)
        removed.
    """
    out = list(ew)
    rope = (2 * len(rope_passes(bool(sw.fused_rope), sw.rope_form, dt))
            if shape.positions == "rotary" else 0)
    for v in residual_bytes(shape, x, dt, sw):
        if not v:
            continue
        k = Kernel("memory", bytes=v, dtype=dtype)
        i = max(j for j, y in enumerate(out[:len(out) - rope]) if y == k)
        del out[i]
    return tuple(out)


def trimmed_recompute(b: Any, ops: list) -> list:
    """The builder ``b``'s recomputed forward ``ops`` (:meth:`.builder.StageBuilder.
    layer_forward` with tag ``recompute``) as the stack runs it: unchanged unless
    :func:`trims_tail`, else without the down projection's tail (:func:`trimmed_fc2`), the
    MLP's reduce-scatter or all-reduce after it, and the last residual add
    (:func:`without_last_add`).

    Parameters
    ----------
    b : StageBuilder
        The stage's builder (its stack, kernels and layer sizes).
    ops : list of Compute or Collective
        One dense layer's recomputed forward, ``recompute.attn``, its collectives,
        ``recompute.mlp``, its collectives, ``recompute.elementwise``.

    Returns
    -------
    list of Compute or Collective
        The ops the backward runs.
    """
    if not trims_tail(b.sw):
        return ops
    out = []
    for x in ops:
        if (isinstance(x, Collective) and x.name.startswith("recompute.mlp")
                and x.op in ("reduce_scatter", "all_reduce")):
            continue
        if isinstance(x, Compute) and x.name == "recompute.mlp":
            x = _with_kernels(x, b.kernels["mlp.fc1"] + trimmed_fc2(b.kernels["mlp.fc2"], b.sw))
        elif isinstance(x, Compute) and x.name == "recompute.elementwise":
            elems = b.b * b.s * b.shape.hidden / (b.tp if b.sp else 1)
            x = _with_kernels(x, without_last_add(x.kernels, b.shape, elems, b.dt, b.sw,
                                                  b.dtype))
        out.append(x)
    return out


def _with_kernels(x: Compute, kernels: tuple[Kernel, ...]) -> Compute:
    """``x`` running ``kernels`` instead: its FLOPs scaled by the GEMM FLOPs kept, its
    bytes those of the memory kernels kept (an element-wise op)."""
    full = kernel_gemm_flops(x.kernels)
    flops = x.flops * kernel_gemm_flops(kernels) / full if full else x.flops
    nbytes = sum(k.bytes for k in kernels) if x.kind == "elementwise" else x.bytes
    return Compute(x.name, flops, nbytes, kind=x.kind, dtype=x.dtype, kernels=kernels)


def structured_fc2(part: Any, ops: Any, name: str, M: float, N: float, K: float,
                   row_parallel: bool) -> None:
    """Append to ``ops`` the down projection ``name`` of partitioner ``part``'s recomputed
    forward as a trimmed recomputation runs it (:func:`trimmed_fc2`; the reduce-scatter or
    all-reduce after it left out, the all-gather feeding the next GEMM kept). A partitioner
    whose GEMM ops carry dependencies of their own (the 2-D and 3-D grids) keeps them whole.

    Parameters
    ----------
    part : LayerPartitioner
        The stage's partitioner (its ``gemm_forward`` and stack).
    ops : OpList
        The body under construction.
    name : str
        The op's name (``recompute.fc2``).
    M, N, K : float
        The GEMM ``C[M,N] = A[M,K]·B[K,N]`` of the whole layer.
    row_parallel : bool
        As :meth:`~.partition.base.LayerPartitioner.gemm_forward`.
    """
    from .partition.oplist import OpList
    scratch = OpList()
    part.gemm_forward(scratch, name, M, N, K, row_parallel)
    if any(o.deps or o.repeat != 1 for o in scratch.ops):
        ops.extend(scratch.ops)
        return
    for o in scratch.ops:
        x = o.payload
        if isinstance(x, Collective) and x.op in ("reduce_scatter", "all_reduce"):
            continue
        if isinstance(x, Compute) and x.kernels:
            kept = trimmed_fc2(x.kernels, part.sw)
            if not kept:
                continue
            x = _with_kernels(x, kept)
        ops.add(x, o.stream)


def structured_ew(part: Any, ew: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """Partitioner ``part``'s forward element-wise kernels ``ew`` less the last residual add
    (:func:`without_last_add` over its ``ew_split`` of the rank's ``s/cp`` positions)."""
    t, sp = part.ew_split()
    x = part.b * (part.s // part.cp) * part.shape.hidden / (t if sp else 1)
    return without_last_add(ew, part.shape, x, part.dt, part.sw, part.dtype)
