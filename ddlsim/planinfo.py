"""What a run's software stack switches on and off, named: the attention kernel, the GEMM
library and the ceiling it picks, the precision recipe, the fused kernels on and off and the
overlaps on. Shown on the report's plan line and in the JSON result (``plan``), so that
nothing a stack decides is silent (``system.software: deepspeed`` runs Megatron's fused
softmax where the default stack runs FlashAttention-2).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plan_fields", "kernels_line", "plan_of_dump"]

#: the families whose compute model reads ``system.software.kernels`` (docs/compute.md); the
#: others read the stack's overlaps only
_KERNEL_FAMILIES = ("gpt", "llama")

#: fused-kernel switches and their short names
_FUSIONS = {"fused_bias_gelu": "bias-gelu", "fused_bias_dropout_add": "bias-dropout-add",
            "fused_layernorm": "layernorm", "fused_rope": "rope",
            "fused_cross_entropy": "cross-entropy", "fused_optimizer": "optimizer",
            "gradient_accumulation_fusion": "grad-accumulation"}

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
    sw = cfg.software
    if not kernels:
        return (["grad-reduce"] if sw.overlap_grad_reduce else []), {}
    from .workloads.decoder import tp_overlap
    from .workloads.decoder.overlap import inactive_reasons
    off = inactive_reasons(cfg)
    on = [label for field, label in _OVERLAPS.items()
          if field != "tp_async_backward" and sw.overlap.get(field) and field not in off]
    mode = tp_overlap.mode(cfg)
    if sw.tp_comm_overlap != "off" and "tp_comm_overlap" not in off:
        on.append(f"tp-comm {sw.tp_comm_overlap}")
    if mode == "async":
        on.append("tp-async backward")
    labels = {**_OVERLAPS, "tp_comm_overlap": "tp-comm"}
    return on, {labels[f]: why for f, why in off.items()}


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
        ``not_fused`` (kernel names).
    """
    sw = cfg.software
    kernels = cfg.model.architecture in _KERNEL_FAMILIES and \
        getattr(cfg.model, "compute", None) != "proxy"
    on, off = _overlaps(cfg, kernels)
    out: dict[str, Any] = {"software_stack": sw.name, "overlaps": on, "overlaps_inactive": off}
    if kernels:
        out.update(attention=sw.attention, gemm_library=_gemm(cfg), precision=_precision(cfg),
                   host_dispatch=sw.host_dispatch,
                   fused=[n for f, n in _FUSIONS.items() if sw.kernels.get(f)],
                   not_fused=[n for f, n in _FUSIONS.items() if not sw.kernels.get(f)])
    return out


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
