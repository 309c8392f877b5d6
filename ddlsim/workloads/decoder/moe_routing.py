"""The router's balancing options of a plan, resolved: the balancing type, the score function
and auxiliary-loss-free balancing (expert bias) with its update rate; each ``parallel.moe``'s
field given, else the model section's (its HuggingFace config.json's: DeepSeek's ``seq_aux``,
``scoring_func``, ``topk_method``), else Megatron-Core's default; and the rules Megatron-Core
holds them to (:func:`check_expert_bias`). :mod:`.moeplan` reads them into a
:class:`~.moeplan.MoEPlan`; the load they imply is :mod:`.moe_balance`'s.

References
----------
NVIDIA/Megatron-LM d98e8a64 (2026-08-22): ``megatron/core/transformer/transformer_config.py``
(defaults: ``moe_router_load_balancing_type = "aux_loss"`` line 743,
``moe_router_score_function = "softmax"`` line 808, ``moe_router_enable_expert_bias = False``
line 816, ``moe_router_bias_update_rate = 1e-3`` line 821; the score-function rule lines
2617-2625), ``megatron/core/transformer/moe/router.py`` (``routing`` lines 746-835),
``megatron/core/distributed/finalize_model_grads.py`` (``_update_router_expert_bias`` lines
334-371, called at line 682).
"""

from __future__ import annotations

from typing import Any

from .moe_balance import SOURCE_BIAS_RATE

__all__ = ["balancing_type", "score_function", "expert_bias", "check_expert_bias",
           "BIAS_SCORES"]

#: where Megatron-Core's defaults are read
_MEGATRON = "Megatron-LM d98e8a64 transformer_config.py"


def _from_model(given: dict, field: str, cfg: Any, key: str, sources: dict,
                default: tuple[Any, str]) -> Any:
    """``parallel.moe.<field>`` given, else the model section's ``key`` (its config.json's),
    else ``default`` (value, source); where it came from in ``sources``."""
    if given.get(field) is not None:
        sources[field] = f"parallel.moe.{field}"
        return given[field]
    model = getattr(cfg.model, key, None)
    if model is not None:
        sources[field] = f"model.{key}"
        return model
    sources[field] = default[1]
    return default[0]


def balancing_type(cfg: Any, given: dict, sources: dict) -> str:
    """The balancing type: given, else ``seq_aux_loss`` where the model's config.json asks a
    per-sequence loss (DeepSeek's ``seq_aux: true`` beside ``aux_loss_alpha``: the model
    section's ``seq_aux``), else Megatron's default ``aux_loss`` (line 743)."""
    spec = cfg.parallel.moe
    if spec is not None and "router_load_balancing_type" in spec.model_fields_set:
        sources["router_load_balancing_type"] = "parallel.moe.router_load_balancing_type"
        return given["router_load_balancing_type"]
    if getattr(cfg.model, "seq_aux", None):
        sources["router_load_balancing_type"] = "model.seq_aux"
        return "seq_aux_loss"
    sources["router_load_balancing_type"] = (f"{_MEGATRON} line 743: "
                                             "moe_router_load_balancing_type = 'aux_loss'")
    return "aux_loss"


def score_function(cfg: Any, given: dict, sources: dict) -> str:
    """``--moe-router-score-function``: given, else the model's ``scoring_func`` (its
    config.json's), else Megatron's default softmax (line 808)."""
    return _from_model(given, "router_score_function", cfg, "scoring_func", sources,
                       ("softmax", f"{_MEGATRON} line 808: moe_router_score_function = "
                                   "'softmax'"))


def expert_bias(cfg: Any, given: dict, sources: dict) -> tuple[bool, float]:
    """Auxiliary-loss-free balancing and its update rate: given, else on where the model's
    config.json routes with DeepSeek-V3's ``noaux_tc`` (the model section's ``topk_method``:
    its ``e_score_correction_bias`` is that bias), else Megatron's default off (line 816);
    the rate given, else Megatron's default 1e-3 (line 821)."""
    if given.get("router_enable_expert_bias") is not None:
        sources["router_enable_expert_bias"] = "parallel.moe.router_enable_expert_bias"
        on = bool(given["router_enable_expert_bias"])
    elif getattr(cfg.model, "topk_method", None) == "noaux_tc":
        sources["router_enable_expert_bias"] = "model.topk_method"
        on = True
    else:
        sources["router_enable_expert_bias"] = (f"{_MEGATRON} line 816: "
                                                "moe_router_enable_expert_bias = False")
        on = False
    rate = given.get("router_bias_update_rate")
    if on:
        sources["router_bias_update_rate"] = (
            "parallel.moe.router_bias_update_rate" if rate is not None
            else f"{_MEGATRON} line 821: moe_router_bias_update_rate = 1e-3")
    return on, float(SOURCE_BIAS_RATE if rate is None else rate)


#: the score functions expert bias accepts (Megatron-LM d98e8a64 ``transformer_config.py``
#: lines 2617-2625: a ValueError for any other)
BIAS_SCORES = ("sigmoid", "sqrtsoftplus")


def check_expert_bias(plan: Any, spec: Any) -> None:
    """Auxiliary-loss-free balancing's rules: Megatron-Core refuses the bias with a softmax
    router (Megatron-LM d98e8a64 ``transformer_config.py`` lines 2617-2625) and ignores it
    under sinkhorn routing (``router.py`` ``routing`` lines 771-789: only the top-k branch
    passes ``expert_bias``); an update rate without the bias is read by nothing
    (``finalize_model_grads.py`` line 682 updates only with the bias on)."""
    where = plan.sources.get("router_enable_expert_bias", "")
    if plan.expert_bias and plan.score_function not in BIAS_SCORES:
        raise ValueError(f"parallel.moe.router_enable_expert_bias = true ({where}) with "
                         f"router_score_function = {plan.score_function!r} "
                         f"({plan.sources.get('router_score_function', '')}): Megatron-Core's "
                         "expert bias needs the sigmoid or sqrtsoftplus score function; set "
                         "router_score_function: sigmoid or router_enable_expert_bias: false")
    if plan.expert_bias and plan.balancing == "sinkhorn":
        raise ValueError(f"parallel.moe.router_enable_expert_bias = true ({where}) with "
                         "router_load_balancing_type = 'sinkhorn': Megatron-Core's sinkhorn "
                         "routing ignores the expert bias; use aux_loss, seq_aux_loss or none "
                         "balancing, or drop the bias")
    rate = None if spec is None else spec.router_bias_update_rate
    if rate is not None and not plan.expert_bias:
        raise ValueError(f"parallel.moe.router_bias_update_rate = {rate:g} without expert bias "
                         f"(router_enable_expert_bias is off: {where}): Megatron-Core updates "
                         "no bias then; set router_enable_expert_bias: true or drop the rate")
