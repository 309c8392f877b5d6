"""Which ``train.recompute_modules`` a model and plan can take (the checks of
:mod:`.recompute_modules`, Megatron-Core's selective recomputation by module).

:func:`check_modules` refuses a module that recomputes nothing in the model, one that
Megatron-Core itself refuses for the plan (NVIDIA/Megatron-LM d7288711
``transformer_config.py`` lines 1380-1389), and one whose recomputation ddlsim does not model.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from .recompute_modules import RECOMPUTE_MODULES, separate_norms

__all__ = ["check_modules"]


def check_modules(modules: tuple[str, ...], shape: Any, sw: Any,
                  moe_plan: Any, cp: int) -> None:
    """Refuse a module list this model or plan cannot take: a module that recomputes
    nothing in the model (Megatron-Core runs it as a no-op, which ddlsim does not let pass
    silently), ``mla_up_proj`` without MLA and ``moe_act`` without grouped GEMM (d7288711
    transformer_config.py lines 1380-1389), and what is not modelled (``mlp``, ``mla_up_proj``
    under context parallelism ``cp`` > 1; under TP > 1 their collectives are recomputed:
    :mod:`.recompute_comms`), and
    ``moe`` under the combined 1F1B, which Megatron-Core asserts against (d7288711
    transformer_config.py lines 2109-2111); ``moe_plan``: the resolved MoE plan, None for a
    dense model).

    Raises
    ------
    ConfigError
        Naming ``train.recompute_modules``, the module and what is allowed.
    """
    field = f"train.recompute_modules = {list(modules)!r}"
    for name in modules:
        nothing = _nothing(name, shape, sw)
        if nothing:
            raise ConfigError(f"{field}: {name!r} recomputes nothing in this model "
                              f"({nothing}); remove it")
        why = _refusal(name, modules, shape, moe_plan) or _cp_refusal(name, cp)
        if why:
            raise ConfigError(f"{field}: {why}")


def _nothing(name: str, shape: Any, sw: Any) -> str:
    """Why ``name`` recomputes nothing in the model ('' when it recomputes something)."""
    layers = [shape.is_moe_layer(i) for i in range(shape.layers)]
    if RECOMPUTE_MODULES[name].layers == "moe" and not any(layers):
        return "it has no Mixture-of-Experts layers"
    if name == "shared_experts" and not shape.shared_experts:
        return "it has no shared experts"
    if name == "mlp" and all(layers):
        return "it has no dense MLP layers"
    if name == "layernorm" and not any(separate_norms(shape, sw, m) for m in set(layers)):
        return ("every norm is fused into the next GEMM by the stack (kernels.fused_layernorm)"
                " and no layer has a separate pre-MLP norm")
    return ""


def _refusal(name: str, modules: tuple[str, ...], shape: Any, moe_plan: Any) -> str:
    """Why the plan cannot take ``name`` (Megatron-Core's checks, or not modelled), or ''."""
    a2a = moe_plan is not None and moe_plan.a2a_overlap
    if name == "moe_act" and moe_plan is not None and not moe_plan.grouped_gemm:
        return ("'moe_act' needs parallel.moe.grouped_gemm: true (Megatron-LM d7288711 "
                "transformer_config.py lines 1380-1383)")
    if name == "mla_up_proj" and shape.mla is None:
        return ("'mla_up_proj' needs Multi-head Latent Attention (Megatron-LM d7288711 "
                "transformer_config.py lines 1385-1389); this model has none")
    if name == "moe" and a2a:   # a framework rule, not a modelling gap
        return ("Megatron-Core cannot recompute 'moe' under parallel.moe.overlap_expert_"
                "parallel_comm (Megatron-LM d7288711 transformer_config.py lines 2109-2111: "
                "'disable moe in recompute_modules when enabling overlap_moe_expert_parallel_"
                "comm'); drop 'moe' or the overlap")
    return ""


def _cp_refusal(name: str, cp: int) -> str:
    """Why ``name`` is not modelled under context parallelism ``cp`` > 1, or ''. Megatron-Core
    takes every module with CP (d7288711: ``transformer_config.py`` lines 1360-1433 check
    nothing of CP; ``transformer_layer.py``'s one CP branch, line 314, picks the attention's
    ``cp_comm_type``, and its recompute switches, lines 404-473, read no CP size; the MoE
    block that ``moe`` checkpoints, ``moe/moe_layer.py`` lines 578-583 and 599-620, holds the
    dispatch and the combine whatever the CP size). ddlsim's CP layers rebuild the norms,
    the attention core and the MoE layer's modules on the rank's ``s/cp`` tokens; a dense
    layer's MLP and MLA's up projections are not modelled there."""
    if cp > 1 and name in ("mlp", "mla_up_proj"):
        return (f"{name!r} is modelled without context parallelism only (context_parallel_"
                f"size is {cp}); use CP 1 or drop the module")
    return ""
