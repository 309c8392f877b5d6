"""How Megatron-Core runs a plan's Mixture-of-Experts layers, resolved once.

``parallel.moe`` (:class:`~ddlsim.config_moe.MoESpec`) over the software stack's ``moe:``
section of ``ddlsim/data/software.yaml``, with the expert grid of the mesh (expert TP, EP,
expert DP: Megatron-Core's "MoE parallel folding", the expert layout of
:class:`~ddlsim.workloads.mesh.DeviceMesh`) and the routing (dropless, dropped to a capacity,
or padded to it; balanced or with a hot expert-parallel rank).

References
----------
NVIDIA/Megatron-LM 9c1a5351 (2025-06-02): ``megatron/core/transformer/moe/token_dispatcher.py``
(``MoEAlltoAllTokenDispatcher.preprocess`` lines 335-456: capacity ``get_capacity(T·k, E, cf)``
per expert when padding, ``num_out_tokens = capacity·E``; ``token_permutation`` lines 458-576:
permute, all-to-all over ``ep``, all-gather over the expert-TP group, sort by local expert;
``MoEAllGatherTokenDispatcher`` lines 103-245: all-gather over ``tp_ep``),
``moe_utils.py`` ``get_capacity`` lines 163-179 (``ceil(tokens/E · cf)``),
``transformer_config.py`` lines 684-707 (shared-expert overlap needs the alltoall dispatcher;
a capacity factor needs aux_loss, seq_aux_loss or none; padding needs a capacity factor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from .moe_balance import (MAXVIO_GLOBAL_BIAS, SOURCE, SOURCE_BIAS, SOURCE_BIAS_RATE,
                          SOURCE_FORCED, applies, bias_applies, hot_rank_load,
                          random_routing_load)
from .moe_routing import balancing_type, expert_bias, score_function

__all__ = ["MoEPlan", "resolve_moe", "STACK_FIELDS"]

#: ``parallel.moe`` fields whose default is the stack's (its ``moe:`` section)
STACK_FIELDS = ("token_dispatcher_type", "grouped_gemm", "permute_fusion",
                "overlap_expert_parallel_comm", "delay_wgrad_compute")


@dataclass(frozen=True)
class MoEPlan:
    """The resolved MoE options of one plan.

    ``ep``, ``etp``: expert-parallel and expert tensor-parallel sizes; ``load``: tokens of
    the most loaded expert-parallel rank over the mean, after capacity (:meth:`hot_load`);
    ``sources``: where each stack field came from.
    """

    dispatcher: str
    grouped_gemm: bool
    permute_fusion: bool
    shared_expert_overlap: bool
    balancing: str
    imbalance: float
    capacity_factor: float | None
    pad: bool
    ep: int
    etp: int
    sources: dict
    #: Megatron-Core's expert-parallel all-to-all overlap (the combined 1F1B schedule,
    #: :mod:`.combined`) and, with it, the experts' weight gradients delayed
    a2a_overlap: bool = False
    delay_wgrad: bool = False

    #: the flex dispatcher's kernels (``deepep``, ``hybridep``; None for other dispatchers)
    flex_backend: str | None = None
    #: SMs the flex kernels hold while they run (``parallel.moe.flex_dispatcher_num_sms``, or
    #: the backend's Megatron-Core default, :func:`_flex_sms`); None for other dispatchers
    flex_sms: int | None = None

    #: grouped GEMM as Transformer Engine's GroupedLinear runs it: one GEMM per expert on this
    #: many streams (the stack's ``moe.grouped_gemm_streams``, :mod:`.grouped_linear`); 0: one
    #: grouped launch of all local experts
    gemm_streams: int = 0

    #: the router's extra kernels (:mod:`.moe_router`): the load-balancing loss's coefficient
    #: (``--moe-aux-loss-coeff``), Transformer Engine's fused router (``--moe-router-fusion``),
    #: forced balance's random logits (``--moe-router-force-load-balancing``)
    aux_loss_coeff: float = 0.0
    router_fusion: bool = False
    forced_balance: bool = False
    #: ``--moe-router-dtype`` (``fp32``), None: the router's GEMM in the layer's dtype
    #: (:func:`.moe_router.router_gemm`)
    router_dtype: str | None = None
    #: where :attr:`imbalance` comes from: ``given`` (``parallel.moe.router_imbalance``),
    #: ``forced`` (forced balance: the hottest rank of top-k sampling of random logits,
    #: :func:`.moe_balance.random_routing_load`), ``derived`` (unset, dropless, an
    #: auxiliary-loss router the published statistic bounds: :mod:`.moe_balance`) or
    #: ``assumed`` (unset otherwise: 1, no published statistic for that router, docs/moe.md)
    imbalance_basis: str = "given"
    #: group-limited routing (:func:`_router_groups`): the experts in ``groups`` groups, each
    #: token's from ``topk_groups`` of them; 1, 1: top-k over all experts
    groups: int = 1
    topk_groups: int = 1
    #: ``--moe-router-score-function`` (:func:`_score_function`), and auxiliary-loss-free
    #: balancing (``--moe-router-enable-expert-bias``, :func:`_expert_bias`) with its
    #: ``--moe-router-bias-update-rate``
    score_function: str = "softmax"
    expert_bias: bool = False
    bias_update_rate: float = SOURCE_BIAS_RATE

    @property
    def group_limited(self) -> bool:
        """Whether each token's experts come from fewer than all groups."""
        return self.topk_groups < self.groups

    @property
    def aux_loss(self) -> bool:
        """Whether the router computes a load-balancing loss (and its all-reduce): aux_loss or
        seq_aux_loss balancing with a coefficient above 0 (Megatron-LM d7288711 ``router.py``
        ``is_aux_loss_enabled``, lines 278-283)."""
        return self.balancing in ("aux_loss", "seq_aux_loss") and self.aux_loss_coeff > 0

    @property
    def load(self) -> float:
        """Tokens of the hottest expert-parallel rank over the mean: padded to capacity →
        exactly the capacity factor; dropped at capacity → ``min(imbalance, cf)``; dropless →
        the imbalance."""
        if self.pad:
            return float(self.capacity_factor)
        if self.capacity_factor is not None:
            return min(self.imbalance, self.capacity_factor)
        return self.imbalance

    @property
    def sent_factor(self) -> float:
        """Token copies each rank sends, per token and top-k slot: the capacity factor when
        padded (every expert slot travels), else 1 (balanced routing drops nothing)."""
        return float(self.capacity_factor) if self.pad else 1.0

    def routing_phrase(self) -> str:
        """The routing as the plan line and the JSON's ``plan.moe.routing`` say it:
        ``dropless``, ``capacity 1.25``, ``capacity 1.25, padded``; dropless routing whose
        imbalance nobody gave (not forced) names the balance it assumes; group-limited routing
        is named after it (``group-limited 4 of 8 groups``), an expert-bias router before it
        (``dropless, expert-bias router (router_imbalance 1.02, a lower bound …)``)."""
        groups = (f", group-limited {self.topk_groups} of {self.groups} groups"
                  if self.group_limited else "")
        bias = ", expert-bias router" if self.expert_bias else ""
        if self.capacity_factor is not None:
            padded = ", padded" if self.pad else ""
            return f"capacity {self.capacity_factor:g}{padded}{bias}{groups}"
        flex = ", flex traffic at the mean" if self.dispatcher == "flex" else ""
        if self.imbalance_basis == "forced" and self.imbalance == 1.0:   # EP 1, or k = E
            return f"dropless{bias}, forced balance{groups}"
        if self.imbalance_basis == "forced":
            bound = ", a lower bound under group-limited routing" if self.group_limited else ""
            return (f"dropless{bias}, forced balance (router_imbalance {self.imbalance:.3g}, "
                    f"the hottest of EP{self.ep} ranks under {SOURCE_FORCED}{bound}{flex})"
                    f"{groups}")
        if self.imbalance_basis == "derived":
            router, source = (("expert-bias", SOURCE_BIAS) if self.expert_bias
                              else ("aux-loss", SOURCE))
            return (f"dropless, {router} router (router_imbalance {self.imbalance:.3g}, a lower "
                    f"bound derived from {source}{flex}){groups}")
        if self.imbalance_basis == "assumed":
            return (f"dropless{bias}, balanced (router_imbalance {self.imbalance:g}, assumed: "
                    f"no measured default){groups}")
        forced = ", forced balance" if self.forced_balance else ""   # a given 1 with it
        return f"dropless{bias}{forced}{groups}"

    def _gemm_phrase(self) -> str:
        if not self.grouped_gemm:
            return "one GEMM per expert"
        if self.gemm_streams:
            return f"grouped GEMM (one per expert on {self.gemm_streams} streams)"
        return "grouped GEMM"

    def phrase(self) -> str:
        """``alltoall dispatch, grouped GEMM, fused permute, dropless`` for the plan line."""
        route = self.routing_phrase()
        hot = (f", hot EP rank ×{self.imbalance:g}"     # a derived one: in the routing
               if self.imbalance != 1.0 and self.imbalance_basis == "given" else "")
        flex = f"/{self.flex_backend} ({self.flex_sms} SMs)" if self.flex_backend else ""
        return (f"MoE {self.dispatcher}{flex} dispatch, "
                f"{self._gemm_phrase()}, "
                f"{'fused' if self.permute_fusion else 'unfused'} permute, ETP{self.etp}, "
                f"{route}{hot}"
                + (", shared experts overlapped" if self.shared_expert_overlap else "")
                + (", fused router" if self.router_fusion else "")
                + (f", {self.router_dtype} router" if self.router_dtype else "")
                + (f", {self.score_function} scores" if self.score_function != "softmax"
                   else "")
                + (f", {'seq ' if self.balancing == 'seq_aux_loss' else ''}aux loss "
                   f"{self.aux_loss_coeff:g}" if self.aux_loss else "")
                + (", EP all-to-alls overlapped (combined 1F1B"
                   + (", delayed wgrad)" if self.delay_wgrad else ")") if self.a2a_overlap
                   else ""))


#: stack fields that are off, unset, on a stack declaring the rule that refuses turning them
#: on (it has no such option), so a stack without MoE code need not list them
OFF_BY_RULE = {"overlap_expert_parallel_comm": "no_ep_a2a_overlap",
               "delay_wgrad_compute": "no_ep_a2a_overlap"}


def _stack_refusals(stack: str) -> dict:
    """Rule name → source of each rule ``stack`` declares (its ``rules:`` section)."""
    from ...software import _stack_table
    return _stack_table()[stack].get("rules") or {}


def _stack_moe(stack: str) -> dict:
    from ...software import _stack_table
    return _stack_table()[stack].get("moe") or {}


def resolve_moe(cfg: Any) -> MoEPlan | None:
    """The MoE plan of ``cfg`` (None for a dense model): ``parallel.moe``'s fields, each unset
    one from the stack's ``moe:`` section.

    Raises
    ------
    ConfigError
        When a field is unset and the stack does not say it (e.g. a stack without MoE code).
    """
    shape = cfg.model.shape()
    if not shape.is_moe:
        return None
    spec, p = cfg.parallel.moe, cfg.parallel
    stack = cfg.software.name
    given = {} if spec is None else spec.model_dump()
    table, values, sources = _stack_moe(stack), {}, {}
    refused = _stack_refusals(stack)
    given["router_load_balancing_type"] = balancing_type(cfg, given, sources)
    aux_coeff = _aux_loss_coeff(cfg, given, sources)
    bias = expert_bias(cfg, given, sources)
    imbalance, basis = _imbalance(cfg, given, aux_coeff, bias)
    for field in STACK_FIELDS:
        if given.get(field) is not None:
            values[field], sources[field] = given[field], f"parallel.moe.{field}"
        elif field in table:
            values[field], sources[field] = table[field]["value"], table[field]["source"]
        elif OFF_BY_RULE.get(field) in refused:   # the stack has no such option: off
            values[field], sources[field] = False, refused[OFF_BY_RULE[field]]
        elif "no_moe" in refused:                 # no MoE code at all: say so by the rule
            raise ConfigError(
                f"software stack {stack!r} cannot run Mixture-of-Experts layers (rule no_moe; "
                f"source: {refused['no_moe']}). Pick a stack that runs them, or set "
                f"system.software: {{stack: {stack}, what_if: true}} and every parallel.moe "
                f"option the stack cannot say (first: parallel.moe.{field})")
        else:
            raise ConfigError(
                f"parallel.moe.{field} is unset and software stack {stack!r} does not say how "
                f"it runs MoE layers (no moe.{field} in its software.yaml entry); set "
                f"parallel.moe.{field}")
    return MoEPlan(values["token_dispatcher_type"], values["grouped_gemm"],
                   values["permute_fusion"], bool(given.get("shared_expert_overlap", False)),
                   given["router_load_balancing_type"],
                   imbalance, shape.capacity_factor,
                   bool(given.get("pad_expert_input_to_capacity", False)), p.ep, p.etp, sources,
                   a2a_overlap=bool(values["overlap_expert_parallel_comm"]),
                   delay_wgrad=bool(values["delay_wgrad_compute"]),
                   flex_backend=(backend := _flex_backend(given, values, sources)),
                   flex_sms=_flex_sms(backend, given, sources),
                   gemm_streams=_gemm_streams(table, values["grouped_gemm"], sources),
                   aux_loss_coeff=aux_coeff,
                   router_fusion=_router_fusion(table, given, sources),
                   forced_balance=bool(given.get("router_force_load_balancing", False)),
                   router_dtype=given.get("router_dtype"), imbalance_basis=basis,
                   score_function=score_function(cfg, given, sources), expert_bias=bias[0],
                   bias_update_rate=bias[1], **_router_groups(cfg, given, sources))


def _router_groups(cfg: Any, given: dict, sources: dict) -> dict:
    """Group-limited routing: ``parallel.moe.router_num_groups``/``router_group_topk``
    (Megatron-LM's ``--moe-router-num-groups``/``--moe-router-group-topk``), else the model's
    ``n_group``/``topk_group`` (DeepSeek's config.json: its ``group_limited_greedy`` and
    ``noaux_tc`` routers pick ``topk_group`` groups, then the top-k inside them), else none;
    where they came from in ``sources``. Checked by :func:`.moeplan_checks.check_moe_plan`."""
    if given.get("router_num_groups") is not None or given.get("router_group_topk") is not None:
        sources["router_groups"] = "parallel.moe.router_num_groups, router_group_topk"
        return dict(groups=given.get("router_num_groups") or 1,
                    topk_groups=given.get("router_group_topk") or 1)
    groups = getattr(cfg.model, "n_group", None)
    topk = getattr(cfg.model, "topk_group", None)
    if groups is None or topk is None:
        return {}
    sources["router_groups"] = "model.n_group, model.topk_group"
    return dict(groups=int(groups), topk_groups=int(topk))


def _imbalance(cfg: Any, given: dict, aux_coeff: float,
               bias: tuple[bool, float]) -> tuple[float, str]:
    """The hot rank's load over the mean and where it comes from (:attr:`MoEPlan.
    imbalance_basis`): given; else, under forced balance (random logits, ``RandomSTE``,
    Megatron-LM d7288711 ``router.py`` lines 1203-1215: every rank the mean in expectation,
    not in one micro-batch), the hottest rank of top-k sampling
    (:func:`.moe_balance.random_routing_load`; a lower bound with group-limited routing,
    which correlates a group's ranks: the plan line says so); else 1
    with a capacity factor (as before); else, dropless, derived from the
    published statistic of an expert-bias router (``bias``: on, its update rate,
    :func:`.moe_routing.expert_bias`;
    :func:`.moe_balance.bias_applies`, which governs where an auxiliary loss of at most 1e-3
    runs beside it) or of an auxiliary-loss router (:func:`.moe_balance.applies`) where it
    bounds the run's (:func:`.moe_balance.hot_rank_load`), and assumed 1 otherwise
    (docs/moe.md, "Load imbalance under dropless routing")."""
    if given.get("router_imbalance") is not None:
        return float(given["router_imbalance"]), "given"
    shape, p = cfg.model.shape(), cfg.parallel
    if given.get("router_force_load_balancing"):
        return random_routing_load(shape.experts, shape.top_k, p.ep,
                                   _routed_tokens(cfg)), "forced"
    balancing = given["router_load_balancing_type"]
    if shape.capacity_factor is not None:
        return 1.0, "assumed"
    if bias[0]:
        if not bias_applies(bias[1], balancing, aux_coeff):
            return 1.0, "assumed"
        return hot_rank_load(shape.experts, shape.top_k, p.ep, _routed_tokens(cfg),
                             MAXVIO_GLOBAL_BIAS), "derived"
    if not applies(balancing, aux_coeff):
        return 1.0, "assumed"
    return hot_rank_load(shape.experts, shape.top_k, p.ep, _routed_tokens(cfg)), "derived"


def _routed_tokens(cfg: Any) -> float:
    """``N``: tokens one micro-batch routes through an EP rank's ``tp_ep`` group: ``etp·ep·T``,
    ``T = b·s/cp`` per rank, ``/tp`` with sequence parallelism (as
    :meth:`.moe.MoEOps.tokens`)."""
    p, t = cfg.parallel, cfg.train
    per_rank = t.micro_batch_size * t.seq_length / p.cp / (p.tp if p.sequence_parallel else 1)
    return p.etp * p.ep * per_rank


def _aux_loss_coeff(cfg: Any, given: dict, sources: dict) -> float:
    """The load-balancing loss coefficient: given, else the model's ``router_aux_loss_coef``
    (its ``config.json``'s) where the balancing computes the loss (aux_loss, seq_aux_loss),
    else Megatron's default 0; its source in ``sources``."""
    if given.get("aux_loss_coeff") is not None:
        sources["aux_loss_coeff"] = "parallel.moe.aux_loss_coeff"
        return float(given["aux_loss_coeff"])
    model = getattr(cfg.model, "router_aux_loss_coef", None)
    if model is not None and given.get("router_load_balancing_type", "aux_loss") in (
            "aux_loss", "seq_aux_loss"):
        sources["aux_loss_coeff"] = "model.router_aux_loss_coef"
        return float(model)
    sources["aux_loss_coeff"] = "Megatron-LM's default --moe-aux-loss-coeff 0"
    return 0.0


def _router_fusion(table: dict, given: dict, sources: dict) -> bool:
    """The fused router: given, else the stack's ``moe.router_fusion`` (off where the stack has
    none: :func:`.moeplan_checks.check_moe_plan` refuses turning it on there), its source in
    ``sources``."""
    entry = table.get("router_fusion")
    if given.get("router_fusion") is not None:
        sources["router_fusion"] = "parallel.moe.router_fusion"
        return bool(given["router_fusion"])
    if entry is None:
        return False
    sources["router_fusion"] = entry["source"]
    return bool(entry["value"])


def _gemm_streams(table: dict, grouped: bool, sources: dict) -> int:
    """Streams of the stack's grouped GEMM (its ``moe.grouped_gemm_streams``; 0 when the
    stack's grouped GEMM is one launch, or without grouped GEMM), its source in
    ``sources``."""
    entry = table.get("grouped_gemm_streams")
    if not grouped or entry is None:
        return 0
    sources["grouped_gemm_streams"] = entry["source"]
    return int(entry["value"])


#: Megatron-Core's flex backend when none is given
FLEX_DEFAULT = ("deepep", "Megatron-LM d7288711 megatron/core/transformer/transformer_config.py "
                "line 757: moe_flex_dispatcher_backend = 'deepep' (b0cc2706 line 682)")


def _flex_backend(given: dict, values: dict, sources: dict) -> str | None:
    """The flex dispatcher's backend (given, or Megatron-Core's default, recorded in
    ``sources``); None for the other dispatchers."""
    if values["token_dispatcher_type"] != "flex":
        return None
    if given.get("flex_dispatcher_backend") is not None:
        sources["flex_dispatcher_backend"] = "parallel.moe.flex_dispatcher_backend"
        return given["flex_dispatcher_backend"]
    sources["flex_dispatcher_backend"] = FLEX_DEFAULT[1]
    return FLEX_DEFAULT[0]


def _flex_sms(backend: str | None, given: dict, sources: dict) -> int | None:
    """SMs the flex kernels hold: ``parallel.moe.flex_dispatcher_num_sms``, else the backend's
    Megatron-Core default (:data:`~ddlsim.simulator.collectives.flex.KERNEL_SMS`), its source
    in ``sources``; None without the flex dispatcher (a count given there is refused by
    :func:`.moeplan_checks.check_moe_plan`)."""
    if backend is None:
        return None
    from ...simulator.collectives.flex import KERNEL_SMS
    if given.get("flex_dispatcher_num_sms") is not None:
        sources["flex_dispatcher_num_sms"] = "parallel.moe.flex_dispatcher_num_sms"
        return int(given["flex_dispatcher_num_sms"])
    sms, source = KERNEL_SMS[backend]
    sources["flex_dispatcher_num_sms"] = source
    return sms
