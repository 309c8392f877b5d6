"""The checks that apply a stack's rules: to one config (:func:`check_stack_rules`,
:func:`broken_rules`, :func:`what_if_note`) and to arrays of plans (:func:`stack_rejections`),
with the rules each stack of software.yaml declares (:func:`stack_rules`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError
from .facts import PlanFacts, StackRule, moe_plan, rules

__all__ = ["stack_rules", "broken_rules", "check_stack_rules", "stack_rejections",
           "what_if_note", "sp_rules"]


def stack_rules(stack: str) -> list[tuple[StackRule, str]]:
    """``(rule, source)`` for each rule the stack ``stack`` declares, in file order.

    Raises
    ------
    ConfigError
        if software.yaml names a rule that is not registered, or gives it no source.
    """
    from ..software import _stack_table
    known = rules()
    out = []
    for name, source in (_stack_table()[stack].get("rules") or {}).items():
        if name not in known or not (isinstance(source, str) and source.strip()):
            raise ConfigError(f"software.yaml: stack {stack!r} declares rule {name!r}, which "
                              f"{'is not registered' if name not in known else 'has no source'};"
                              f" registered rules: {', '.join(known)}")
        out.append((known[name], source))
    return out


def runs_own_program(cfg: Any) -> bool:
    """Whether ``cfg``'s ranks run a program of their own rather than the stack's framework:
    a proxy of spcl/DNN-cpp-proxies, a C++ MPI program whose schedule is its own (the GPT
    proxies' ``model.program`` ``proxy_gpipe`` or ``proxy_one_step``,
    :mod:`ddlsim.workloads.decoder.programs`; any family's ``model.compute: proxy``, the
    proxy's sleeps). The stack's rules say what its framework's program runs, so they do not
    judge a proxy; the family's own checks of the proxy's options do (e.g.
    :mod:`ddlsim.workloads.decoder.proxy`)."""
    return (getattr(cfg.model, "program", "megatron") != "megatron"
            or getattr(cfg.model, "compute", "model") == "proxy")


def broken_rules(cfg: Any) -> list[tuple[StackRule, str]]:
    """The rules of ``cfg``'s stack that its plan breaks, with their sources (none for a
    program of its own, :func:`runs_own_program`)."""
    if runs_own_program(cfg):
        return []
    facts = PlanFacts.of_config(cfg)
    return [(rule, src) for rule, src in stack_rules(cfg.software.name)
            if bool(np.any(rule.rejects(facts)))]


def sp_rules(cfg: Any) -> list[str]:
    """The names of ``cfg``'s stack's rules that refuse its plan without sequence
    parallelism (``tp_needs_sp``, ``moe_tp_needs_sp``): where there are any, an unset
    ``sequence_parallel`` is on (``RunConfig._plan_from_stack``) and the plan line names
    the first."""
    off = cfg if not cfg.parallel.sequence_parallel else cfg.model_copy(update={
        "parallel": cfg.parallel.model_copy(update={"sequence_parallel": False})})
    return [rule.name for rule, _ in broken_rules(off)
            if "parallel.sequence_parallel" in rule.fields]


def _shown(cfg: Any, path: str) -> str:
    section, key = path.rsplit(".", 1)
    if section == "parallel.moe":   # the resolved value (unset: the stack's)
        plan = moe_plan(cfg)
        value = {"overlap_expert_parallel_comm": plan.a2a_overlap,
                 "delay_wgrad_compute": plan.delay_wgrad,
                 "token_dispatcher_type": plan.dispatcher,
                 "shared_expert_overlap": plan.shared_expert_overlap,
                 "flex_dispatcher_backend": plan.flex_backend,
                 "pad_expert_input_to_capacity": plan.pad,
                 "grouped_gemm": plan.grouped_gemm, "permute_fusion": plan.permute_fusion,
                 "router_load_balancing_type": plan.balancing,
                 "router_score_function": plan.score_function,
                 "router_enable_expert_bias": plan.expert_bias,
                 "router_num_groups": plan.groups, "router_group_topk": plan.topk_groups,
                 "router_dtype": plan.router_dtype,
                 "router_force_load_balancing": plan.forced_balance}[key]
        return f"{path} = {value!r}"
    value = getattr(cfg.software, key) if key in _SOFTWARE_FIELDS else \
        getattr(getattr(cfg, section), key)
    return f"{path} = {value!r}"


#: fields the rules name whose value is the resolved stack's (stack ← system ← plan)
_SOFTWARE_FIELDS = ("overlap_p2p_comm", "tp_comm_overlap", "compile", "fp8_recipe",
                    "zero3_implementation", "gradient_accumulation_fusion",
                    "fused_cross_entropy", "cross_entropy_fusion_impl", "fp8_param_gather",
                    "overlap_param_gather", "host_dispatch", "fused_bias_gelu")


def check_stack_rules(cfg: Any) -> None:
    """Refuse a plan that ``cfg``'s software stack cannot run, naming the stack, the rule,
    the plan's values and the rule's source; nothing when ``system.software.what_if`` is
    true (the report marks the prediction as a what-if instead).

    Raises
    ------
    ValueError
        (inside ``RunConfig`` validation, which reports it as a ConfigError).
    """
    if cfg.software.what_if:
        return
    broken = broken_rules(cfg)
    if not broken:
        return
    stack = cfg.software.name
    rule, source = broken[0]
    values = ", ".join(_shown(cfg, p) for p in rule.fields)
    more = (f" (it also breaks: {', '.join(r.name for r, _ in broken[1:])})"
            if len(broken) > 1 else "")
    raise ValueError(
        f"software stack {stack!r} cannot run {rule.reason}: {values} (rule {rule.name}"
        f"{more}; source: {source}). Change the plan or system.software, or "
        f"set system.software: {{stack: {stack}, what_if: true}} to predict it anyway as a "
        f"what-if the stack cannot run")


def what_if_note(cfg: Any) -> str | None:
    """``what-if: megatron-core-2024 cannot run ZeRO-2 (…)`` for a what-if plan that breaks
    its stack's rules; None when the stack runs the plan."""
    broken = broken_rules(cfg)
    if not broken:
        return None
    return (f"what-if: {cfg.software.name} cannot run "
            + "; ".join(f"{r.reason} (rule {r.name})" for r, _ in broken))


def stack_rejections(stack: str, facts: PlanFacts) -> list[tuple[str, np.ndarray]]:
    """``(reason, rejected mask)`` of each rule of ``stack`` on the plans ``facts`` (arrays
    that broadcast together): the search's form of :func:`check_stack_rules`."""
    return [(f"{stack} cannot run {rule.reason} (rule {rule.name})",
             np.asarray(rule.rejects(facts), dtype=bool)) for rule, _ in stack_rules(stack)]
