"""FSDP2's float8 all-gather as torchao runs it, and the scale precompute after the step
(``system.software.kernels.enable_fsdp_float8_all_gather`` and
``precompute_float8_dynamic_scale_for_fsdp``: torchtitan's ``[float8]`` keys).

What torchao does (pytorch/ao eab345c, the torchao of torchtitan's 2024 runs; the same at
6243040, 2025):

* **Which weights.** ``convert_to_float8_training`` wraps each ``Float8Linear``'s weight in a
  ``WeightWithDynamicFloat8CastTensor`` (``float8/float8_linear.py`` lines 452-460).
  torchtitan converts every ``nn.Linear`` but the output head (9dec370
  ``torchtitan/float8.py`` line 99: ``fqn != "output"``): in a Llama block ``wq``, ``wk``,
  ``wv``, ``wo``, ``w1``, ``w2``, ``w3``. The norms, the embedding and the head are
  gathered in 16 bits.
* **Before each gather** FSDP2 calls ``fsdp_pre_all_gather`` on every such weight's shard
  (``float8/fsdp_utils.py``), on its all-gather copy-in stream (torch
  ``_fsdp_collectives.py`` ``foreach_all_gather``), outside the compiled blocks (FSDP's
  hooks run eagerly): the shard is cast with ``tensor.to(float32) * scale``, ``clamp``,
  ``.to(float8)`` (``float8_tensor.py`` ``_ToFloat8ConstrFunc`` line 153,
  ``float8_utils.py`` ``to_fp8_saturated`` lines 150-153): four kernels moving 2 + 4, 4 + 4,
  4 + 4 and 4 + 1 bytes per shard element (:data:`CAST_PASSES`). Without the precompute its
  scale comes from the shard first: ``torch.max(torch.abs(x))`` (2 + 2 and 2 bytes,
  :data:`AMAX_PASSES`) and an all-reduce (MAX) of the fp32 amax over FSDP's mesh, one per
  weight and gather (``tensor_to_amax`` lines 100-113, ``reduce_amax=True``).
* **The gather** moves 1 byte per float8 weight element (the 16-bit bytes of the rest of the
  unit); FSDP2's copy-out copies those bytes.
* **After it** the weight is a ``Float8Tensor``: the linear casts no weight in the forward
  and copies it into the other layout for the backward's input-gradient GEMM
  (:func:`~ddlsim.simulator.kernels.fp8recipe.fp8_cast_kernels`, ``weight_fp8``). A unit
  resharded after its forward is gathered the same way again for its backward (a cast on the
  shard, an FP8 gather).
* **The precompute** (``precompute_float8_dynamic_scale_for_fsdp``, torchtitan 9dec370
  ``train.py`` line 328: after ``optimizers.step()``): ``torch._foreach_norm(weights,
  inf)`` over every float8 weight's shard (2 bytes read per element), and "a single
  all-reduce" of the stacked amaxes (``fsdp_utils.py``): DTensor reduces the partial result
  over each sharded mesh dimension, FSDP's and, with TP, the TP group's, one all-reduce of
  ``n_weights`` bf16 amaxes each; then a handful of scalar kernels (clamp, to float64,
  divide, to float32).

**In the trace** the casts (and the per-weight amax all-reduces) run on the ``dp`` stream
just before the gather they feed: FSDP2's copy-in stream is its own, so queuing them behind
the collectives on ``dp`` is an upper bound on their exposure. Their kernels are launched at
the stack's ``host_dispatch`` rate (under ``compile`` the compiled rate, though the hooks
are eager). The launches of ``_foreach_norm``'s multi-tensor kernel are counted as one.
"""

from __future__ import annotations

from typing import Any

from ..trace import Collective, Compute, Kernel, Op, Wait

__all__ = ["CAST_PASSES", "AMAX_PASSES", "PRECOMPUTE_SCALARS", "active", "check",
           "float8_weights", "gathered_bytes", "cast_ops", "precompute_ops", "phrase"]

#: bytes per shard element of each eager kernel of the pre-gather cast (module docstring):
#: ``to(float32)``, ``* scale``, ``clamp``, ``to(float8)``
CAST_PASSES = (2 + 4, 4 + 4, 4 + 4, 4 + 1)
#: bytes per shard element of the amax kernels when the scale is not precomputed:
#: ``abs`` (read 2, write 2), ``max`` (read 2)
AMAX_PASSES = (2 + 2, 2)
#: scalar kernels after the precompute's all-reduce: ``clamp``, ``to(float64)``, the
#: division, ``to(float32)`` (``fsdp_utils.py`` precompute_float8_dynamic_scale_for_fsdp)
PRECOMPUTE_SCALARS = 4


def active(sw: Any) -> bool:
    """Whether the stack gathers the float8 linears' weights in FP8."""
    return bool(sw.enable_fsdp_float8_all_gather)


def check(cfg: Any) -> None:
    """What the float8 all-gather applies to (ValueError naming the field and the rule).

    Parameters
    ----------
    cfg : RunConfig
        The run being validated.

    Raises
    ------
    ValueError
        When ``enable_fsdp_float8_all_gather`` is on outside FP8 training with torchao's
        tensorwise recipe under FSDP2's per-layer units over more than one data-parallel
        shard, for MoE or MLA layers, or when ``precompute_float8_dynamic_scale_for_fsdp``
        is on without it.
    """
    sw, p = cfg.software, cfg.parallel
    field = "system.software.kernels.enable_fsdp_float8_all_gather"
    if not active(sw):
        if sw.precompute_float8_dynamic_scale_for_fsdp:
            raise ValueError("system.software.kernels.precompute_float8_dynamic_scale_for_fsdp"
                             " = true needs enable_fsdp_float8_all_gather: true (torchtitan "
                             "precomputes the scales of the float8 all-gather only: 9dec370 "
                             "float8.py lines 68-71)")
        return
    # the family's check runs before the config derives an unset data_parallel_size
    dp = p.data_parallel_size or cfg.system.num_devices // (p.tp * p.cp * p.pp)
    shards = dp // p.data_parallel_replicate_size
    why = None
    if cfg.train.dtype != "fp8":
        why = f"train.dtype is {cfg.train.dtype!r}; it gathers FP8 weights: use train.dtype fp8"
    elif sw.fp8_recipe != "tensorwise":
        why = (f"fp8_recipe is {sw.fp8_recipe!r}; torchao gathers in float8 with tensorwise "
               "scaling only (torchao eab345c float8/config.py lines 259-261: "
               "'enable_fsdp_float8_all_gather only supports tensorwise scaling "
               "granularity'; torchtitan 07c00d9 float8.py lines 78-82 refuse it with a "
               "recipe_name): use fp8_recipe: tensorwise")
    elif p.zero_stage != 3 or sw.zero3_gather != "per_layer":
        why = (f"it is FSDP2's (zero_stage 3 with zero3_gather per_layer); here zero_stage = "
               f"{p.zero_stage}, zero3_gather = {sw.zero3_gather!r}")
    elif shards < 2:
        why = (f"FSDP shards over {shards} data-parallel rank here; torchtitan turns it on "
               "only with data_parallel_shard_degree > 1 (9dec370 float8.py lines 51-54: "
               "dp_shard_enabled): set it to false")
    elif cfg.model.shape().is_moe or cfg.model.shape().mla is not None:
        why = "it is modelled for dense layers with separate projections (Llama's), not MoE or MLA"
    if why:
        raise ValueError(f"{field} = true: {why}")


def float8_weights(shape: Any) -> tuple[float, ...]:
    """Elements of one dense layer's float8 linear weights, one per ``nn.Linear`` of
    torchtitan's Llama block (``wq``, ``wk``, ``wv``, ``wo``, then ``w1``, ``w3`` of a gated
    MLP and ``w2``), before any split."""
    h, f = shape.hidden, shape.ffn
    return ((h * shape.q_width, h * shape.kv_width, h * shape.kv_width, shape.q_width * h)
            + (h * f,) * (shape.mlp_matrices - 1) + (f * h,))


def gathered_bytes(shape: Any, layer_elements: float, split: float, dt: float) -> float:
    """Bytes one rank gathers for one layer of ``layer_elements`` parameters on its
    tensor-parallel rank (``split``: the layer partitioner's parameter split): its float8
    weights at 1 byte per element, the rest at ``dt``."""
    fp8 = sum(float8_weights(shape)) / split
    return fp8 + (layer_elements - fp8) * dt


def cast_ops(sw: Any, shape: Any, split: float, shards: int, group: str, layers: float,
             dtype: str, deps: tuple[int, ...]) -> list[Op]:
    """The ops before the gather of ``layers`` layers' parameters (module docstring): the
    cast of each float8 weight's shard (one rank holds ``1/shards`` of its ``1/split``),
    after its amax and the amax's all-reduce over ``group`` unless the scales are
    precomputed; all on the ``dp`` stream, the first after ``deps``."""
    sizes = [n / split / shards for n in float8_weights(shape)]
    precomputed = sw.precompute_float8_dynamic_scale_for_fsdp
    passes = CAST_PASSES if precomputed else AMAX_PASSES + CAST_PASSES
    kernels = tuple(Kernel("memory", bytes=n * x, dtype=dtype) for n in sizes for x in passes)
    ops = [Op(Compute("fsdp.float8_cast", 0.0, sum(k.bytes for k in kernels) * layers,
                      kind="elementwise", dtype=dtype, kernels=kernels * int(layers)),
              "dp", deps)]
    if not precomputed:   # fp32 amax per weight and gather
        ops.append(Op(Collective("fsdp.float8_amax", "all_reduce", group, 4.0), "dp",
                      repeat=len(sizes) * int(layers)))
    return ops


def precompute_ops(shape: Any, split: float, shards: int, layers: int, tp: int, group: str,
                   dtype: str) -> list[Op]:
    """The scale precompute after the optimizer step for a stage of ``layers`` layers
    (module docstring): the infinity norm over the rank's float8 weight shards on the compute
    stream, the amaxes' all-reduce over ``group`` (and ``tp`` when ``tp > 1``) on ``dp``,
    then the scalar kernels once the compute stream has waited for it. Indices in ``deps``
    are local: the first op depends on nothing, the others on the op before them."""
    weights = float8_weights(shape)
    elements = sum(weights) / split / shards * layers
    amaxes = len(weights) * layers * 2.0        # one bf16 amax per weight
    ops = [Op(Compute("float8.precompute.norm", 0.0, 2.0 * elements, kind="elementwise",
                      dtype=dtype, kernels=(Kernel("memory", bytes=2.0 * elements,
                                                   dtype=dtype),)))]
    ops.append(Op(Collective("float8.precompute.amax", "all_reduce", group, amaxes), "dp",
                  deps=(0,)))
    if tp > 1:
        ops.append(Op(Collective("float8.precompute.amax.tp", "all_reduce", "tp", amaxes),
                      "dp"))
    ops.append(Op(Wait("float8.precompute.wait", "dp")))
    scalars = tuple(Kernel("memory", bytes=amaxes * 4, dtype=dtype)
                    for _ in range(PRECOMPUTE_SCALARS))
    ops.append(Op(Compute("float8.precompute.scales", 0.0, sum(k.bytes for k in scalars),
                          kind="elementwise", dtype=dtype, kernels=scalars)))
    return ops


def phrase(sw: Any) -> str:
    """``, float8 all-gather (scales precomputed after the step)`` or ``, float8 all-gather
    (an amax all-reduce per weight and gather)`` when on, else empty."""
    if not active(sw):
        return ""
    how = ("scales precomputed after the step" if sw.precompute_float8_dynamic_scale_for_fsdp
           else "an amax all-reduce per weight and gather")
    return f", float8 all-gather ({how})"
