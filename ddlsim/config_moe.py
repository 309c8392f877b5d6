"""``parallel.moe``: how Megatron-Core runs the Mixture-of-Experts layers of a plan.

The fields are Megatron-LM's ``--moe-*`` arguments without the prefix (NVIDIA/Megatron-LM
9c1a5351, 2025-06-02, ``megatron/training/arguments.py`` ``_add_moe_args``, lines 2601-2702).
A field left unset takes the software stack's value (the ``moe:`` section of its entry in
``ddlsim/data/software.yaml``); a stack without one must be told
(:func:`ddlsim.workloads.decoder.moeplan.resolve_moe`). What each one changes in the trace is
in docs/moe.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StrictBool

from .config_types import _Strict, count_type, reject_bool

__all__ = ["MoESpec", "TokenDispatcher", "FlexBackend", "LoadBalancing", "RouterDtype",
           "ScoreFunction"]

#: Megatron-Core's token dispatchers ddlsim models (the deprecated ``alltoall_seq`` is not)
TokenDispatcher = Literal["alltoall", "allgather", "flex"]
#: ``--moe-flex-dispatcher-backend``'s choices (Megatron-LM d7288711
#: ``transformer_config.py`` line 757)
FlexBackend = Literal["deepep", "hybridep"]
#: ``--moe-router-dtype``'s choices ddlsim models: Megatron-LM 1e057005
#: ``megatron/training/arguments.py`` lines 2637-2638 offer fp32 and fp64; fp64 GEMMs (no tensor
#: cores, a rate no device entry gives) are not modelled
RouterDtype = Literal["fp32"]
#: ``--moe-router-load-balancing-type``'s choices
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"]
#: ``--moe-router-score-function``'s choices (Megatron-LM d98e8a64
#: ``megatron/core/transformer/transformer_config.py`` line 808; default softmax)
ScoreFunction = Literal["softmax", "sigmoid", "sqrtsoftplus"]


class MoESpec(_Strict):
    """Megatron-Core's MoE options of one plan (unset: the software stack's value)."""

    token_dispatcher_type: TokenDispatcher | None = Field(
        default=None, description="alltoall (dispatch/combine all-to-all over EP, then "
                                  "all-gather/reduce-scatter over expert TP), allgather "
                                  "(all-gather the tokens over TP×EP) or flex (DeepEP/HybridEP "
                                  "kernels over TP×EP, each token once per node and GPU); "
                                  "default: the stack's")
    flex_dispatcher_backend: FlexBackend | None = Field(
        default=None, description="the flex dispatcher's kernels: deepep or hybridep "
                                  "(--moe-flex-dispatcher-backend); only with "
                                  "token_dispatcher_type flex; default there: deepep, "
                                  "Megatron-Core's")
    flex_dispatcher_num_sms: count_type("sm_count") | None = \
        Field(default=None, description="--moe-flex-dispatcher-num-sms (the deprecated "
                                        "--moe-deepep-num-sms/--moe-hybridep-num-sms route "
                                        "to it): the SMs the flex dispatcher's dispatch and "
                                        "combine kernels hold while they run, taken from the "
                                        "compute they overlap under "
                                        "overlap_expert_parallel_comm; only with "
                                        "token_dispatcher_type flex; at least the count the "
                                        "kernels' published rates hold at (DeepEP 20, "
                                        "HybridEP 8) and below the device's SMs; unset: "
                                        "Megatron-Core's default (DeepEP 20, HybridEP 16)")
    grouped_gemm: StrictBool | None = Field(
        default=None, description="the local experts' GEMMs as one grouped GEMM (TE "
                                  "GroupedLinear) instead of one GEMM per expert; default: "
                                  "the stack's")
    permute_fusion: StrictBool | None = Field(
        default=None, description="token permute/unpermute as one fused kernel each instead "
                                  "of separate gather/scatter passes; default: the stack's")
    shared_expert_overlap: StrictBool = Field(
        default=False, description="shared experts computed while the dispatch/combine "
                                   "all-to-alls run (alltoall dispatcher only)")
    overlap_expert_parallel_comm: StrictBool | None = Field(
        default=None, description="Megatron-Core's overlap_moe_expert_parallel_comm: the "
                                  "combined 1F1B schedule, one micro-batch's dispatch/combine "
                                  "all-to-alls on a communication stream beside another "
                                  "micro-batch's attention and expert compute (docs/moe.md); "
                                  "default: the stack's")
    delay_wgrad_compute: StrictBool | None = Field(
        default=None, description="with the overlap: the experts' weight gradients computed "
                                  "after their data gradients, beside the backward dispatch "
                                  "(Megatron-Core's delay_wgrad_compute); default: the stack's")
    router_load_balancing_type: LoadBalancing = Field(
        default="aux_loss", description="Megatron's default aux_loss; checked against the "
                                        "capacity factor (sinkhorn drops no tokens); with "
                                        "aux_loss_coeff > 0, aux_loss and seq_aux_loss add the "
                                        "loss's kernels and all-reduce (docs/moe.md)")
    aux_loss_coeff: Annotated[float, BeforeValidator(reject_bool),
                              Field(ge=0.0, le=1e3)] | None = \
        Field(default=None, description="--moe-aux-loss-coeff: above 0 the router computes the "
                                        "load-balancing loss, its kernels and the all-reduce "
                                        "of the tokens per expert over TP x CP in every MoE "
                                        "layer's forward; default: the model's "
                                        "router_aux_loss_coef (its config.json's) under "
                                        "aux_loss/seq_aux_loss balancing, else Megatron's "
                                        "default 0 (none)")
    router_fusion: StrictBool | None = Field(
        default=None, description="--moe-router-fusion: the router's top-k and loss as "
                                  "Transformer Engine's fused kernels instead of torch ops; "
                                  "default: the stack's (off), refused on a stack without it")
    router_dtype: RouterDtype | None = Field(
        default=None, description="--moe-router-dtype: fp32 runs the router's GEMM on fp32 "
                                  "casts of its input and weight (TF32 tensor cores, "
                                  "docs/moe.md) and casts its gradients back; unset: the "
                                  "router's GEMM in the layer's bf16/fp16; fp64 is not "
                                  "modelled")
    router_score_function: ScoreFunction | None = Field(
        default=None, description="--moe-router-score-function: softmax, sigmoid or "
                                  "sqrtsoftplus over the router's logits; it decides whether "
                                  "router_enable_expert_bias is allowed (sigmoid and "
                                  "sqrtsoftplus only); the router's kernels are counted as "
                                  "the softmax router's (docs/moe.md); unset: the model's "
                                  "scoring_func (its config.json's), else Megatron's softmax")
    router_enable_expert_bias: StrictBool | None = Field(
        default=None, description="--moe-router-enable-expert-bias: auxiliary-loss-free "
                                  "balancing (Wang et al. 2024; DeepSeek-V3's noaux_tc): a "
                                  "per-expert bias added to the scores before top-k, updated "
                                  "once per step from the tokens per expert; dropless, the "
                                  "hot rank's load is then derived from the bias's published "
                                  "statistic (decoder/moe_balance.py); needs "
                                  "router_score_function sigmoid or sqrtsoftplus; unset: the "
                                  "model's (its config.json's topk_method noaux_tc), else off")
    router_bias_update_rate: Annotated[float, BeforeValidator(reject_bool),
                                       Field(gt=0.0, le=1.0)] | None = \
        Field(default=None, description="--moe-router-bias-update-rate: the step of each "
                                        "expert bias update (the same kernels at any rate); "
                                        "only with router_enable_expert_bias; the derived "
                                        "load holds at the source's 1e-3 only (Megatron's "
                                        "default), another rate leaves it assumed 1; unset: "
                                        "1e-3")
    router_force_load_balancing: StrictBool = Field(
        default=False, description="--moe-router-force-load-balancing, benchmark mode: random "
                                   "logits, every expert the same tokens in expectation; the "
                                   "hottest expert-parallel rank of one micro-batch derived "
                                   "from top-k sampling (decoder/moe_balance.py); "
                                   "router_imbalance unset or 1")
    router_imbalance: Annotated[float, BeforeValidator(reject_bool),
                                Field(ge=1.0, le=1e3)] | None = \
        Field(default=None, description="tokens of the most loaded expert-parallel rank over "
                                        "the mean (1: balanced); that rank sets the MoE "
                                        "layer's time; unset: under forced balance, the "
                                        "hottest rank of top-k sampling of random logits; 1 "
                                        "with a capacity factor; under dropless "
                                        "aux_loss/seq_aux_loss routing with 0 < aux_loss_coeff "
                                        "<= 1e-3, or with router_enable_expert_bias, derived "
                                        "from a published per-expert statistic "
                                        "(decoder/moe_balance.py: a lower bound); "
                                        "1, assumed, otherwise; the plan line and JSON "
                                        "routing name which")
    router_num_groups: Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=2**20)] | \
        None = Field(default=None, description="--moe-router-num-groups: the routed experts in "
                                               "this many groups of consecutive experts for "
                                               "group-limited routing (with router_group_topk); "
                                               "unset: the model's n_group (its config.json's), "
                                               "else none")
    router_group_topk: Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=2**20)] | \
        None = Field(default=None, description="--moe-router-group-topk: each token's experts "
                                               "come from this many of the groups (DeepSeek-V3: "
                                               "4 of 8); with expert parallelism over nodes a "
                                               "token reaches fewer nodes and GPUs, which the "
                                               "flex dispatcher's deduplicated traffic follows "
                                               "(docs/moe.md); unset: the model's topk_group")
    pad_expert_input_to_capacity: StrictBool = Field(
        default=False, description="every expert gets exactly its capacity (padded): needs "
                                   "model.capacity_factor (Megatron's "
                                   "--moe-expert-capacity-factor)")
