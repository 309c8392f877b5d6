"""The stack rules on a plan's Mixture-of-Experts layers that the DeepSpeed stacks
(DeepSpeed-MoE, or no MoE code at all) and Megatron-Core 2024 read, registered on import as
:mod:`.definitions`' are; their sources beside the stacks in software.yaml."""

from __future__ import annotations

from .facts import PlanFacts, stack_rule


@stack_rule("no_moe", "Mixture-of-Experts layers (it has no MoE code)", "model.num_local_experts")
def _no_moe(f: PlanFacts):
    return f.moe


@stack_rule("zero3_no_moe", "ZeRO-3 with MoE layers", "parallel.zero_stage")
def _zero3_no_moe(f: PlanFacts):
    return f.moe & (f.zero == 3)


@stack_rule("expert_tp_is_tp_or_one", "an expert tensor-parallel size other than 1 or TP "
            "(experts split over the whole TP group or not at all)",
            "parallel.expert_tensor_parallel_size", "parallel.tensor_model_parallel_size")
def _expert_tp_is_tp_or_one(f: PlanFacts):
    return f.moe & (f.etp != 1) & (f.etp != f.tp)


@stack_rule("no_allgather_dispatcher", "the allgather token dispatcher (its MoE layers "
            "exchange tokens by all-to-all only)", "parallel.moe.token_dispatcher_type")
def _no_allgather_dispatcher(f: PlanFacts):
    return f.allgather_dispatch


@stack_rule("no_grouped_gemm", "the experts' GEMMs as one grouped GEMM (parallel.moe."
            "grouped_gemm)", "parallel.moe.grouped_gemm")
def _no_grouped_gemm(f: PlanFacts):
    return f.moe & f.grouped_gemm


@stack_rule("no_permute_fusion", "fused token permutation (parallel.moe.permute_fusion)",
            "parallel.moe.permute_fusion")
def _no_permute_fusion(f: PlanFacts):
    return f.moe & f.permute_fusion


# --------------------------------------------- Megatron-Core 2024's MoE (the audit of 900f1b76)
@stack_rule("grouped_gemm_needs_bf16", "the experts' grouped GEMM in fp16 or fp32 (bf16 "
            "only; FP8 training runs a bf16 model)", "parallel.moe.grouped_gemm", "train.dtype")
def _grouped_gemm_needs_bf16(f: PlanFacts):
    return f.moe & f.grouped_gemm & (f.fp16 | f.fp32)


@stack_rule("moe_ep_no_fp16", "expert parallelism in fp16",
            "parallel.expert_model_parallel_size", "train.dtype")
def _moe_ep_no_fp16(f: PlanFacts):
    return f.moe & (f.ep > 1) & f.fp16


@stack_rule("capacity_needs_alltoall", "a capacity factor (dropped or padded tokens) with "
            "another token dispatcher than alltoall", "model.capacity_factor",
            "parallel.moe.token_dispatcher_type")
def _capacity_needs_alltoall(f: PlanFacts):
    return f.moe & f.capacity & (f.allgather_dispatch | f.flex_dispatch)


@stack_rule("no_seq_aux_loss", "the per-sequence auxiliary loss (router_load_balancing_type "
            "seq_aux_loss)", "parallel.moe.router_load_balancing_type")
def _no_seq_aux_loss(f: PlanFacts):
    return f.moe & f.seq_aux_loss


@stack_rule("no_router_score_function", "a router score function other than softmax "
            "(sigmoid, sqrtsoftplus)", "parallel.moe.router_score_function")
def _no_router_score_function(f: PlanFacts):
    return f.moe & f.non_softmax_router


@stack_rule("no_expert_bias", "auxiliary-loss-free balancing by a per-expert bias "
            "(router_enable_expert_bias)", "parallel.moe.router_enable_expert_bias")
def _no_expert_bias(f: PlanFacts):
    return f.moe & f.expert_bias


@stack_rule("no_group_limited_routing", "group-limited routing (router_num_groups/"
            "router_group_topk, or the model's n_group/topk_group)",
            "parallel.moe.router_num_groups", "parallel.moe.router_group_topk")
def _no_group_limited_routing(f: PlanFacts):
    return f.moe & f.group_limited


@stack_rule("no_router_dtype", "a router dtype of its own (router_dtype: the router's GEMM "
            "runs in the layer's dtype)", "parallel.moe.router_dtype")
def _no_router_dtype(f: PlanFacts):
    return f.moe & f.router_dtype


@stack_rule("no_forced_balance", "forced load balancing (router_force_load_balancing: random "
            "router logits)", "parallel.moe.router_force_load_balancing")
def _no_forced_balance(f: PlanFacts):
    return f.moe & f.forced_balance


@stack_rule("no_shared_experts", "shared experts beside the routed ones",
            "model.n_shared_experts")
def _no_shared_experts(f: PlanFacts):
    return f.moe & f.shared_experts
