"""What a run's software stack and plan switch on and off, named: the attention kernel, the
GEMM library and the ceiling it picks, the precision recipe, the fused kernels on and off, the
overlaps on, and the plan options that change how a run executes (the MoE dispatcher, its
backend and expert grid; HSDP replicas; checkpointing of every n-th layer; given virtual-stage
layers; ResNet's autocast and memory format). Shown on the report's plan line and in the JSON
result (``plan``), so that nothing a stack or plan decides is silent (``system.software:
deepspeed`` runs Megatron's fused softmax where the default stack runs FlashAttention-2).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plan_fields", "kernels_line", "plan_of_dump"]

#: the families whose compute model reads ``system.software.kernels`` (docs/compute.md); the
#: others read the stack's overlaps only
_KERNEL_FAMILIES = ("gpt", "llama", "nemotron")

#: fused-kernel switches and their short names
_FUSIONS = {"fused_bias_gelu": "bias-gelu", "fused_bias_dropout_add": "bias-dropout-add",
            "fused_layernorm": "layernorm", "fused_rope": "rope",
            "fused_cross_entropy": "cross-entropy", "fused_optimizer": "optimizer",
            "gradient_accumulation_fusion": "grad-accumulation"}

#: :data:`_FUSIONS` of a squared-ReLU model: its activation's switch in place of bias-GeLU's
_SQUARED_RELU_FUSIONS = dict(("fused_squared_relu", "squared-relu") if f == "fused_bias_gelu"
                             else (f, n) for f, n in _FUSIONS.items())


_OVERLAPS = {"overlap_grad_reduce": "grad-reduce", "overlap_param_gather": "param-gather",
             "overlap_p2p_comm": "p2p", "tp_async_backward": "tp-async backward"}


def _gemm(cfg: Any) -> str:
    """The GEMM library and where the matmul ceiling comes from."""
    sw, system = cfg.software, cfg.system
    dev = system.device
    if system.compute_efficiency is not None:
        return f"{sw.gemm_library} (ceiling: system.compute_efficiency)"
    if sw.gemm_library in (dev.matmul_efficiency_by_library or {}):
        return sw.gemm_library
    if dev.matmul_library and dev.matmul_library != sw.gemm_library:
        return f"{sw.gemm_library} (ceiling: the device's {dev.matmul_library} figure)"
    return sw.gemm_library


def _precision(cfg: Any) -> str:
    """``bf16``, ``fp8 GEMMs (RECIPE scaling), bf16 elsewhere``, each with the gradients'
    reduction dtype."""
    from .config_types import DTYPE_BYTES
    from .software import grad_dtype_bytes

    dtype = cfg.train.dtype
    params = "bf16" if dtype == "fp8" else dtype
    text = (f"fp8 GEMMs ({cfg.software.fp8_recipe} scaling), bf16 elsewhere"
            if dtype == "fp8" else dtype)
    grads = grad_dtype_bytes(cfg.software.grad_reduce_dtype, params)
    if grads != DTYPE_BYTES[params]:
        text += ", fp32 gradients and their reduction"
    return text


def _overlaps(cfg: Any, kernels: bool) -> tuple[list[str], dict[str, str]]:
    """The overlaps on and active, and those on that do not apply here with why: the decoder
    family's rules (its plan line's), or the gradient reduction alone for the families that
    read only that."""
    from .software import stalled_grad_reduce
    sw = cfg.software
    if not kernels:   # off by the collective library (no asynchronous progress), if it is
        stall = stalled_grad_reduce(sw)
        return (["grad-reduce"] if sw.overlap_grad_reduce else []), \
            ({"grad-reduce": stall} if stall else {})
    from .workloads.decoder import tp_overlap
    from .workloads.decoder.overlap import shown_inactive
    off = shown_inactive(cfg)
    on = [label for field, label in _OVERLAPS.items()
          if field != "tp_async_backward" and sw.overlap.get(field) and field not in off]
    mode = tp_overlap.mode(cfg)
    if sw.tp_comm_overlap != "off" and "tp_comm_overlap" not in off:
        on.append(f"tp-comm {sw.tp_comm_overlap}")
    if mode == "async":
        on.append("tp-async backward")
    labels = {**_OVERLAPS, "tp_comm_overlap": "tp-comm"}
    return on, {labels[f]: why for f, why in off.items()}


def _moe_fields(cfg: Any) -> tuple[dict[str, Any], list[str]]:
    """The MoE block (dispatcher with its backend, expert grid, GEMMs, permute, routing) and
    the MoE overlaps on (``shared-experts``, ``ep-a2a (combined 1F1B)``); empty for a model
    without experts or a family without MoE."""
    plan = cfg.family.moe_plan(cfg)
    if plan is None:
        return {}, []
    moe: dict[str, Any] = {"dispatcher": plan.dispatcher}
    if plan.flex_backend:
        moe["flex_backend"] = plan.flex_backend
        moe["flex_sms"] = plan.flex_sms
    moe.update(ep=plan.ep, etp=plan.etp, grouped_gemm=plan.grouped_gemm,
               permute_fusion=plan.permute_fusion,
               routing=plan.routing_phrase(),
               router_imbalance=plan.imbalance, delay_wgrad_compute=plan.delay_wgrad,
               router_fusion=plan.router_fusion, aux_loss_coeff=plan.aux_loss_coeff)
    on = (["shared-experts"] if plan.shared_expert_overlap else []) + \
        (["ep-a2a (combined 1F1B)"] if plan.a2a_overlap else [])
    return moe, on


def _layout_fields(cfg: Any) -> dict[str, Any]:
    """The plan options off their default that change how the run executes: HSDP's replicas
    and shard size, checkpointing of every n-th layer, each virtual stage's layers given;
    and, under context parallelism, its K/V exchange (the plan's or the stack's)."""
    p, out = cfg.parallel, {}
    if p.context_parallel_size > 1:
        out["cp_comm_type"] = cfg.software.cp_comm_type
    if p.data_parallel_replicate_size > 1:
        from .workloads.decoder.hsdp import shard_group
        out["hsdp"] = {"replicas": p.data_parallel_replicate_size,
                       "shard_ranks": shard_group(cfg)[1]}
    if cfg.train.recompute_every_n_layers > 1:
        out["recompute_every_n_layers"] = cfg.train.recompute_every_n_layers
    if cfg.train.recompute_modules is not None:
        out["recompute_modules"] = list(cfg.train.recompute_modules)
    group = cfg.other_microbatch_group
    if group is not None:   # Megatron's is PP
        out["microbatch_group"] = group
    if p.layers_per_virtual_stage is not None:
        out["layers_per_virtual_stage"] = list(p.layers_per_virtual_stage)
    elif cfg.model.architecture in _KERNEL_FAMILIES:
        from .workloads.decoder.split import stack_split_applies, virtual_stage_layers
        if stack_split_applies(cfg):   # the stack's own split (decoder/titan_split.py)
            out["layers_per_virtual_stage"] = virtual_stage_layers(cfg)
            out["pipeline_split"] = cfg.software.pipeline_split
    return out


def _resnet_fields(cfg: Any) -> dict[str, Any]:
    """ResNet's precision (16-bit dtypes run under ``torch.autocast`` with fp32 weights and
    gradients, docs/resnet.md), activation memory format and the training step's options
    around the model (``training_step``: ``zero_grad``, ``grad_scaler``, ``input_pipeline``,
    ``broadcast_buffers``); nothing for a proxy (its dtype is the messages')."""
    from .workloads.resnet.step import STEP_FIELDS
    m = cfg.model
    if m.compute != "model":
        return {}
    dtype = cfg.train.dtype
    step = {f: getattr(m, f) for f in STEP_FIELDS}
    step["broadcast_buffers"] = m.broadcast_buffers and cfg.dp > 1     # DDP's: dp > 1 only
    return {"precision": (f"{dtype} autocast (AMP), fp32 weights and gradients"
                          if dtype in ("fp16", "bf16") else dtype),
            "memory_format": m.memory_format, "training_step": step}


#: family → its own plan fields, for the families whose options the stack's kernel fields
#: do not cover
_FAMILY_FIELDS = {"resnet": _resnet_fields}


def plan_fields(cfg: Any) -> dict[str, Any]:
    """What the run's software stack switches on and off (the JSON result's ``plan``).

    Parameters
    ----------
    cfg : RunConfig
        A validated run config.

    Returns
    -------
    dict
        ``software_stack``; ``overlaps`` (on and active here) and ``overlaps_inactive`` (on,
        each with why it does not apply); and, for the families whose compute reads the
        stack's kernels (docs/compute.md), ``attention``, ``gemm_library`` (with the ceiling
        it picks when the device has no figure for it), ``precision``, ``host_dispatch`` (how
        kernels are launched: eager, compiled, cuda_graphs; docs/compute.md), ``fused`` and
        ``not_fused`` (kernel names); for a MoE model ``moe`` (``dispatcher``, with
        ``flex_backend`` and ``flex_sms`` (the SMs its kernels hold) for the flex
        dispatcher, ``ep``, ``etp``, ``grouped_gemm``,
        ``permute_fusion``, ``routing`` (naming, when dropless routing is neither given an
        imbalance nor forced, the hot rank's load it derives from a published statistic or
        the balance it assumes, and group-limited routing, e.g.
        ``group-limited 4 of 8 groups``), ``router_imbalance``,
        ``delay_wgrad_compute``,
        ``router_fusion``, ``aux_loss_coeff``) and
        its overlaps among ``overlaps``; when set, ``hsdp`` (``replicas``, ``shard_ranks``),
        ``recompute_every_n_layers``, ``recompute_modules`` and ``layers_per_virtual_stage``
        (given, or the stack's own split with ``pipeline_split`` naming its rule);
        under context parallelism ``cp_comm_type`` (``p2p`` or ``all_gather``, the plan's or
        the stack's);
        under ZeRO-3 in the
        families that read the kernels ``zero3_gathers`` (the plan line's words); ResNet's
        ``precision``, ``memory_format`` and ``training_step``.
    """
    sw = cfg.software
    kernels = cfg.model.architecture in _KERNEL_FAMILIES and \
        getattr(cfg.model, "compute", None) != "proxy"
    on, off = _overlaps(cfg, kernels)
    moe, moe_on = _moe_fields(cfg)
    out: dict[str, Any] = {"software_stack": sw.name, "overlaps": on + moe_on,
                           "overlaps_inactive": off}
    if moe:
        out["moe"] = moe
    out.update(_layout_fields(cfg))
    family = _FAMILY_FIELDS.get(cfg.model.architecture)
    if family is not None:
        out.update(family(cfg))
    if kernels:
        fusions = _SQUARED_RELU_FUSIONS if cfg.model.shape().squared_relu else _FUSIONS
        out.update(attention=_attention(cfg, sw.attention), gemm_library=_gemm(cfg),
                   precision=_precision(cfg),
                   host_dispatch=sw.host_dispatch,
                   fused=[n for f, n in fusions.items() if sw.kernels.get(f)],
                   not_fused=[n for f, n in fusions.items() if not sw.kernels.get(f)])
        if cfg.parallel.zero_stage == 3:
            out["zero3_gathers"] = _zero3(cfg)
    return out


def _zero3(cfg: Any) -> str:
    """How ZeRO-3 gathers, as the plan line says it (``per layer, 1 layer ahead, gathered
    once per iteration (pipelined)``; ``per tensor, 1 module ahead``; then HSDP's replicas
    when there are)."""
    from .workloads.decoder.fsdp import reshard_phrase
    from .workloads.decoder.zero3 import zero3_phrase
    return zero3_phrase(cfg.software) + reshard_phrase(cfg)


def _attention(cfg: Any, kind: str) -> str:
    """The stack's attention kernel as it runs the model: with attention sinks, the kernel
    that runs them (:func:`~ddlsim.simulator.kernels.attention.attention_label`)."""
    from .simulator.kernels.attention import attention_label
    shape = getattr(cfg.model, "shape", None)
    sinks = bool(getattr(shape(), "attention_sinks", False)) if callable(shape) else False
    return attention_label(kind, sinks)


def kernels_line(cfg: Any) -> str | None:
    """``software megatron-core-2024: attention flash2, GEMMs cublas-12, bf16, eager dispatch;
    fused: …; not fused: …`` for the report, or None for families that do not read the
    kernels."""
    plan = plan_fields(cfg)
    if "attention" not in plan:
        return None
    text = (f"software {plan['software_stack']}: attention {plan['attention']}, GEMMs "
            f"{plan['gemm_library']}, {plan['precision']}, {plan['host_dispatch']} dispatch; "
            f"fused: "
            f"{', '.join(plan['fused']) or 'none'}")
    if plan["not_fused"]:
        text += f"; not fused: {', '.join(plan['not_fused'])}"
    return text


def plan_of_dump(config: dict | None) -> dict[str, Any] | None:
    """:func:`plan_fields` of a result's resolved config (``Result.config``), or None when
    the result has none or it no longer validates."""
    if not config:
        return None
    import warnings

    from .config import load_config
    from .errors import ConfigError
    try:
        with warnings.catch_warnings():     # said once when the run was predicted
            warnings.simplefilter("ignore")
            return plan_fields(load_config(config))
    except (ConfigError, KeyError, TypeError, ValueError):
        return None
