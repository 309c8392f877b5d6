"""Megatron-Core's rules on a plan's Mixture-of-Experts options (:func:`check_moe_plan`), checked
on the plan :func:`.moeplan.resolve_moe` resolves: the options need an MoE model, expert TP
divides the expert FFN, padding needs a capacity factor, the router's loss, expert bias, fused
router, group-limited routing and the flex dispatcher's options hold together.

References
----------
NVIDIA/Megatron-LM d7288711 ``megatron/core/transformer/transformer_config.py`` (the MoE
options' assertions), ``megatron/core/transformer/moe/router.py``,
``megatron/core/transformer/moe/moe_utils.py`` ``group_limited_topk``.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from .moe_routing import check_expert_bias
from .moeplan import MoEPlan, _stack_moe, resolve_moe

__all__ = ["check_moe_plan"]


def _check_flex(plan: MoEPlan, spec: Any) -> None:
    """The flex options ddlsim refuses: a backend or an SM count without the flex dispatcher
    (Megatron-Core would ignore them), an SM count below the one the kernels' rates are
    modelled at (:data:`~ddlsim.simulator.collectives.flex.MIN_RATED_SMS`), and a hot rank given with it (the kernels' traffic under it is not
    modelled; a derived default loads the hot rank's experts and leaves the traffic at the
    mean, which the routing phrase says)."""
    backend = None if spec is None else spec.flex_dispatcher_backend
    if backend is not None and plan.dispatcher != "flex":
        raise ValueError(f"parallel.moe.flex_dispatcher_backend = {backend!r} selects the flex "
                         f"dispatcher's kernels, but token_dispatcher_type = "
                         f"{plan.dispatcher!r}; set token_dispatcher_type: flex or drop it")
    sms = None if spec is None else spec.flex_dispatcher_num_sms
    if sms is not None and plan.dispatcher != "flex":
        raise ValueError(f"parallel.moe.flex_dispatcher_num_sms = {sms} sizes the flex "
                         f"dispatcher's kernels, but token_dispatcher_type = "
                         f"{plan.dispatcher!r}; set token_dispatcher_type: flex or drop it")
    if sms is not None:
        from ...simulator.collectives.flex import MIN_RATED_SMS
        least, why = MIN_RATED_SMS[plan.flex_backend]
        if sms < least:
            raise ValueError(f"parallel.moe.flex_dispatcher_num_sms = {sms} with the "
                             f"{plan.flex_backend} backend: its kernels' rates are modelled "
                             f"from {least} SMs up ({why}); allowed: {least} or more, below "
                             f"the device's SM count")
    if plan.dispatcher == "flex" and plan.imbalance != 1.0 and plan.imbalance_basis == "given":
        raise ValueError(f"parallel.moe.router_imbalance = {plan.imbalance} with "
                         "token_dispatcher_type = 'flex': the DeepEP/HybridEP kernels are "
                         "modelled under balanced routing only (docs/moe.md); use 1 or the "
                         "alltoall dispatcher")


def check_moe_plan(cfg: Any) -> None:
    """Megatron-Core's rules on the MoE options (ValueError, one paragraph each): the options
    need an MoE model; expert TP divides the expert FFN; padding needs a capacity factor;
    a capacity factor needs aux_loss, seq_aux_loss or none balancing; shared-expert overlap
    needs shared experts and the alltoall dispatcher; forced balance means no hot rank."""
    m, p = cfg.model, cfg.parallel
    if not m.num_local_experts:
        for name in ("moe", "expert_tensor_parallel_size"):
            if getattr(p, name) is not None:
                raise ValueError(f"parallel.{name} = {getattr(p, name)!r} describes "
                                 f"Mixture-of-Experts layers, but model {m.name!r} has none "
                                 "(num_local_experts = 0); remove it")
        return
    sh = m.shape()
    if sh.f_e % p.etp:
        raise ValueError(f"parallel.expert_tensor_parallel_size = {p.etp} does not divide the "
                         f"expert FFN size {sh.f_e} (moe_intermediate_size): each expert-TP "
                         "rank holds an equal slice of every expert; use a divisor of it")
    try:
        plan = resolve_moe(cfg)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if plan.pad and plan.capacity_factor is None:
        raise ValueError("parallel.moe.pad_expert_input_to_capacity = true needs a capacity "
                         "factor (model.capacity_factor, Megatron's --moe-expert-capacity-"
                         "factor); set one or drop the padding")
    if plan.capacity_factor is not None and plan.balancing == "sinkhorn":
        raise ValueError(f"model.capacity_factor = {plan.capacity_factor} with "
                         "parallel.moe.router_load_balancing_type = 'sinkhorn': Megatron-Core "
                         "drops tokens with aux_loss, seq_aux_loss or none balancing only")
    if plan.shared_expert_overlap and (not sh.shared_experts or plan.dispatcher != "alltoall"):
        raise ValueError(f"parallel.moe.shared_expert_overlap = true needs shared experts "
                         f"(the model has {sh.shared_experts}) and token_dispatcher_type = "
                         f"'alltoall' (got {plan.dispatcher!r})")
    if plan.imbalance != 1.0 and not 1 < plan.ep >= plan.imbalance:
        raise ValueError(f"parallel.moe.router_imbalance = {plan.imbalance} is the most loaded "
                         f"expert-parallel rank's tokens over the mean, so it needs "
                         f"expert_model_parallel_size > 1 and at most EP = {plan.ep} (one rank "
                         "receiving every token)")
    spec = p.moe
    if (spec is not None and spec.router_force_load_balancing
            and plan.imbalance_basis == "given" and plan.imbalance != 1.0):
        raise ValueError(f"parallel.moe.router_force_load_balancing = true routes by random "
                         f"logits, whose hottest expert-parallel rank ddlsim derives (top-k "
                         f"sampling), but router_imbalance = {plan.imbalance} is given; leave "
                         "router_imbalance unset (or 1, to time perfect balance)")
    _check_flex(plan, spec)
    sm_count = cfg.system.device.sm_count
    if plan.flex_sms is not None and sm_count and plan.flex_sms >= sm_count:
        raise ValueError(f"parallel.moe.flex_dispatcher_num_sms = {plan.flex_sms}: the flex "
                         f"kernels would hold every SM of system.device "
                         f"{cfg.system.device.name!r} ({sm_count}); allowed: fewer than "
                         f"{sm_count}")
    _check_router(plan, spec, cfg.software.name)
    _check_groups(plan, spec, sh)


def _check_groups(plan: MoEPlan, spec: Any, sh: Any) -> None:
    """Group-limited routing's rules (Megatron-LM d7288711 ``transformer_config.py``: the
    groups need each other, divide the experts, and hold the top-k; ``moe_utils.py``
    ``group_limited_topk``), and the expert layout the flex dispatcher's traffic is derived
    for (:func:`~ddlsim.simulator.collectives.flex.hit_probability`): each expert-parallel
    rank's experts fill whole groups or lie inside one."""
    if spec is not None and (spec.router_num_groups is None) != (spec.router_group_topk is None):
        raise ValueError(f"parallel.moe.router_num_groups = {spec.router_num_groups} and "
                         f"router_group_topk = {spec.router_group_topk}: group-limited routing "
                         "needs both (Megatron-LM's --moe-router-num-groups and "
                         "--moe-router-group-topk); set both or neither")
    G, M, E, k = plan.groups, plan.topk_groups, sh.experts, sh.top_k
    where = plan.sources.get("router_groups", "")
    if E % G or not 1 <= M <= G or k > M * (E // G):
        raise ValueError(f"group-limited routing ({where}): {M} of {G} groups of {E} experts "
                         f"with top-k {k}; allowed: groups dividing the experts, 1 <= "
                         f"topk groups <= groups, and top-k at most the chosen groups' "
                         f"experts (topk groups x experts/groups)")
    per_rank, m = E // plan.ep, E // G
    if plan.group_limited and plan.dispatcher == "flex" and per_rank % m and m % per_rank:
        raise ValueError(f"group-limited routing ({where}) with the flex dispatcher: each of "
                         f"the EP{plan.ep} ranks holds {per_rank} consecutive experts, which "
                         f"neither fill whole groups of {m} nor lie inside one; the "
                         "deduplicated traffic is derived for nested layouts only (docs/moe.md); "
                         "use an expert-parallel size that nests with the groups")


def _check_router(plan: MoEPlan, spec: Any, stack: str) -> None:
    """The router options Megatron-Core refuses or ignores: a loss coefficient with sinkhorn
    (asserted, Megatron-LM d7288711 ``router.py`` line 248) or with ``none`` balancing (no loss
    is computed: lines 263-283); the fused router on a stack whose code has none."""
    if plan.aux_loss_coeff > 0 and plan.balancing in ("sinkhorn", "none"):
        raise ValueError(f"parallel.moe.aux_loss_coeff = {plan.aux_loss_coeff:g} with "
                         f"router_load_balancing_type = {plan.balancing!r}: Megatron-Core "
                         "computes the load-balancing loss with aux_loss or seq_aux_loss only; "
                         "set one of them or aux_loss_coeff: 0")
    check_expert_bias(plan, spec)
    if spec is not None and spec.router_fusion and "router_fusion" not in _stack_moe(stack):
        raise ValueError(f"parallel.moe.router_fusion = true, but software stack {stack!r} "
                         "has no fused router (no moe.router_fusion in its software.yaml "
                         "entry; Megatron-LM's --moe-router-fusion came in c08d89bea0, "
                         "2025-08-17); use megatron-core-2025 or drop it")
