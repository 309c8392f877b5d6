"""What each software stack can run: named plan rules, declared beside the stacks.

A :class:`StackRule` is a predicate over a plan (:class:`PlanFacts`) that is true where the
framework refuses the plan (an assertion in its argument checks, a feature it does not have),
with a short reason. The rules are registered here by name (:func:`stack_rule`); each stack of
``ddlsim/data/software.yaml`` lists under ``rules:`` the names of those it obeys, each with
its source (the framework's code at a named commit)::

    deepspeed:
      rules:
        pipeline_zero: "DeepSpeed 38327e07 deepspeed/runtime/pipe/engine.py lines 77-78: ..."

The same rule objects judge one config (``RunConfig`` validation, via
:func:`check_stack_rules`: ``ddlsim predict``, ``sweep`` and ``ddlsim.predict``) and arrays of
plans (:func:`stack_rejections`: ``ddlsim search``). ``system.software: {stack: …, what_if:
true}`` lets a plan the stack cannot run be predicted anyway; the report says it is a what-if
(:func:`broken_rules`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .errors import ConfigError
from .workloads.registry import get_family

__all__ = ["PlanFacts", "StackRule", "stack_rule", "rules", "stack_rules", "broken_rules",
           "check_stack_rules", "stack_rejections", "what_if_note"]


@dataclass(frozen=True)
class PlanFacts:
    """The plan as the stack rules read it: numpy scalars for one config, or arrays that
    broadcast together for many plans (the search's grid).

    ``interleaved`` / ``one_f_one_b``: the schedule is Megatron's interleaved 1F1B / plain
    1F1B; ``p2p_overlap``: the resolved ``overlap_p2p_comm`` (stack ← system ← plan);
    ``tp_overlap``: the resolved ``tp_comm_overlap`` is not ``off``; ``compiled``: the
    stack's ``compile``. The last two are properties of a search context, not of a plan:
    facts made without them take False.
    """

    tp: Any
    pp: Any
    cp: Any
    zero: Any
    sp: Any
    interleaved: Any
    one_f_one_b: Any
    p2p_overlap: Any
    tp_overlap: Any = False
    compiled: Any = False
    #: the resolved ``tp_comm_overlap`` is TransformerEngine's userbuffers (``bulk``/``pipelined``)
    te_tp_overlap: Any = False
    #: the resolved ``tp_comm_overlap`` is PyTorch's symmetric-memory async TP (``torch_async``)
    torch_tp_overlap: Any = False
    #: the model has routed experts; its expert-parallel, expert-TP and data-parallel sizes
    #: (facts made without them are of a dense plan: the MoE rules hold)
    moe: Any = False
    ep: Any = 1
    etp: Any = 1
    dp: Any = 1
    #: the resolved ``parallel.moe`` options the expert-parallel overlap rules read (facts
    #: made without them: overlap off), the full recomputation and a 32-bit model
    a2a_overlap: Any = False
    delay_wgrad: Any = False
    allgather_dispatch: Any = False
    shared_overlap: Any = False
    #: the flex token dispatcher, its DeepEP backend, and padding to capacity
    flex_dispatch: Any = False
    deepep: Any = False
    pad: Any = False
    full_recompute: Any = False
    fp32: Any = False
    #: only every n-th layer is checkpointed (``train.recompute_every_n_layers`` > 1)
    layer_ac: Any = False
    #: every virtual stage's layers are given (``parallel.layers_per_virtual_stage``)
    given_split: Any = False
    #: replicas of FSDP shards (``parallel.data_parallel_replicate_size`` > 1)
    hsdp: Any = False
    #: ``train.recompute_modules`` is given; it names ``moe_act`` or ``layernorm``; it names
    #: ``shared_experts``; FP8 under Transformer Engine's delayed scaling
    recompute_modules: Any = False
    norm_act_recompute: Any = False
    shared_recompute: Any = False
    fp8_delayed: Any = False
    #: FP8 under Transformer Engine's current scaling (``te_current``), under either of
    #: Transformer Engine's recipes, under one of torchao's (``tensorwise``, ``rowwise``)
    fp8_current: Any = False
    fp8_te: Any = False
    fp8_torchao: Any = False

    @classmethod
    def of(cls, **values: Any) -> "PlanFacts":
        """Facts from ``values`` (scalars or arrays), each as a numpy array; ``tp_overlap``
        and ``compiled`` default to False."""
        return cls(**{f.name: np.asarray(values.get(f.name, f.default)) for f in fields(cls)})

    @classmethod
    def of_config(cls, cfg: Any) -> "PlanFacts":
        """The facts of a :class:`~ddlsim.config.RunConfig`'s plan."""
        p = cfg.parallel
        return cls.of(tp=p.tp, pp=p.pp, cp=p.cp, zero=p.zero_stage, sp=p.sequence_parallel,
                      interleaved=p.schedule == "interleaved", one_f_one_b=p.schedule == "1f1b",
                      p2p_overlap=bool(cfg.software.overlap_p2p_comm),
                      moe=bool(getattr(cfg.model, "num_local_experts", 0)), ep=p.ep,
                      etp=p.etp, dp=p.data_parallel_size or 1,
                      tp_overlap=p.tp > 1 and cfg.software.tp_comm_overlap != "off",
                      te_tp_overlap=p.tp > 1
                      and cfg.software.tp_comm_overlap in ("bulk", "pipelined"),
                      torch_tp_overlap=p.tp > 1 and cfg.software.tp_comm_overlap == "torch_async",
                      compiled=bool(cfg.software.compile), **_moe_facts(cfg),
                      layer_ac=cfg.train.recompute_every_n_layers > 1,
                      given_split=p.layers_per_virtual_stage is not None,
                      hsdp=p.data_parallel_replicate_size > 1, **_recompute_facts(cfg))


def _recompute_facts(cfg: Any) -> dict:
    """The facts of ``train.recompute_modules`` the stack rules read."""
    mods = set(cfg.train.recompute_modules or ())
    return {"recompute_modules": cfg.train.recompute_modules is not None,
            "norm_act_recompute": bool(mods & {"moe_act", "layernorm"}),
            "shared_recompute": "shared_experts" in mods,
            **_fp8_facts(cfg)}


def _fp8_facts(cfg: Any) -> dict:
    """The FP8 recipe facts (:class:`PlanFacts`); all false unless ``train.dtype`` is fp8."""
    recipe = cfg.software.fp8_recipe if cfg.train.dtype == "fp8" else None
    return {"fp8_delayed": recipe == "te_delayed", "fp8_current": recipe == "te_current",
            "fp8_te": recipe in ("te_delayed", "te_current"),
            "fp8_torchao": recipe in ("tensorwise", "rowwise")}


def _moe_facts(cfg: Any) -> dict:
    """The MoE options the overlap rules read, resolved as the trace resolves them (the
    family's :meth:`~ddlsim.workloads.registry.WorkloadFamily.moe_plan`); none for a dense
    model or a stack that does not say how it runs MoE layers (the MoE checks refuse that
    plan)."""
    try:
        plan = get_family(cfg.model.architecture).moe_plan(cfg)
    except ConfigError:
        plan = None
    out = {"full_recompute": cfg.train.recompute == "full", "fp32": cfg.train.dtype == "fp32"}
    if plan is not None:
        out.update(a2a_overlap=plan.a2a_overlap, delay_wgrad=plan.delay_wgrad,
                   allgather_dispatch=plan.dispatcher == "allgather",
                   shared_overlap=plan.shared_expert_overlap,
                   flex_dispatch=plan.dispatcher == "flex", deepep=plan.flex_backend == "deepep",
                   pad=plan.pad)
    return out


@dataclass(frozen=True)
class StackRule:
    """A plan a framework refuses: ``rejects(facts)`` is true (element-wise on arrays) where
    the stack cannot run the plan; ``reason`` says what it cannot run, and ``fields`` names the
    config fields the rule reads (for the error message)."""

    name: str
    reason: str
    fields: tuple[str, ...]
    rejects: Callable[[PlanFacts], Any]


_RULES: dict[str, StackRule] = {}


def stack_rule(name: str, reason: str, *fields_read: str):
    """Decorator: register ``rejects(facts)`` as the stack rule ``name``."""
    def wrap(fn: Callable[[PlanFacts], Any]) -> Callable[[PlanFacts], Any]:
        _RULES[name] = StackRule(name, reason, fields_read, fn)
        return fn
    return wrap


def rules() -> dict[str, StackRule]:
    """Every registered rule, by name."""
    return dict(_RULES)


# ------------------------------------------------------------------------------- the rules
# Each predicate is written once with numpy operators, so it runs on one plan (0-d arrays)
# and on the search's arrays alike. Sources live beside each stack in software.yaml.
@stack_rule("no_distributed_optimizer", "ZeRO-1/2 (it has no distributed optimizer)",
            "parallel.zero_stage")
def _no_distributed_optimizer(f: PlanFacts):
    return (f.zero == 1) | (f.zero == 2)


@stack_rule("distributed_optimizer_is_zero1",
            "ZeRO-2 (its distributed optimizer shards the optimizer state, not the gradients)",
            "parallel.zero_stage")
def _distributed_optimizer_is_zero1(f: PlanFacts):
    return f.zero == 2


@stack_rule("pipeline_zero", "ZeRO-2/3 with pipeline parallelism",
            "parallel.zero_stage", "parallel.pipeline_model_parallel_size")
def _pipeline_zero(f: PlanFacts):
    return (f.pp > 1) & (f.zero >= 2)


@stack_rule("pipeline_1f1b_only", "a pipeline schedule other than 1F1B",
            "parallel.schedule", "parallel.pipeline_model_parallel_size")
def _pipeline_1f1b_only(f: PlanFacts):
    return (f.pp > 1) & ~f.one_f_one_b


@stack_rule("interleaved_needs_pp3", "the interleaved schedule with PP <= 2",
            "parallel.schedule", "parallel.pipeline_model_parallel_size")
def _interleaved_needs_pp3(f: PlanFacts):
    return f.interleaved & (f.pp <= 2)


@stack_rule("interleaved_blocking_needs_pp3",
            "the interleaved schedule with PP <= 2 and overlap_p2p_comm off",
            "parallel.schedule", "parallel.pipeline_model_parallel_size",
            "parallel.overlap_p2p_comm")
def _interleaved_blocking_needs_pp3(f: PlanFacts):
    return f.interleaved & (f.pp <= 2) & ~f.p2p_overlap


@stack_rule("no_sequence_parallel", "sequence parallelism", "parallel.sequence_parallel")
def _no_sequence_parallel(f: PlanFacts):
    return f.sp


@stack_rule("no_context_parallel", "context parallelism (ring or all-gather attention)",
            "parallel.context_parallel_size")
def _no_context_parallel(f: PlanFacts):
    return f.cp > 1


@stack_rule("zero3_pipeline", "ZeRO-3 with pipeline parallelism",
            "parallel.zero_stage", "parallel.pipeline_model_parallel_size")
def _zero3_pipeline(f: PlanFacts):
    return (f.pp > 1) & (f.zero == 3)


@stack_rule("no_zero12", "ZeRO-1/2 (its data parallelism is FSDP, i.e. ZeRO-3, or DDP)",
            "parallel.zero_stage")
def _no_zero12(f: PlanFacts):
    return (f.zero == 1) | (f.zero == 2)


@stack_rule("async_tp_needs_compile", "asynchronous TP without torch.compile",
            "parallel.tp_comm_overlap", "system.software.kernels.compile")
def _async_tp_needs_compile(f: PlanFacts):
    return f.tp_overlap & ~f.compiled


@stack_rule("async_tp_is_torchs", "TransformerEngine's userbuffers TP overlap (tp_comm_overlap "
            "bulk or pipelined; this stack's async TP is torch_async)",
            "parallel.tp_comm_overlap")
def _async_tp_is_torchs(f: PlanFacts):
    return f.te_tp_overlap


@stack_rule("no_torch_async_tp", "PyTorch's symmetric-memory async TP (tp_comm_overlap "
            "torch_async; this stack's TP overlap, if any, is its own)",
            "parallel.tp_comm_overlap")
def _no_torch_async_tp(f: PlanFacts):
    return f.torch_tp_overlap


@stack_rule("moe_ep_divides_dp", "expert parallelism that does not divide data parallelism "
            "(EP is carved out of DP alone)",
            "parallel.expert_model_parallel_size", "parallel.data_parallel_size")
def _moe_ep_divides_dp(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.dp % f.ep != 0)


@stack_rule("moe_ep_no_context_parallel", "expert parallelism with context parallelism",
            "parallel.expert_model_parallel_size", "parallel.context_parallel_size")
def _moe_ep_no_context_parallel(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.cp > 1)


@stack_rule("no_expert_tensor_parallel", "an expert tensor-parallel size other than TP",
            "parallel.expert_tensor_parallel_size", "parallel.tensor_model_parallel_size")
def _no_expert_tensor_parallel(f: PlanFacts):
    return f.moe & (f.etp != f.tp)


@stack_rule("no_every_nth_layer_recompute", "checkpointing of every n-th layer only "
            "(torchtitan's selective_ac_option = 'n')", "train.recompute_every_n_layers")
def _no_every_nth_layer_recompute(f: PlanFacts):
    return f.layer_ac


@stack_rule("no_per_virtual_stage_split", "a layer count given for each virtual pipeline "
            "stage", "parallel.layers_per_virtual_stage")
def _no_per_virtual_stage_split(f: PlanFacts):
    return f.given_split


@stack_rule("no_hsdp", "HSDP (replicas of FSDP shards)", "parallel.data_parallel_replicate_size")
def _no_hsdp(f: PlanFacts):
    return f.hsdp


@stack_rule("moe_tp_needs_sp", "MoE layers with tensor parallelism but no sequence "
            "parallelism", "parallel.tensor_model_parallel_size", "parallel.sequence_parallel")
def _moe_tp_needs_sp(f: PlanFacts):
    return f.moe & (f.tp > 1) & ~f.sp


_A2A = "parallel.moe.overlap_expert_parallel_comm"


@stack_rule("no_ep_a2a_overlap", "the expert-parallel all-to-all overlap or delayed weight "
            "gradients (it has neither option)", _A2A, "parallel.moe.delay_wgrad_compute")
def _no_ep_a2a_overlap(f: PlanFacts):
    return f.a2a_overlap | f.delay_wgrad


@stack_rule("ep_a2a_overlap_needs_ep", "the expert-parallel all-to-all overlap without expert "
            "parallelism", _A2A, "parallel.expert_model_parallel_size")
def _ep_a2a_overlap_needs_ep(f: PlanFacts):
    return f.a2a_overlap & (f.ep <= 1)


@stack_rule("ep_a2a_overlap_dispatcher", "the expert-parallel all-to-all overlap with the "
            "allgather dispatcher (alltoall or flex only)", _A2A,
            "parallel.moe.token_dispatcher_type")
def _ep_a2a_overlap_dispatcher(f: PlanFacts):
    return f.a2a_overlap & f.allgather_dispatch


@stack_rule("ep_a2a_overlap_schedule", "the expert-parallel all-to-all overlap outside the "
            "interleaved schedule with PP > 1, or with GPipe", _A2A, "parallel.schedule",
            "parallel.pipeline_model_parallel_size")
def _ep_a2a_overlap_schedule(f: PlanFacts):
    return f.a2a_overlap & ~f.interleaved & ((f.pp > 1) | ~f.one_f_one_b)


@stack_rule("ep_a2a_overlap_no_full_recompute", "the expert-parallel all-to-all overlap with "
            "full recomputation", _A2A, "train.recompute")
def _ep_a2a_overlap_no_full_recompute(f: PlanFacts):
    return f.a2a_overlap & f.full_recompute


@stack_rule("ep_a2a_overlap_16bit", "the expert-parallel all-to-all overlap with an fp32 model "
            "(bf16 or fp16 only)", _A2A, "train.dtype")
def _ep_a2a_overlap_16bit(f: PlanFacts):
    return f.a2a_overlap & f.fp32


@stack_rule("ep_a2a_overlap_no_shared_expert_overlap", "the expert-parallel all-to-all overlap "
            "with shared_expert_overlap", _A2A, "parallel.moe.shared_expert_overlap")
def _ep_a2a_overlap_no_shared_expert_overlap(f: PlanFacts):
    return f.a2a_overlap & f.shared_overlap


@stack_rule("delay_wgrad_needs_ep_a2a_overlap", "delay_wgrad_compute without the "
            "expert-parallel all-to-all overlap", "parallel.moe.delay_wgrad_compute", _A2A)
def _delay_wgrad_needs_ep_a2a_overlap(f: PlanFacts):
    return f.delay_wgrad & ~f.a2a_overlap


@stack_rule("no_flex_dispatcher", "the flex token dispatcher (DeepEP/HybridEP kernels)",
            "parallel.moe.token_dispatcher_type")
def _no_flex_dispatcher(f: PlanFacts):
    return f.flex_dispatch


@stack_rule("flex_needs_tp_ep", "the flex token dispatcher on one rank (expert TP x EP = 1)",
            "parallel.moe.token_dispatcher_type", "parallel.expert_model_parallel_size",
            "parallel.expert_tensor_parallel_size")
def _flex_needs_tp_ep(f: PlanFacts):
    return f.flex_dispatch & (f.ep * f.etp <= 1)


@stack_rule("deepep_no_pad", "the flex dispatcher's DeepEP backend with padding to capacity",
            "parallel.moe.flex_dispatcher_backend", "parallel.moe.pad_expert_input_to_capacity")
def _deepep_no_pad(f: PlanFacts):
    return f.flex_dispatch & f.deepep & f.pad


@stack_rule("zero3_no_expert_parallel", "ZeRO-3 (PyTorch FSDP2) with expert parallelism",
            "parallel.zero_stage", "parallel.expert_model_parallel_size")
def _zero3_no_expert_parallel(f: PlanFacts):
    return f.moe & (f.ep > 1) & (f.zero == 3)


@stack_rule("no_recompute_modules", "Megatron-Core's selective recomputation by module "
            "(train.recompute_modules)", "train.recompute_modules")
def _no_recompute_modules(f: PlanFacts):
    return f.recompute_modules


@stack_rule("recompute_norm_act_not_delayed_fp8", "recomputation of moe_act or layernorm "
            "under FP8 delayed scaling", "train.recompute_modules", "train.dtype")
def _recompute_norm_act_not_delayed_fp8(f: PlanFacts):
    return f.norm_act_recompute & f.fp8_delayed


@stack_rule("no_te_current_scaling", "FP8 with Transformer Engine's current scaling "
            "(system.software.kernels.fp8_recipe te_current)",
            "system.software.kernels.fp8_recipe", "train.dtype")
def _no_te_current_scaling(f: PlanFacts):
    return f.fp8_current


@stack_rule("no_transformer_engine_fp8", "FP8 through Transformer Engine's recipes "
            "(system.software.kernels.fp8_recipe te_delayed or te_current)",
            "system.software.kernels.fp8_recipe", "train.dtype")
def _no_transformer_engine_fp8(f: PlanFacts):
    return f.fp8_te


@stack_rule("no_torchao_float8", "FP8 through torchao's Float8Linear "
            "(system.software.kernels.fp8_recipe tensorwise or rowwise)",
            "system.software.kernels.fp8_recipe", "train.dtype")
def _no_torchao_float8(f: PlanFacts):
    return f.fp8_torchao


@stack_rule("recompute_shared_experts_no_overlap", "recomputation of the shared experts with "
            "shared_expert_overlap", "train.recompute_modules", "parallel.moe.shared_expert_overlap")
def _recompute_shared_experts_no_overlap(f: PlanFacts):
    return f.shared_recompute & f.shared_overlap


# ------------------------------------------------------------------------ stacks and checks
def stack_rules(stack: str) -> list[tuple[StackRule, str]]:
    """``(rule, source)`` for each rule the stack ``stack`` declares, in file order.

    Raises
    ------
    ConfigError
        if software.yaml names a rule that is not registered, or gives it no source.
    """
    from .software import _stack_table
    out = []
    for name, source in (_stack_table()[stack].get("rules") or {}).items():
        if name not in _RULES or not (isinstance(source, str) and source.strip()):
            raise ConfigError(f"software.yaml: stack {stack!r} declares rule {name!r}, which "
                              f"{'is not registered' if name not in _RULES else 'has no source'};"
                              f" registered rules: {', '.join(_RULES)}")
        out.append((_RULES[name], source))
    return out


def broken_rules(cfg: Any) -> list[tuple[StackRule, str]]:
    """The rules of ``cfg``'s stack that its plan breaks, with their sources."""
    facts = PlanFacts.of_config(cfg)
    return [(rule, src) for rule, src in stack_rules(cfg.software.name)
            if bool(np.any(rule.rejects(facts)))]


def _shown(cfg: Any, path: str) -> str:
    section, key = path.rsplit(".", 1)
    if section == "parallel.moe":   # the resolved value (unset: the stack's)
        plan = get_family(cfg.model.architecture).moe_plan(cfg)
        value = {"overlap_expert_parallel_comm": plan.a2a_overlap,
                 "delay_wgrad_compute": plan.delay_wgrad,
                 "token_dispatcher_type": plan.dispatcher,
                 "shared_expert_overlap": plan.shared_expert_overlap,
                 "flex_dispatcher_backend": plan.flex_backend,
                 "pad_expert_input_to_capacity": plan.pad}[key]
        return f"{path} = {value!r}"
    value = getattr(cfg.software, key) if key in _SOFTWARE_FIELDS else \
        getattr(getattr(cfg, section), key)
    return f"{path} = {value!r}"


#: fields the rules name whose value is the resolved stack's (stack ← system ← plan)
_SOFTWARE_FIELDS = ("overlap_p2p_comm", "tp_comm_overlap", "compile", "fp8_recipe")


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
