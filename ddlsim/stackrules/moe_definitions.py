"""The stack rules on a plan's Mixture-of-Experts layers that the DeepSpeed stacks read
(DeepSpeed-MoE, or no MoE code at all), registered on import as :mod:`.definitions`' are;
their sources beside the stacks in software.yaml."""

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
