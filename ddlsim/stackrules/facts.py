"""The plan as the stack rules read it (:class:`PlanFacts`) and the registry of named rules
(:class:`StackRule`, :func:`stack_rule`, :func:`rules`); the rules themselves are in
:mod:`.definitions`, the checks that apply them in :mod:`.checks`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..workloads.registry import get_family

__all__ = ["PlanFacts", "StackRule", "context_facts", "stack_rule", "rules"]


@dataclass(frozen=True)
class PlanFacts:
    """The plan as the stack rules read it: numpy scalars for one config, or arrays that
    broadcast together for many plans (the search's grid).

    ``interleaved`` / ``one_f_one_b``: the schedule is Megatron's interleaved 1F1B / plain
    1F1B; ``p2p_overlap``: the resolved ``overlap_p2p_comm`` (stack ← system ← plan);
    ``tp_overlap``: the resolved ``tp_comm_overlap`` is not ``off`` (the rules read it, and
    the two TP overlap kinds below, with ``tp > 1``); ``compiled``: the stack's ``compile``.
    Facts a search context fixes (:func:`context_facts`) take, where not given, the values
    of a dense bf16 plan that sets nothing.
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
    #: Megatron-Core's pipeline layout string is given (``parallel.pipeline_model_parallel_layout``)
    layout_split: Any = False
    #: replicas of FSDP shards (``parallel.data_parallel_replicate_size`` > 1)
    hsdp: Any = False
    #: ``train.recompute_modules`` is given; it names ``moe_act`` or ``layernorm``; it names
    #: ``shared_experts``; FP8 under Transformer Engine's delayed scaling
    recompute_modules: Any = False
    norm_act_recompute: Any = False
    shared_recompute: Any = False
    fp8_delayed: Any = False
    #: FP8 under Transformer Engine's current scaling (``te_current``), under either of
    #: Transformer Engine's recipes, under one of torchao's (``tensorwise``, ``rowwise``),
    #: under torchao's rowwise scaling
    fp8_current: Any = False
    fp8_te: Any = False
    fp8_torchao: Any = False
    fp8_rowwise: Any = False
    #: ZeRO-3 runs as Megatron-Core's Megatron-FSDP (``zero3_implementation: megatron_fsdp``);
    #: the stack's ``gradient_accumulation_fusion`` (facts made without them: neither)
    megatron_fsdp: Any = False
    grad_accum_fusion: Any = False
    #: context parallelism exchanges K/V by one all-gather (the resolved ``cp_comm_type``)
    cp_all_gather: Any = False
    #: the loss runs Transformer Engine's cross-entropy (``fused_cross_entropy`` with
    #: ``cross_entropy_fusion_impl: te``)
    te_cross_entropy: Any = False
    #: the TE linears' weights are FP8 parameters (``fp8_param_gather`` in FP8 training)
    fp8_params: Any = False
    #: ``train.dtype`` is fp16; is fp8 (facts made without them: bf16)
    fp16: Any = False
    fp8: Any = False
    #: ``train.recompute`` is selective
    selective: Any = False
    #: one of Megatron-Core's uneven splits is given (``account_for_embedding/loss_in_pipeline_
    #: split``, ``num_layers_in_first/last_pipeline_stage``)
    megatron_uneven: Any = False
    #: the resolved ``overlap_param_gather`` (applied to ZeRO-1/2 plans)
    param_gather_overlap: Any = False
    #: the stack's ``host_dispatch`` is ``cuda_graphs``
    cuda_graphs: Any = False
    #: the model ties its output layer to the input embedding (``tie_word_embeddings``)
    tied: Any = False
    #: the resolved ``parallel.moe`` options ``grouped_gemm`` and ``permute_fusion`` (MoE only)
    grouped_gemm: Any = False
    permute_fusion: Any = False
    #: the resolved MoE routing: a capacity factor (tokens dropped or padded), seq_aux_loss
    #: balancing, a score function other than softmax, auxiliary-loss-free expert bias,
    #: group-limited routing, a router dtype given (``router_dtype``), forced balance
    capacity: Any = False
    seq_aux_loss: Any = False
    non_softmax_router: Any = False
    expert_bias: Any = False
    group_limited: Any = False
    router_dtype: Any = False
    forced_balance: Any = False
    #: the model has shared experts; its attention is multi-latent (DeepSeek's MLA)
    shared_experts: Any = False
    mla: Any = False
    #: the MLP's activation is squared ReLU (Nemotron's relu2); the stack's ``fused_bias_gelu``
    #: on an MLP with biases (Megatron switches the fusion off without them)
    squared_relu: Any = False
    bias_act_fusion: Any = False

    @classmethod
    def of(cls, **values: Any) -> "PlanFacts":
        """Facts from ``values`` (scalars or arrays), each as a numpy array; a fact not
        given takes its field's default."""
        return cls(**{f.name: np.asarray(values.get(f.name, f.default)) for f in fields(cls)})

    @classmethod
    def of_config(cls, cfg: Any) -> "PlanFacts":
        """The facts of a :class:`~ddlsim.config.RunConfig`'s plan."""
        p = cfg.parallel
        return cls.of(tp=p.tp, pp=p.pp, zero=p.zero_stage, sp=p.sequence_parallel,
                      interleaved=p.schedule == "interleaved", one_f_one_b=p.schedule == "1f1b",
                      **context_facts(cfg), etp=p.etp, dp=p.data_parallel_size or 1,
                      full_recompute=cfg.train.recompute == "full",
                      layer_ac=cfg.train.recompute_every_n_layers > 1,
                      given_split=p.layers_per_virtual_stage is not None,
                      layout_split=p.pipeline_model_parallel_layout is not None,
                      hsdp=p.data_parallel_replicate_size > 1,
                      selective=cfg.train.recompute == "selective", **_recompute_facts(cfg))


def _megatron_uneven(p: Any) -> bool:
    """Whether the plan ``p`` gives one of Megatron-Core's uneven pipeline splits."""
    return bool(p.account_for_embedding_in_pipeline_split
                or p.account_for_loss_in_pipeline_split
                or p.num_layers_in_first_pipeline_stage is not None
                or p.num_layers_in_last_pipeline_stage is not None)


def context_facts(cfg: Any) -> dict:
    """The facts a search context fixes for all its plans (its config's model, context
    parallelism, expert parallelism, precision, stack and overlap settings, and MoE options):
    ``cp``, ``p2p_overlap``, ``megatron_fsdp``, ``grad_accum_fusion``, ``cp_all_gather``,
    ``te_cross_entropy``, ``fp8_params``, ``fp16``, ``fp8``, ``fp32``, the model's
    ``shared_experts``, ``mla`` and ``squared_relu``, ``bias_act_fusion``,
    ``param_gather_overlap``, ``cuda_graphs``, ``compiled``, the TP overlap settings
    (``tp_overlap``, ``te_tp_overlap``, ``torch_tp_overlap``: the rules read them with
    ``tp > 1``), ``megatron_uneven``, ``tied``, ``moe``, ``ep`` and the MoE plan's options; for a
    context without a config (None) the values that break no rule.
    :meth:`PlanFacts.of_config` and the search's arrays (:mod:`ddlsim.search.plans`) both
    take them from here."""
    if cfg is None:
        return {"cp": 1, "p2p_overlap": False, "megatron_fsdp": False,
                "grad_accum_fusion": False, "cp_all_gather": False, "te_cross_entropy": False,
                "fp8_params": False, "fp16": False, "fp8": False, "fp32": False,
                "param_gather_overlap": False, "cuda_graphs": False, "compiled": False,
                "tp_overlap": False, "te_tp_overlap": False, "torch_tp_overlap": False,
                "megatron_uneven": False, "tied": False, "moe": False, "ep": 1,
                "shared_experts": False, "mla": False, "squared_relu": False,
                "bias_act_fusion": False, **_MOE_OFF}
    sw, dtype, tpo = cfg.software, cfg.train.dtype, cfg.software.tp_comm_overlap
    return {"cp": cfg.parallel.cp, "p2p_overlap": bool(sw.overlap_p2p_comm),
            "megatron_fsdp": sw.zero3_implementation == "megatron_fsdp",
            "grad_accum_fusion": bool(sw.gradient_accumulation_fusion),
            "cp_all_gather": sw.cp_comm_type == "all_gather",
            "te_cross_entropy": bool(sw.fused_cross_entropy)
            and sw.cross_entropy_fusion_impl == "te",
            "fp8_params": bool(sw.fp8_param_gather) and dtype == "fp8",
            "fp16": dtype == "fp16", "fp8": dtype == "fp8", "fp32": dtype == "fp32",
            "param_gather_overlap": bool(sw.overlap_param_gather),
            "cuda_graphs": sw.host_dispatch == "cuda_graphs", "compiled": bool(sw.compile),
            "tp_overlap": tpo != "off", "te_tp_overlap": tpo in ("bulk", "pipelined"),
            "torch_tp_overlap": tpo == "torch_async",
            "megatron_uneven": _megatron_uneven(cfg.parallel),
            "tied": bool(getattr(cfg.model, "tie_word_embeddings", False)),
            "moe": bool(getattr(cfg.model, "num_local_experts", 0)), "ep": cfg.parallel.ep,
            **_model_facts(cfg), **_moe_facts(cfg)}


def _model_facts(cfg: Any) -> dict:
    """The model's facts the stack rules read: shared experts, multi-latent attention, a
    squared-ReLU MLP (false for a model without a decoder shape), and the stack's
    bias-activation fusion on an MLP with biases (Megatron-LM 900f1b76 arguments.py lines
    478-480 turn it off without them)."""
    shape = cfg.model.shape() if hasattr(cfg.model, "shape") else None
    return {"shared_experts": bool(getattr(shape, "shared_experts", 0)),
            "mla": getattr(shape, "mla", None) is not None,
            "squared_relu": bool(getattr(shape, "squared_relu", False)),
            "bias_act_fusion": bool(cfg.software.fused_bias_gelu)
            and bool(getattr(shape, "mlp_bias", False))}


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
            "fp8_torchao": recipe in ("tensorwise", "rowwise"), "fp8_rowwise": recipe == "rowwise"}


#: the MoE plan's facts of a dense model (or a stack that does not say how it runs MoE
#: layers: the MoE checks refuse that plan)
_MOE_OFF = {"a2a_overlap": False, "delay_wgrad": False, "allgather_dispatch": False,
            "shared_overlap": False, "flex_dispatch": False, "deepep": False, "pad": False,
            "grouped_gemm": False, "permute_fusion": False, "capacity": False,
            "seq_aux_loss": False, "non_softmax_router": False, "expert_bias": False,
            "group_limited": False, "router_dtype": False, "forced_balance": False}


def _moe_facts(cfg: Any) -> dict:
    """The MoE options the rules read, resolved as the trace resolves them (the family's
    :meth:`~ddlsim.workloads.registry.WorkloadFamily.moe_plan`); :data:`_MOE_OFF` for a dense
    model or a stack that does not say how it runs MoE layers."""
    try:
        plan = moe_plan(cfg)
    except ConfigError:
        plan = None
    if plan is None:
        return dict(_MOE_OFF)
    return {"a2a_overlap": plan.a2a_overlap, "delay_wgrad": plan.delay_wgrad,
            "allgather_dispatch": plan.dispatcher == "allgather",
            "shared_overlap": plan.shared_expert_overlap,
            "flex_dispatch": plan.dispatcher == "flex", "deepep": plan.flex_backend == "deepep",
            "pad": plan.pad, "grouped_gemm": plan.grouped_gemm,
            "permute_fusion": plan.permute_fusion, "capacity": plan.capacity_factor is not None,
            "seq_aux_loss": plan.balancing == "seq_aux_loss",
            "non_softmax_router": plan.score_function != "softmax",
            "expert_bias": bool(plan.expert_bias), "group_limited": bool(plan.group_limited),
            "router_dtype": plan.router_dtype is not None,
            "forced_balance": bool(plan.forced_balance)}


def moe_plan(cfg: Any) -> Any:
    """The MoE plan of ``cfg`` as its model's family resolves it
    (:meth:`~ddlsim.workloads.registry.WorkloadFamily.moe_plan`): None for a dense model."""
    return get_family(cfg.model.architecture).moe_plan(cfg)


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

